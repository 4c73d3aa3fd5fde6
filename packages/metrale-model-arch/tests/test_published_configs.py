"""The published configs of Qwen3-Next-80B-A3B-Instruct, Kimi-Linear-48B-A3B-Instruct and
gemma-3-27b-it (``tests/data/*/config.json``, each exactly as its Hugging Face repo serves it):
the parameter count from the config alone equals the count the released checkpoint publishes,
and the planned weight bytes are within 1% of the checkpoint's bytes, like compared with like.
"""

from __future__ import annotations

from pathlib import Path

from metrale_config import FULL_ATTENTION, LINEAR_ATTENTION, model_config_from_hf_file
from metrale_model_arch.counts.gemma3 import gemma3_param_counts
from metrale_model_arch.counts.kimi_linear import kimi_linear_param_counts
from metrale_model_arch.counts.moe import routed_experts_params, router_params, swiglu_mlp_params
from metrale_model_arch.counts.qwen3_next import gated_attention_params, qwen3_next_param_counts
from metrale_model_arch.memory import MTP, weight_bytes

DATA = Path(__file__).parent / "data"

# Qwen/Qwen3-Next-80B-A3B-Instruct: the safetensors metadata's parameter total, 81,324,862,720
# (the hub's "81.3B params"), counts the MTP layer (mtp.*) the release ships and that
# transformers does not load; the plan holds it apart (``weights.mtp``) if at all.
QWEN3_NEXT_CHECKPOINT_PARAMS = 81_324_862_720
# moonshotai/Kimi-Linear-48B-A3B-Instruct: the 20 shards hold 49,122,681,728 parameters in
# 98,245,528,576 bytes (91.50 GiB): bfloat16 but for KDA's A_log and dt_bias in float32.
KIMI_LINEAR_CHECKPOINT_PARAMS = 49_122_681_728
KIMI_LINEAR_CHECKPOINT_BYTES = 98_245_528_576
# google/gemma-3-27b-it: 27,432,406,640 parameters (keras-hub's Gemma 3 27B presets; the
# same-shaped google/medgemma-27b-it index has metadata.total_size 54,864,813,280, twice that),
# the SigLIP tower and projector among them, all bfloat16.
GEMMA_3_27B_CHECKPOINT_PARAMS = 27_432_406_640


def test_qwen3_next_80b_a3b_counts_the_checkpoint_but_its_mtp_layer() -> None:
    config = model_config_from_hf_file(DATA / "qwen3-next-80b-a3b-instruct")
    # layer_types unset: three Gated DeltaNet layers, then one gated attention, twelve times.
    assert config.layer_types == ((LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)) * 12
    counts = qwen3_next_param_counts(config)
    stack = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert counts.layers_fp32 == 0
    # The MTP layer: fc (2 x hidden -> hidden), its three RMSNorms (pre_fc_norm_embedding,
    # pre_fc_norm_hidden, norm) and one gated-attention decoder layer with the sparse MoE.
    hidden, moe = config.hidden_size, config.moe
    assert moe is not None
    shared = swiglu_mlp_params(hidden, moe.shared_expert_intermediate_size or 0) + hidden
    sparse_mlp = routed_experts_params(hidden, moe) + router_params(hidden, moe) + shared
    mtp_layer = gated_attention_params(config) + sparse_mlp + 2 * hidden
    mtp = 2 * hidden * hidden + 3 * hidden + mtp_layer
    assert stack + mtp == QWEN3_NEXT_CHECKPOINT_PARAMS
    assert counts.mtp in (0, mtp)
    weights = weight_bytes(config, 2).by_owner()
    weights.pop(MTP, None)
    assert sum(weights.values()) == 2 * (QWEN3_NEXT_CHECKPOINT_PARAMS - mtp)


def test_kimi_linear_48b_a3b_plan_is_within_one_percent_of_the_checkpoint() -> None:
    config = model_config_from_hf_file(DATA / "kimi-linear-48b-a3b-instruct")
    # 1-based lists in the config: KDA everywhere but every fourth layer and the last.
    full = {3, 7, 11, 15, 19, 23, 26}
    assert config.layer_types == tuple(
        FULL_ATTENTION if i in full else LINEAR_ATTENTION for i in range(27)
    )
    counts = kimi_linear_param_counts(config)
    stack = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert stack + counts.layers_fp32 == KIMI_LINEAR_CHECKPOINT_PARAMS
    # The plan keeps the routers, their correction biases and KDA's convolutions in float32
    # besides A_log and dt_bias, hence 0.03% over the checkpoint's bytes.
    planned = weight_bytes(config, 2).total()
    assert planned == 2 * stack + 4 * counts.layers_fp32
    assert abs(planned / KIMI_LINEAR_CHECKPOINT_BYTES - 1) < 0.001


def test_gemma_3_27b_counts_the_checkpoint_with_its_vision_tower() -> None:
    config = model_config_from_hf_file(DATA / "gemma-3-27b-it")
    assert config.siglip_vision is not None
    counts = gemma3_param_counts(config)
    # Tied head; 262,208 embedding rows (gemma3_text's default vocab_size).
    assert counts.lm_head == 0
    assert counts.embeddings == 262_208 * 5376
    total = counts.embeddings + counts.layers + counts.final_norm + counts.vision
    assert total == GEMMA_3_27B_CHECKPOINT_PARAMS
    weights = weight_bytes(config, 2)
    assert weights.vision == 2 * counts.vision
    assert weights.total() == 2 * GEMMA_3_27B_CHECKPOINT_PARAMS
