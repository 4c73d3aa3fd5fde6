"""DeepSeek-V3's MTP layer on a tiny random checkpoint carrying one (every parameter randomized,
float32, YaRN): its weights loaded, counted and owned by ``weights.mtp``, its latent cache
priced for the draft pool, and its forward against the formula written in plain torch; a
checkpoint without its declared MTP layer is refused, and V2 has none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import save_tiny_deepseek_v3
from safetensors.torch import load_file

from metrale_config import model_config_from_hf_dict, model_config_from_hf_file
from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadOptions, allocate_kv_cache
from metrale_model_arch.build import CheckpointError
from metrale_model_arch.cache_spec import MlaLatentSpec
from metrale_model_arch.counts.deepseek import deepseek_param_counts
from metrale_model_arch.families.deepseek import DeepseekForCausalLM
from metrale_model_arch.families.deepseek.mtp import DeepseekMtpLayer
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.kv_cache import allocate_layer_cache
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory import mtp_cache_spec, mtp_kv_bytes_per_token
from metrale_model_arch.memory.weights import MTP, weight_bytes, weight_owner
from metrale_model_arch.owners import DRAFT_KV_POOL

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
BLOCK_SIZE = 4
PROMPT_LEN = 13
NUM_LAYERS = 2
TINY_V3: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "n_group": 4,
    "topk_group": 2,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 256,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,
    },
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
MTP_PREFIX = f"model.layers.{NUM_LAYERS}."
COPIES = ("embed_tokens.weight", "shared_head.head.weight")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("tiny-deepseek-v3-mtp")
    return path, save_tiny_deepseek_v3(path, **TINY_V3)


@pytest.fixture(scope="module")
def tensors(saved: tuple[Path, Any]) -> dict[str, torch.Tensor]:
    return load_file(saved[0] / "model.safetensors")


def load(path: Path, dtype: torch.dtype = torch.float32) -> DeepseekForCausalLM:
    config = model_config_from_hf_file(path)
    model = load_safetensors_model(path, config, LoadOptions(device="cpu", dtype=dtype))
    assert isinstance(model, DeepseekForCausalLM)
    return model


def test_the_mtp_layer_is_loaded_counted_and_owned(
    saved: tuple[Path, Any], tensors: dict[str, torch.Tensor]
) -> None:
    path, _ = saved
    config = model_config_from_hf_file(path)
    assert config.mtp is not None
    assert config.mtp.mlp_layer_types == ("sparse",)
    mtp_saved = {n: t for n, t in tensors.items() if n.startswith(MTP_PREFIX)}
    counts = deepseek_param_counts(config)
    assert counts.mtp + counts.mtp_fp32 == sum(
        t.numel() for n, t in mtp_saved.items() if not n.endswith(COPIES)
    )
    model = load(path, torch.bfloat16)
    (layer,) = model.model.mtp_layers
    assert isinstance(layer, DeepseekMtpLayer)
    assert isinstance(layer.mlp, GlmMoeBlock)
    for name in ("eh_proj.weight", "enorm.weight", "shared_head.norm.weight"):
        ours = layer.get_parameter(name)
        assert torch.equal(ours, mtp_saved[MTP_PREFIX + name].bfloat16()), name
    q_b = mtp_saved[MTP_PREFIX + "self_attn.q_b_proj.weight"].bfloat16()
    assert torch.equal(layer.self_attn.q_b_proj.weight, q_b)
    # The router and its correction bias stay float32, exactly as saved.
    assert torch.equal(layer.mlp.gate.weight, mtp_saved[MTP_PREFIX + "mlp.gate.weight"])
    bias = mtp_saved[MTP_PREFIX + "mlp.gate.e_score_correction_bias"]
    assert torch.equal(layer.mlp.gate.e_score_correction_bias, bias)
    owned = [(n, p) for n, p in model.named_parameters() if weight_owner(n) == MTP]
    assert {n for n, _ in owned} == {
        n for n, _ in model.named_parameters() if n.startswith("model.mtp_layers.0.")
    }
    owned_bytes = sum(p.numel() * p.element_size() for _, p in owned)
    assert weight_bytes(config, 2).by_owner()[MTP] == owned_bytes
    assert owned_bytes == 2 * counts.mtp + 4 * counts.mtp_fp32
    # Its draft cache: one latent row of 32 + 8 values a token, as a target layer's.
    assert mtp_cache_spec(config) == MlaLatentSpec(kv_lora_rank=32, qk_rope_head_dim=8)
    assert mtp_kv_bytes_per_token(config, 2) == 80


def test_a_checkpoint_without_its_declared_mtp_layer_is_refused(tmp_path: Path) -> None:
    hf_config = transformers.DeepseekV3Config(**TINY_V3)
    transformers.DeepseekV3ForCausalLM(hf_config).save_pretrained(tmp_path)
    config = model_config_from_hf_file(tmp_path)
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers 1 but the checkpoint"):
        load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))


def test_deepseek_v2_has_no_mtp_layers() -> None:
    hf_config = transformers.DeepseekV2Config(**{**TINY_V3, "rope_parameters": None})
    data = {**hf_config.to_dict(), "num_nextn_predict_layers": 1}
    assert model_config_from_hf_dict(data, source="config.json").mtp is None


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def hf_block(hf_model: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """transformers' sparse decoder layer holding the MTP block's weights (experts fused)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    config = hf_model.config
    own = {n[len(MTP_PREFIX) :]: t for n, t in tensors.items() if n.startswith(MTP_PREFIX)}
    experts = range(config.n_routed_experts)
    state = {name: t for name, t in own.items() if not name.startswith("mlp.experts.")}
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat([own[f"mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up")])
            for e in experts
        ]
    )
    state["mlp.experts.down_proj"] = torch.stack(
        [own[f"mlp.experts.{e}.down_proj.weight"] for e in experts]
    )
    block = DeepseekV3DecoderLayer(config, config.num_hidden_layers - 1).eval()
    missing, _ = block.load_state_dict(state, strict=False)
    assert not missing
    return block


def reference_mtp(
    hf_model: Any, tensors: dict[str, torch.Tensor], ids: list[int], previous: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h', logits)`` of the MTP layer over ``ids`` after ``previous`` from position 0:
    h' = Block(eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])), logits =
    lm_head(shared_head.norm(h'))."""
    eps = hf_model.config.rms_norm_eps
    embeds = tensors["model.embed_tokens.weight"][ids]
    joined = torch.cat(
        [
            rms(embeds, tensors[MTP_PREFIX + "enorm.weight"], eps),
            rms(previous, tensors[MTP_PREFIX + "hnorm.weight"], eps),
        ],
        dim=-1,
    )
    x = (joined @ tensors[MTP_PREFIX + "eh_proj.weight"].T)[None]
    n = len(ids)
    positions = torch.arange(n)[None]
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    out = hf_block(hf_model, tensors)(
        x,
        attention_mask=causal,
        position_ids=positions,
        position_embeddings=hf_model.model.rotary_emb(x, positions),
    )
    hidden = (out[0] if isinstance(out, tuple) else out)[0]
    normed = rms(hidden, tensors[MTP_PREFIX + "shared_head.norm.weight"], eps)
    return hidden, normed @ tensors["lm_head.weight"].T


def metadata(table: list[int], seq_len: int, query_len: int) -> Any:
    return build_attention_metadata(
        block_tables=[table], seq_lens=[seq_len], query_lens=[query_len], block_size=BLOCK_SIZE
    )


@torch.inference_mode()
def test_mtp_forward_matches_the_formula(
    saved: tuple[Path, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """The MTP layer against the formula over the saved tensors (the block: transformers'
    decoder layer holding its weights; ``h_i``: transformers' final hidden states), through
    two chunks and one draft step on its own paged latent cache in scattered blocks."""
    path, hf_model = saved
    model = load(path)
    config = model.config
    prompt = torch.randint(VOCAB_SIZE, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    target = hf_model.model(prompt[None]).last_hidden_state[0]
    kv = allocate_kv_cache(
        config, num_blocks=8, block_size=BLOCK_SIZE, dtype=torch.float32, device="cpu"
    )
    positions = torch.arange(PROMPT_LEN)
    hidden = model(prompt, positions, kv, metadata([0, 1, 2, 3], PROMPT_LEN, PROMPT_LEN))
    torch.testing.assert_close(hidden, target, atol=1e-4, rtol=0)
    cache = allocate_layer_cache(
        mtp_cache_spec(config),
        num_blocks=8,
        block_size=BLOCK_SIZE,
        dtype=torch.float32,
        device="cpu",
        owner=DRAFT_KV_POOL,
    )
    assert cache.num_bytes == 8 * BLOCK_SIZE * mtp_kv_bytes_per_token(config, 4) == 8 * 4 * 160
    table, split = [6, 1, 7, 3], 5
    first = model.forward_mtp(
        prompt[1 : split + 1], hidden[:split], positions[:split], cache[0], metadata(table, 5, 5)
    )
    rest = model.forward_mtp(
        prompt[split + 1 :],
        hidden[split:-1],
        positions[split:-1],
        cache[0],
        metadata(table, PROMPT_LEN - 1, PROMPT_LEN - 1 - split),
    )
    ours = torch.cat([first, rest])
    ids = prompt[1:].tolist()
    expected, expected_logits = reference_mtp(hf_model, tensors, ids, target[:-1])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    logits = model.compute_mtp_logits(ours)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=0)
    # A draft: the layer again, one position on, over its own output and its argmax.
    draft = int(logits[-1].argmax())
    again = model.forward_mtp(
        torch.tensor([draft]), ours[-1:], positions[-1:], cache[0], metadata(table, PROMPT_LEN, 1)
    )
    chained, chained_logits = reference_mtp(
        hf_model, tensors, [*ids, draft], torch.cat([target[:-1], expected[-1:]])
    )
    torch.testing.assert_close(again[0], chained[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        model.compute_mtp_logits(again)[0], chained_logits[-1], atol=1e-4, rtol=0
    )
