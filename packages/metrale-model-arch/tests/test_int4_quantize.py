"""Our own AWQ/GPTQ int4 writer (:mod:`metrale_model_arch.int4_quantize`): what it writes loads
back as the independent test quantizer's round-to-nearest levels, exactly, and serves as q4."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from metrale_testing.int4_checkpoints import round_to_nearest
from safetensors.torch import load_file

from metrale_config import Int4Method, ModelConfig, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_model_arch.families.q4_layers import Q4Linear
from metrale_model_arch.int4_gptq import gptq_int4
from metrale_model_arch.int4_quantize import (
    PROJECTION,
    pack_int4,
    quantize_int4,
    write_int4_checkpoint,
)
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.weight_format import Quantization

# Where each part's rows start in its fused projection.
FUSED_ROWS = {"q": ("qkv", 0), "k": ("qkv", 64), "v": ("qkv", 96), "gate": ("gate_up", 0)}
FUSED_ROWS["up"] = ("gate_up", 128)
CONFIG = ModelConfig(
    source="test",
    model_type="llama",
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def checkpoint_weights() -> dict[str, torch.Tensor]:
    """Random float16-valued weights under the checkpoint's (unfused) names."""
    generator = torch.Generator().manual_seed(0)
    q_size, kv_size = 64, 32
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in LlamaForCausalLM(CONFIG).state_dict().items():
        if name.endswith("cos_sin_cache"):
            continue
        value = (torch.randn(tensor.shape, generator=generator) * 0.3).half().float()
        if ".qkv_proj." in name:
            for part, rows in zip("qkv", value.split([q_size, kv_size, kv_size]), strict=True):
                weights[name.replace(".qkv_proj.", f".{part}_proj.")] = rows.clone()
        elif ".gate_up_proj." in name:
            for part, rows in zip(("gate", "up"), value.chunk(2), strict=True):
                weights[name.replace(".gate_up_proj.", f".{part}_proj.")] = rows.clone()
        else:
            weights[name] = value
    return weights


@pytest.mark.parametrize(
    ("method", "group_size", "is_symmetric"),
    [(Int4Method.AWQ, 32, False), (Int4Method.GPTQ, 64, False), (Int4Method.GPTQ, 32, True)],
)
def test_written_checkpoints_load_as_round_to_nearest_levels(
    tmp_path: Path, method: Int4Method, group_size: int, is_symmetric: bool
) -> None:
    weights = checkpoint_weights()
    write_int4_checkpoint(
        tmp_path,
        CONFIG,
        weights.items(),
        method=method,
        group_size=group_size,
        is_symmetric=is_symmetric,
    )
    config = model_config_from_hf_file(tmp_path)
    assert config.int4_quantization is not None
    assert config.int4_quantization.group_size == group_size
    options = LoadOptions(quantization=Quantization.NONE)
    state = load_safetensors_model(tmp_path, config, options).state_dict()
    for name, weight in weights.items():
        if not PROJECTION.fullmatch(name):
            assert torch.equal(state[name], weight), name
            continue
        cols = weight.shape[1]
        q, z, s = round_to_nearest(
            weight,
            torch.arange(cols) // group_size,
            cols // group_size,
            sym=is_symmetric,
            min_zero=0 if method == Int4Method.AWQ else 1,
        )
        group_of = torch.arange(cols) // group_size
        levels = (q.float() - z[:, group_of].float()) * s[:, group_of].float()
        part = re.search(r"\.(\w+)_proj\.", name)
        assert part is not None
        fused, start = FUSED_ROWS.get(part[1], (part[1], 0))
        held = state[name.replace(f".{part[1]}_proj.", f".{fused}_proj.")]
        assert torch.equal(held[start : start + weight.shape[0]], levels), name
    model = load_safetensors_model(tmp_path, config, LoadOptions(quantization=Quantization.Q4))
    assert isinstance(model.model.layers[0].mlp.down_proj, Q4Linear)


@pytest.mark.parametrize("flag", ["is_symmetric", "desc_act"])
def test_awq_is_never_symmetric_nor_desc_act(tmp_path: Path, flag: str) -> None:
    with pytest.raises(ValueError, match="AWQ has zero points and groups in order"):
        write_int4_checkpoint(
            tmp_path, CONFIG, [], method=Int4Method.AWQ, group_size=32, **{flag: True}
        )


# sha256 of round to nearest's tensors for pinned_weight(), as written before GPTQ's rounding
# existed (the same bytes: a writer given no Hessian is round to nearest, unchanged).
ROUND_TO_NEAREST_SHA256 = {
    (Int4Method.AWQ, False): "7878eb84a7033677eeef850790ae72bd9ac9d5224d78c3e9b2f35c9a1b48c096",
    (Int4Method.GPTQ, True): "d54fdbcca7c3ac2721b87f8bada2383beaae21c55eefcaf520b9922f9a513f83",
    (Int4Method.GPTQ, False): "9f990a22c8b37b668aa648a940e71f31cfb3f4fe704642d2398ea4830b77d8ca",
}


def tensors_sha256(parts: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(parts):
        digest.update(name.encode())
        digest.update(parts[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize(("method", "is_symmetric"), list(ROUND_TO_NEAREST_SHA256))
def test_round_to_nearest_writes_the_bytes_it_wrote_before_gptq(
    method: Int4Method, is_symmetric: bool
) -> None:
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    parts = quantize_int4(weight, 32, method=method, is_symmetric=is_symmetric)
    assert tensors_sha256(parts) == ROUND_TO_NEAREST_SHA256[method, is_symmetric]


def test_a_projection_given_its_levels_is_written_as_them_the_rest_as_without(
    tmp_path: Path,
) -> None:
    weights = checkpoint_weights()
    gptq_name = "model.layers.0.self_attn.q_proj.weight"
    inputs = torch.randn(512, 8, generator=torch.Generator().manual_seed(3)) @ torch.randn(
        8, 64, generator=torch.Generator().manual_seed(4)
    )
    hessian = 2 * inputs.double().t() @ inputs.double() / 512
    levels = gptq_int4(weights[gptq_name], hessian, 32, method=Int4Method.GPTQ, is_symmetric=True)
    for out, given in (("nearest", None), ("gptq", {gptq_name: levels})):
        write_int4_checkpoint(
            tmp_path / out, CONFIG, weights.items(), method=Int4Method.GPTQ, group_size=32,
            is_symmetric=True, rounded=given,
        )  # fmt: skip
    nearest = load_file(str(tmp_path / "nearest" / "model.safetensors"))
    gptq = load_file(str(tmp_path / "gptq" / "model.safetensors"))
    assert nearest.keys() == gptq.keys()
    prefix = gptq_name.removesuffix("weight")
    assert not torch.equal(gptq[f"{prefix}qweight"], nearest[f"{prefix}qweight"])
    packed = pack_int4(levels, method=Int4Method.GPTQ)
    assert all(torch.equal(gptq[f"{prefix}{part}"], tensor) for part, tensor in packed.items())
    others = [name for name in nearest if not name.startswith(prefix)]
    assert all(torch.equal(gptq[name], nearest[name]) for name in others)


def test_groups_out_of_order_are_written_with_desc_act_only(tmp_path: Path) -> None:
    weights = checkpoint_weights()
    name = "model.layers.1.mlp.down_proj.weight"
    hessian = torch.diag(torch.arange(128, dtype=torch.float64) + 1)  # the last column loudest
    levels = gptq_int4(
        weights[name], hessian, 32, method=Int4Method.GPTQ, is_symmetric=True, is_act_order=True
    )
    assert int(levels.group_index[-1]) == 0
    with pytest.raises(ValueError, match=r"down_proj\.weight: groups out of column order need"):
        write_int4_checkpoint(
            tmp_path / "refused", CONFIG, weights.items(), method=Int4Method.GPTQ,
            group_size=32, is_symmetric=True, rounded={name: levels},
        )  # fmt: skip
    write_int4_checkpoint(
        tmp_path / "desc_act", CONFIG, weights.items(), method=Int4Method.GPTQ, group_size=32,
        is_symmetric=True, rounded={name: levels}, desc_act=True,
    )  # fmt: skip
    config = model_config_from_hf_file(tmp_path / "desc_act")
    assert config.int4_quantization is not None
    assert config.int4_quantization.desc_act
    g_idx = load_file(str(tmp_path / "desc_act" / "model.safetensors"))[
        name.replace(".weight", ".g_idx")
    ]
    assert torch.equal(g_idx, levels.group_index.to(torch.int32))
