"""DeepSeek's GGUF metadata (``deepseek2``): MLA sizes from the current and the older key sets,
V2 / V3 told apart by the gating, YaRN's mscale from the log multiplier, and the files that do
not say what the model needs refused by name (the round trip from a real checkpoint is
metrale-model-arch's ``test_gguf_deepseek``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import ConfigError, MlaConfig, model_config_from_gguf

TinyGguf = Callable[..., Path]
ARCH = "deepseek2"
MOE_KEYS = {
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 16,
    "leading_dense_block_count": 1,
    "rope__dimension_count": 4,
    "attention__kv_lora_rank": 16,
}
# Since llama.cpp's MLA change: one latent kv head, the heads' sizes in the _mla keys.
CURRENT_KEYS = {
    **MOE_KEYS,
    "attention__head_count_kv": 1,
    "attention__key_length": 20,
    "attention__value_length": 16,
    "attention__key_length_mla": 12,
    "attention__value_length_mla": 8,
}
LEGACY_KEYS = {
    **MOE_KEYS,
    "attention__head_count_kv": 4,
    "attention__key_length": 12,
    "attention__value_length": 8,
}
FULL_RANK_QUERY = {"blk.0.attn_q.weight": (48, 32)}
LOW_RANK_QUERY = {"blk.0.attn_q_a.weight": (24, 32)}
EXPECTED_MLA = MlaConfig(
    q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8
)


@pytest.mark.parametrize("keys", [CURRENT_KEYS, LEGACY_KEYS], ids=["current", "legacy"])
def test_mla_sizes_from_either_key_set(tiny_gguf: TinyGguf, keys: dict[str, int]) -> None:
    config = model_config_from_gguf(tiny_gguf(ARCH, tensors=FULL_RANK_QUERY, **keys))
    assert config.model_type == "deepseek_v2"
    assert config.mla == EXPECTED_MLA
    assert (config.head_dim, config.num_key_value_heads) == (12, 4)
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("dense", "sparse")


def test_sigmoid_gating_with_its_correction_bias_is_v3(tiny_gguf: TinyGguf) -> None:
    tensors = {**LOW_RANK_QUERY, "blk.1.exp_probs_b.bias": (4,)}
    path = tiny_gguf(
        ARCH, tensors=tensors, expert_gating_func=2, attention__q_lora_rank=24, **CURRENT_KEYS
    )
    config = model_config_from_gguf(path)
    assert config.model_type == "deepseek_v3"
    assert config.mla is not None
    assert config.mla.q_lora_rank == 24


def test_sigmoid_gating_without_the_correction_bias_is_refused(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(ARCH, tensors=FULL_RANK_QUERY, expert_gating_func=2, **CURRENT_KEYS)
    with pytest.raises(ConfigError, match=re.escape("'deepseek2.expert_gating_func' is 2")):
        model_config_from_gguf(path)


def test_a_correction_bias_without_sigmoid_gating_is_refused(tiny_gguf: TinyGguf) -> None:
    tensors = {**FULL_RANK_QUERY, "blk.1.exp_probs_b.bias": (4,)}
    path = tiny_gguf(ARCH, tensors=tensors, **CURRENT_KEYS)
    with pytest.raises(ConfigError, match=re.escape("'deepseek2.expert_gating_func' is 1")):
        model_config_from_gguf(path)


def test_a_low_rank_query_without_its_rank_is_refused(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(ARCH, tensors=LOW_RANK_QUERY, **CURRENT_KEYS)
    with pytest.raises(
        ConfigError, match=re.escape("'deepseek2.attention.q_lora_rank' is missing")
    ):
        model_config_from_gguf(path)


def test_yarn_mscale_from_the_log_multiplier(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(
        ARCH,
        tensors=FULL_RANK_QUERY,
        rope__scaling__type="yarn",
        rope__scaling__factor=40.0,
        rope__scaling__original_context_length=4096,
        rope__scaling__yarn_log_multiplier=0.0707,
        **CURRENT_KEYS,
    )
    scaling = model_config_from_gguf(path).rope_scaling
    assert scaling is not None
    assert (scaling.rope_type, scaling.factor) == ("yarn", 40.0)
    assert (scaling.mscale, scaling.mscale_all_dim) == (0.707, 0.707)


def test_a_yarn_extrapolation_factor_is_refused(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(
        ARCH,
        tensors=FULL_RANK_QUERY,
        rope__scaling__type="yarn",
        rope__scaling__factor=4.0,
        rope__scaling__yarn_ext_factor=0.5,
        **CURRENT_KEYS,
    )
    with pytest.raises(ConfigError, match=re.escape("yarn_ext_factor' must be 1.0")):
        model_config_from_gguf(path)
