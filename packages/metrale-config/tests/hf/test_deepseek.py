"""``deepseek_v2`` / ``deepseek_v3`` configs: MLA fields, YaRN's mscale fields, the routing."""

from __future__ import annotations

from typing import Any

import pytest

from metrale_config import ConfigError, RopeScaling, model_config_from_hf_dict

# deepseek-ai/DeepSeek-V2-Lite's config.json, the fields the architecture reads.
V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 102400,
}


# V2-Lite's shape as deepseek_v3 (sigmoid routing, no V2 method).
AS_V3: dict[str, Any] = {"model_type": "deepseek_v3", "topk_method": ..., "scoring_func": ...}


def parse(**changes: Any) -> Any:
    data = {key: value for key, value in {**V2_LITE, **changes}.items() if value is not ...}
    return model_config_from_hf_dict(data, source="config.json")


def test_the_published_v2_lite_config() -> None:
    config = parse()
    assert config.model_type == "deepseek_v2"
    assert config.mla is not None
    assert config.mla.q_lora_rank is None
    assert (config.mla.kv_lora_rank, config.mla.qk_rope_head_dim) == (512, 64)
    assert config.mla.rope_interleave
    assert config.head_dim == 192
    assert config.num_key_value_heads == 16
    assert config.rope_scaling == RopeScaling(
        rope_type="yarn",
        factor=40.0,
        original_max_position_embeddings=4096,
        beta_fast=32.0,
        beta_slow=1.0,
        mscale=0.707,
        mscale_all_dim=0.707,
    )
    moe = config.moe
    assert moe is not None
    assert (moe.num_experts, moe.num_experts_per_tok, moe.num_shared_experts) == (64, 6, 2)
    assert (moe.n_group, moe.topk_group, moe.norm_topk_prob) == (1, 1, False)
    assert moe.mlp_layer_types == ("dense",) + ("sparse",) * 26
    assert config.mtp is None


def test_greedy_is_one_group_whatever_the_file_says() -> None:
    moe = parse(n_group=8, topk_group=3).moe
    assert (moe.n_group, moe.topk_group) == (1, 1)
    moe = parse(n_group=8, topk_group=3, topk_method="group_limited_greedy").moe
    assert (moe.n_group, moe.topk_group) == (8, 3)


def test_moe_layer_freq_skips_layers() -> None:
    moe = parse(num_hidden_layers=5, moe_layer_freq=2).moe
    assert moe.mlp_layer_types == ("dense", "dense", "sparse", "dense", "sparse")


def test_a_mismatched_kv_head_count_is_the_head_count() -> None:
    config = parse(**AS_V3, num_key_value_heads=128)
    assert config.num_key_value_heads == 16
    assert config.mla is not None
    assert config.mla.rope_interleave


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"topk_method": "noaux_tc"}, "'topk_method' must be one of greedy"),
        ({"scoring_func": "sigmoid"}, "'scoring_func' must be 'softmax'"),
        ({**AS_V3, "topk_method": "greedy"}, "must be 'noaux_tc'"),
        ({**AS_V3, "scoring_func": "softmax"}, "must be 'sigmoid'"),
        ({"qk_rope_head_dim": 63}, "'qk_rope_head_dim' must be even"),
        (
            {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 5},
            "'topk_group' must be in 1..n_group",
        ),
    ],
)
def test_what_no_deepseek_model_runs_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(**changes)


def test_v3_reads_rope_interleave() -> None:
    config = parse(**AS_V3, rope_interleave=False)
    assert config.mla is not None
    assert not config.mla.rope_interleave
