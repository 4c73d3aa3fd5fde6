"""Parity of ``deepseek_v2`` and ``deepseek_v3`` with transformers on tiny random checkpoints
(every parameter and the routing correction bias randomized, float32): MLA over the paged
latent cache, interleaved or half-split RoPE, YaRN with DeepSeek's mscale, V2's greedy and
group-limited softmax routing, V3's sigmoid routing; and the published DeepSeek-V3 plan. The V3
cases serve without MTP layers (``num_nextn_predict_layers`` 0, as a transformers save has
none); V3's MTP layer: ``test_deepseek_mtp.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import randomize_weights
from metrale_testing.family_parity import (
    Bfloat16ParityChecks,
    FamilyCheckpoint,
    assert_counts_equal_transformers,
    load_checkpoint,
)
from safetensors.torch import load_file, save_file

from metrale_config import model_config_from_hf_dict, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.cache_spec import MlaLatentSpec
from metrale_model_arch.counts.deepseek import deepseek_param_counts
from metrale_model_arch.families.deepseek import DeepseekForCausalLM
from metrale_model_arch.families.deepseek.attention import mla_softmax_scale
from metrale_model_arch.families.deepseek.moe import DeepseekV2MoeBlock
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.families.rotary import yarn_attention_factor, yarn_inv_freq
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.registry import cache_specs, family_for

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
PROMPT_LENS = (1, 7, 13, 26)
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def yarn(mscale: float, mscale_all_dim: float) -> dict[str, Any]:
    return {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
    }


# name -> (model type, config kwargs)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # V2-Lite's shape: q_proj (no q_lora_rank), greedy routing (its n_group ignored), two
    # shared experts, the first layer dense.
    "v2-lite-greedy": (
        "deepseek_v2",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": None,
            "topk_method": "greedy",
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 2,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
        },
    ),
    # V2's shape: the low-rank query, group-limited routing, scaled weights, attention
    # biases, YaRN with V2's mscale = mscale_all_dim (the softmax scale grows, cos/sin not).
    "v2-lora-group-limited-yarn": (
        "deepseek_v2",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": 24,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "routed_scaling_factor": 2.0,
            "first_k_dense_replace": 0,
            "attention_bias": True,
            "rope_parameters": yarn(0.707, 0.707),
        },
    ),
    # V3's shape: sigmoid routing with the correction bias, 4 groups of which 2 kept,
    # renormalized and scaled; YaRN with mscale != mscale_all_dim (cos/sin scaled too).
    "v3-noaux-yarn": (
        "deepseek_v3",
        {
            "num_hidden_layers": 3,
            "q_lora_rank": 24,
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1,
            "rope_parameters": yarn(1.0, 0.8),
            "num_nextn_predict_layers": 0,
        },
    ),
    # V3 with half-split RoPE (rope_interleave false), plain RoPE, no q_lora_rank, every layer
    # sparse, ungrouped, a tied head.
    "v3-half-split-tied": (
        "deepseek_v3",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": None,
            "rope_interleave": False,
            "n_group": 1,
            "topk_group": 1,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.5,
            "first_k_dense_replace": 0,
            "rope_theta": 500.0,
            "tie_word_embeddings": True,
            "num_nextn_predict_layers": 0,
        },
    ),
}
HF_CLASSES = {
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}


def save_tiny_deepseek(path: Path, model_type: str, seed: int = 0, **kwargs: Any) -> Any:
    config_class, model_class = HF_CLASSES[model_type]
    hf_config = getattr(transformers, config_class)(**kwargs)
    hf_model = getattr(transformers, model_class)(hf_config).eval()
    randomize_weights(hf_model, torch.Generator().manual_seed(seed), buffers=True)
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> FamilyCheckpoint:
    path = tmp_path_factory.mktemp(request.param)
    model_type, kwargs = CASES[request.param]
    hf_model = save_tiny_deepseek(path, model_type, **SMALL, **kwargs)
    return FamilyCheckpoint.saved(request.param, path, hf_model, PROMPT_LENS)


class TestParity(Bfloat16ParityChecks):
    """Logits within 1e-4 of transformers' (float32; measured at most ~7e-6)."""

    family = DeepseekForCausalLM


def test_config_exercises_the_case(checkpoint: FamilyCheckpoint) -> None:
    config = checkpoint.config
    model_type, kwargs = CASES[checkpoint.name]
    assert config.model_type == model_type
    assert family_for(config) is DeepseekForCausalLM
    assert config.mla is not None
    assert config.moe is not None
    assert config.mla.q_lora_rank == kwargs["q_lora_rank"]
    assert config.mla.rope_interleave == kwargs.get("rope_interleave", True)
    assert config.head_dim == SMALL["qk_nope_head_dim"] + SMALL["qk_rope_head_dim"]
    first_dense = kwargs["first_k_dense_replace"]
    assert config.moe.mlp_layer_types == tuple(
        "sparse" if i >= first_dense else "dense" for i in range(kwargs["num_hidden_layers"])
    )
    is_greedy = kwargs.get("topk_method") == "greedy"
    assert config.moe.n_group == (1 if is_greedy else kwargs["n_group"])
    assert config.moe.topk_group == (1 if is_greedy else kwargs["topk_group"])
    assert config.o_proj_bias == kwargs.get("attention_bias", False)
    rope = kwargs.get("rope_parameters")
    if rope is None:
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling is not None
        assert config.rope_scaling.mscale == rope["mscale"]
        assert config.rope_scaling.mscale_all_dim == rope["mscale_all_dim"]
    # Every layer caches the latent and the RoPE key: 32 + 8 values a token.
    specs = cache_specs(config, indexer_paged=True)
    assert specs == (MlaLatentSpec(kv_lora_rank=32, qk_rope_head_dim=8),) * len(specs)
    model = load_checkpoint(checkpoint, DeepseekForCausalLM)
    sparse_block = DeepseekV2MoeBlock if model_type == "deepseek_v2" else GlmMoeBlock
    mlps = [type(layer.mlp) for layer in model.model.layers]
    assert mlps[first_dense:] == [sparse_block] * (len(mlps) - first_dense)


def test_parameter_counts_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    assert_counts_equal_transformers(
        checkpoint, deepseek_param_counts(checkpoint.config), DeepseekForCausalLM
    )


def test_yarn_table_and_softmax_scale_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    scaling = checkpoint.config.rope_scaling
    attention = checkpoint.hf_model.model.layers[0].self_attn
    assert mla_softmax_scale(checkpoint.config) == pytest.approx(attention.scaling, rel=1e-12)
    if scaling is None:
        return
    rotary = checkpoint.hf_model.model.rotary_emb
    inv_freq = yarn_inv_freq(SMALL["qk_rope_head_dim"], checkpoint.config.rope_theta, scaling)
    torch.testing.assert_close(inv_freq, rotary.inv_freq, atol=0, rtol=0)
    assert yarn_attention_factor(scaling) == pytest.approx(rotary.attention_scaling, rel=1e-12)


def test_mtp_layers_beyond_num_nextn_predict_layers_are_skipped(tmp_path: Path) -> None:
    model_type, kwargs = CASES["v3-noaux-yarn"]
    save_tiny_deepseek(tmp_path, model_type, **SMALL, **kwargs)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    num_layers = kwargs["num_hidden_layers"]
    last, mtp = f"model.layers.{num_layers - 1}.", f"model.layers.{num_layers}."
    tensors.update(
        {mtp + name[len(last) :]: t.clone() for name, t in tensors.items() if name.startswith(last)}
    )
    tensors[mtp + "eh_proj.weight"] = torch.zeros(SMALL["hidden_size"], 2 * SMALL["hidden_size"])
    save_file(tensors, file, metadata={"format": "pt"})
    config = model_config_from_hf_file(tmp_path)
    assert config.mtp is None
    model = load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))
    assert len(model.model.layers) == num_layers
    assert model.num_mtp_layers == 0


def test_v2_norm_topk_prob_is_refused() -> None:
    # transformers' DeepseekV2 ignores it; no published V2 config sets it.
    _, kwargs = CASES["v2-lite-greedy"]
    hf_config = transformers.DeepseekV2Config(**SMALL, **kwargs, norm_topk_prob=True)
    config = model_config_from_hf_dict(hf_config.to_dict(), source="DeepseekV2Config")
    with pytest.raises(ValueError, match="deepseek_v2 with norm_topk_prob is not supported"):
        DeepseekForCausalLM(config)


DEEPSEEK_V3_DIR = Path(__file__).parent / "data" / "deepseek-v3"


def test_the_published_deepseek_v3_plan_equals_transformers() -> None:
    config = model_config_from_hf_file(DEEPSEEK_V3_DIR)
    assert config.mla is not None
    assert config.moe is not None
    assert (config.moe.n_group, config.moe.topk_group) == (8, 4)
    assert config.moe.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 58
    counts = deepseek_param_counts(config)
    stack = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    # transformers' DeepseekV3ForCausalLM on this config (meta device): 671,026,404,352
    # parameters and 14,848 correction-bias entries (58 sparse layers x 256 experts).
    assert stack + counts.layers_fp32 == 671_026_419_200
    assert counts.layers_fp32 == 58 * 256 * (7168 + 1)
    # The MTP layer: a sparse layer (its router and bias float32) plus enorm, hnorm,
    # shared_head.norm and eh_proj (7168, 14336). With its copies of the embedding and head
    # (not loaded) the checkpoint holds 685B parameters, as its model card says.
    assert config.mtp is not None
    assert config.mtp.mlp_layer_types == ("sparse",)
    assert counts.mtp_fp32 == 256 * (7168 + 1)
    assert counts.mtp + counts.mtp_fp32 == 11_610_068_224
    copies = 2 * 129_280 * 7168
    assert (
        abs((stack + counts.layers_fp32 + counts.mtp + counts.mtp_fp32 + copies) / 685e9 - 1) < 1e-3
    )
    # 61 layers x (512 latent + 64 RoPE key), one row per token for all 128 heads.
    specs = cache_specs(config, indexer_paged=True)
    assert specs == (MlaLatentSpec(kv_lora_rank=512, qk_rope_head_dim=64),) * 61
    # YaRN factor 40, mscale_all_dim 1: softmax scale 192 ** -0.5 * (0.1 ln 40 + 1) ** 2.
    assert mla_softmax_scale(config) == pytest.approx(192**-0.5 * 1.3688879454113936**2)
