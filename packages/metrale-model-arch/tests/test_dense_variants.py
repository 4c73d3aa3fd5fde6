"""Parity of the dense variants (olmo2, granite, smollm3, phi3, gemma2, gemma3_text) with
transformers: tiny random models, every parameter randomized, float32."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from metrale_testing.family_parity import Bfloat16ParityChecks, FamilyCheckpoint, load_checkpoint

from metrale_config import ModelConfig, NormLayout
from metrale_model_arch.counts.dense_variants import dense_variant_param_counts
from metrale_model_arch.families.dense_variants import DenseVariantForCausalLM
from metrale_model_arch.registry import family_for
from metrale_model_arch.rope_layout import num_rope_tables

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
PROMPT_LENS = (1, 5, 11, 17, 26)
# phi3's LongRoPE served within its original context (its short factors) holds every prompt and its
# greedy tokens; test_longrope.py serves it past that context.
ORIGINAL_MAX_POSITIONS = 64
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}

# name -> (transformers config class, model class, config kwargs)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "olmo2-post-norms-bias": (
        "Olmo2Config",
        "Olmo2ForCausalLM",
        {"num_hidden_layers": 2, "attention_bias": True},
    ),
    "granite-multipliers-bias": (
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
    "smollm3-nope-tied": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        {"num_hidden_layers": 4, "no_rope_layer_interval": 2},
    ),
    "phi3-longrope-partial-rotary": (
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
    "gemma2-softcap-sliding": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "sliding_window": 6,
            "query_pre_attn_scalar": 20,
            "attn_logit_softcapping": 4.0,
            "final_logit_softcapping": 1.5,
        },
    ),
    "gemma3_text-local-rope-sliding": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "sliding_window": 6,
            "query_pre_attn_scalar": 20,
            "sliding_window_pattern": 2,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
            },
        },
    ),
}


def randomize(model: Any, is_gemma: bool) -> None:
    """Every parameter random: norms near their identity (gemma's ``1 + w`` around 0). Gemma's
    embeddings (times sqrt(hidden), tied to the head) get less noise, so the layers, not the
    input token, choose the next token."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.02 if is_gemma and "embed" in name else 0.3
            noise = scale * torch.randn(param.shape, generator=generator)
            param.copy_(noise + (1.0 if "norm" in name and not is_gemma else 0.0))


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> FamilyCheckpoint:
    config_class, model_class, kwargs = CASES[request.param]
    hf_config = getattr(transformers, config_class)(**SMALL, **kwargs)
    hf_model = getattr(transformers, model_class)(hf_config).eval()
    randomize(hf_model, is_gemma=request.param.startswith("gemma"))
    path = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(path, safe_serialization=True)
    max_seq_len = ORIGINAL_MAX_POSITIONS if "longrope" in request.param else None
    return FamilyCheckpoint.saved(request.param, path, hf_model, PROMPT_LENS, max_seq_len)


class TestParity(Bfloat16ParityChecks):
    family = DenseVariantForCausalLM


def test_config_exercises_the_case(checkpoint: FamilyCheckpoint) -> None:
    config, name = checkpoint.config, checkpoint.name
    assert family_for(config) is DenseVariantForCausalLM
    assert config.num_key_value_heads < config.num_attention_heads
    assert (config.norm_layout == NormLayout.POST) == name.startswith("olmo2")
    assert (config.norm_layout == NormLayout.SANDWICH) == name.startswith("gemma")
    assert config.qk_norm == name.startswith(("olmo2", "gemma3"))
    assert (config.sliding_window is not None) == ("sliding" in name)
    assert (config.attn_logit_softcapping is not None) == ("softcap" in name)
    assert (config.final_logit_softcapping is not None) == ("softcap" in name)
    assert bool(config.nope_layers) == ("nope" in name)
    assert config.tie_word_embeddings == name.startswith(("smollm3", "gemma"))
    assert num_rope_tables(config) == (2 if "local-rope" in name else 1)
    rope_type = config.rope_scaling.rope_type if config.rope_scaling else "default"
    assert (rope_type == "longrope") == ("longrope" in name)
    if "sliding" in name:
        assert config.sliding_window is not None
        assert config.sliding_window < max(PROMPT_LENS)
        assert len(set(config.layer_types)) == (1 if name.startswith("phi3") else 2)


def test_parameter_counts_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    counts = dense_variant_param_counts(checkpoint.config)
    ours = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert ours == sum(p.numel() for p in checkpoint.hf_model.parameters())
    assert ours == sum(
        p.numel() for p in load_checkpoint(checkpoint, DenseVariantForCausalLM).parameters()
    )


def test_the_llama_family_refuses_the_variants_switches(tiny_config: ModelConfig) -> None:
    from metrale_model_arch.families import LlamaForCausalLM

    for change in (
        {"norm_layout": NormLayout.SANDWICH},
        {"nope_layers": (1,)},
        {"attn_logit_softcapping": 50.0},
        {"embedding_multiplier": 2.0},
    ):
        with pytest.raises(ValueError, match="the llama family does not support"):
            LlamaForCausalLM(attrs.evolve(tiny_config, **change))
