"""GGUF of the dense variants (gemma2, gemma3_text, phi3, olmo2, granite, smollm3) and
glm4_moe: a tiny transformers checkpoint converted the way llama.cpp's converter does
(:mod:`metrale_testing.llama_cpp_gguf`) loads to the safetensors load's config, weights and
logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import pytest
import torch
from metrale_testing import save_tiny_glm4_moe
from metrale_testing.gguf_parity import model_fields, prefill_logits
from metrale_testing.llama_cpp_gguf import convert_to_gguf

from metrale_config import model_config_from_gguf, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.loading.gguf_loader import load_gguf_model
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.registry import family_for

transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
ORIGINAL_MAX_POSITIONS = 64
SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
# Each case keeps to what a GGUF can say: gemma's query_pre_attn_scalar is head_dim (the
# converter drops it; llama.cpp uses head_dim), gemma3 slides 5 layers in 6 and smollm3 skips
# RoPE every 4th layer (llama.cpp's fixed patterns).
# name -> (transformers config class, model class, config kwargs)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "sliding_window": 6,
            "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 4.0,
            "final_logit_softcapping": 1.5,
        },
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "num_hidden_layers": 6,
            "head_dim": 16,
            "sliding_window": 6,
            "query_pre_attn_scalar": 16,
            "sliding_window_pattern": 6,
            "final_logit_softcapping": 2.0,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
            },
        },
    ),
    "phi3-longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "num_hidden_layers": 2,
            "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": ORIGINAL_MAX_POSITIONS,
            "rope_parameters": {
                "rope_type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.2],
                "long_factor": [1.5, 2.5, 4.0, 7.0],
            },
        },
    ),
    "phi3-sliding": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {"num_hidden_layers": 2, "sliding_window": 7},
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"num_hidden_layers": 2, "attention_bias": True}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {
            "num_hidden_layers": 2,
            "embedding_multiplier": 3.0,
            "attention_multiplier": 0.2,
            "residual_multiplier": 0.5,
            "logits_scaling": 2.5,
            "attention_bias": True,
            "mlp_bias": True,
        },
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"num_hidden_layers": 4}),
    # Grouped routing, shared experts, q/k norms and biases, one MTP layer (``blk.2.nextn.*``).
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        {
            "num_hidden_layers": 2,
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
            "n_routed_experts": 8,
            "num_experts_per_tok": 3,
            "n_group": 4,
            "topk_group": 2,
            "n_shared_experts": 2,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "use_qk_norm": True,
            "attention_bias": True,
            "partial_rotary_factor": 0.5,
            "num_nextn_predict_layers": 1,
        },
    ),
}


@attrs.frozen(kw_only=True)
class Converted:
    name: str
    checkpoint_dir: Path
    f32: Path
    q8_0: Path
    max_seq_len: int | None

    def load_safetensors(self) -> CausalLM:
        config = model_config_from_hf_file(self.checkpoint_dir)
        return load_safetensors_model(self.checkpoint_dir, config, self.options)

    def load_gguf(self, path: Path) -> CausalLM:
        return load_gguf_model(path, self.options)

    def path(self, qtype: Q) -> Path:
        return self.f32 if qtype == Q.F32 else self.q8_0

    @property
    def options(self) -> LoadOptions:
        return LoadOptions(dtype=torch.float32, device="cpu", max_seq_len=self.max_seq_len)

    @property
    def is_gemma(self) -> bool:
        return self.name.startswith("gemma")


def randomize(model: Any, is_gemma: bool) -> None:
    """Every parameter random; norms near their identity (gemma's ``1 + w`` around 0)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.02 if is_gemma and "embed" in name else 0.3
            noise = scale * torch.randn(param.shape, generator=generator)
            param.copy_(noise + (1.0 if "norm" in name and not is_gemma else 0.0))


@pytest.fixture(scope="module", params=list(CASES))
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Converted:
    name = request.param
    config_class, model_class, kwargs = CASES[name]
    path = tmp_path_factory.mktemp(name)
    checkpoint_dir = path / "hf"
    if name == "glm4_moe":
        # Its MTP layer, saved as GLM-4.5 saves it.
        save_tiny_glm4_moe(checkpoint_dir, **SMALL, **kwargs)
    else:
        hf_model = getattr(transformers, model_class)(
            getattr(transformers, config_class)(**SMALL, **kwargs)
        )
        randomize(hf_model, is_gemma=name.startswith("gemma"))
        hf_model.save_pretrained(checkpoint_dir, safe_serialization=True)
    return Converted(
        name=name,
        checkpoint_dir=checkpoint_dir,
        f32=convert_to_gguf(checkpoint_dir, path / "model-f32.gguf", Q.F32),
        q8_0=convert_to_gguf(checkpoint_dir, path / "model-q8_0.gguf", Q.Q8_0),
        max_seq_len=ORIGINAL_MAX_POSITIONS if "longrope" in name else None,
    )


def test_header_config_equals_config_json(converted: Converted) -> None:
    from_json = model_config_from_hf_file(converted.checkpoint_dir)
    from_gguf = model_config_from_gguf(converted.f32)
    assert from_gguf.model_type == from_json.model_type
    assert model_fields(from_gguf) == model_fields(from_json)
    assert from_gguf.gguf_projection_types == ("F32",)
    assert model_config_from_gguf(converted.q8_0).gguf_projection_types == ("Q8_0",)


def q8_0_round_trip(matrix: torch.Tensor) -> torch.Tensor:
    """What a Q8_0 file holds of ``matrix``. Q8_0 blocks run along rows, so the converter's
    row permutation and the loader's fusing of projections change nothing here."""
    blocks = gguf.quants.quantize(matrix.numpy(), Q.Q8_0)
    return torch.from_numpy(gguf.quants.dequantize(blocks, Q.Q8_0))


def expected_weights(converted: Converted, qtype: Q) -> CausalLM:
    """The safetensors load, its matrices as a ``qtype`` file holds them."""
    model = converted.load_safetensors()
    if qtype == Q.Q8_0:
        with torch.no_grad():
            for name, param in model.named_parameters():
                # The converter keeps routers (``mlp.gate``) in float32.
                if param.ndim >= 2 and not name.endswith("mlp.gate.weight"):
                    param.copy_(q8_0_round_trip(param))
    return model


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_weights_equal_the_safetensors_load(converted: Converted, qtype: Q) -> None:
    expected = expected_weights(converted, qtype).state_dict()
    loaded = converted.load_gguf(converted.path(qtype)).state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        want = expected[name]
        if converted.is_gemma and name.endswith("norm.weight"):
            # The converter's float32 ``w + 1`` rounds; ``- 1`` back is exact.
            half_ulp = torch.from_numpy(np.spacing(want.abs().numpy() + np.float32(1)) / 2)
            assert bool(((tensor - want).abs() <= half_ulp).all()), name
        else:
            assert torch.equal(tensor, want), name


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_prefill_logits_match_the_safetensors_load(
    converted: Converted, qtype: Q, paged_runner: Any
) -> None:
    gguf_model = converted.load_gguf(converted.path(qtype))
    assert isinstance(gguf_model, family_for(gguf_model.config))
    ours = prefill_logits(gguf_model, paged_runner)
    expected = prefill_logits(expected_weights(converted, qtype), paged_runner)
    for seq_id, logits in expected.items():
        torch.testing.assert_close(ours[seq_id], logits, atol=1e-5, rtol=0)
