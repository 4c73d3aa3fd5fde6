"""GGUF metadata of DeepSeek-V2 / V2-Lite / V3 (``deepseek2``, llama.cpp's ``DeepseekV2Model``).

Both model types share the architecture; the gating tells them apart: ``expert_gating_func``
2 (sigmoid, with the ``exp_probs_b`` correction bias) is ``deepseek_v3``, 1 or absent (llama.cpp's
default for older files) ``deepseek_v2``. MLA's sizes are ``attention.q_lora_rank`` (absent:
V2-Lite's full-rank ``attn_q``), ``attention.kv_lora_rank``, ``rope.dimension_count`` (the
rotated dims) and the query/key and value head dims: ``attention.key_length_mla`` /
``value_length_mla`` in files converted since llama.cpp's MLA change (``key_length`` /
``value_length`` then describe the latent and every head reads it: ``head_count_kv`` 1), or
``key_length`` / ``value_length`` in older ones. llama.cpp rotates adjacent pairs for this
architecture, so ``rope_interleave`` holds.

YaRN: the converter writes ``rope.scaling.yarn_log_multiplier`` as ``0.1 * mscale_all_dim`` and
llama.cpp takes ``mscale`` equal to ``mscale_all_dim`` for this architecture (DeepSeek's published
configs set both alike: 0.707 for V2, 1.0 for V3).
"""

from __future__ import annotations

import struct
from typing import cast

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.gguf.shared_expert_moe import read_shared_expert_moe
from metrale_config.gguf.values import shortest_float32s
from metrale_config.gguf.yarn import with_yarn_keys
from metrale_config.model_config import MlaConfig, ModelConfig
from metrale_config.rope import RopeScaling

DEEPSEEK2_ARCHITECTURE = "deepseek2"
SOFTMAX_GATING = 1
SIGMOID_GATING = 2
MODEL_TYPE_OF_GATING = {SOFTMAX_GATING: "deepseek_v2", SIGMOID_GATING: "deepseek_v3"}
# The converter's factor on mscale_all_dim (llama.cpp's TAG_DEEPSEEK2_YARN_LOG_MUL_FIX).
YARN_LOG_MULTIPLIER_SCALE = 0.1
CORRECTION_BIAS_TENSOR = "exp_probs_b.bias"


def with_deepseek2(config: ModelConfig, reader: FieldReader, header: GgufHeader) -> ModelConfig:
    """``config`` (read as a llama-like stack) as DeepSeek's MLA attention and MoE."""
    arch = DEEPSEEK2_ARCHITECTURE
    model_type = _model_type(reader, header)
    mla = _mla(reader, header)
    attention_bias = header.has_tensor("blk.0.attn_output.bias")
    return attrs.evolve(
        config,
        model_type=model_type,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        num_key_value_heads=config.num_attention_heads,
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        mla=mla,
        moe=read_shared_expert_moe(reader, arch, config.num_hidden_layers),
        rope_scaling=_yarn(config.rope_scaling, reader),
    )


def _model_type(reader: FieldReader, header: GgufHeader) -> str:
    gating_key = f"{DEEPSEEK2_ARCHITECTURE}.expert_gating_func"
    gating = reader.integer(gating_key, SOFTMAX_GATING)
    if gating not in MODEL_TYPE_OF_GATING:
        raise reader.error(gating_key, f"must be 1 (softmax) or 2 (sigmoid), got {gating}")
    has_bias = any(info.name.endswith(CORRECTION_BIAS_TENSOR) for info in header.tensors)
    if has_bias != (gating == SIGMOID_GATING):
        have = "has" if has_bias else "lacks"
        raise reader.error(
            gating_key,
            f"is {gating}, but the file {have} the routing correction bias "
            f"(blk.N.{CORRECTION_BIAS_TENSOR}) that DeepSeek-V3's sigmoid gating adds",
        )
    return MODEL_TYPE_OF_GATING[gating]


def _mla(reader: FieldReader, header: GgufHeader) -> MlaConfig:
    arch = DEEPSEEK2_ARCHITECTURE
    rope_dims = reader.positive_integer(f"{arch}.rope.dimension_count")
    if rope_dims % 2:
        raise reader.error(f"{arch}.rope.dimension_count", f"must be even, got {rope_dims}")
    suffix = "_mla" if reader.has(f"{arch}.attention.key_length_mla") else ""
    key_length_key = f"{arch}.attention.key_length{suffix}"
    qk_head_dim = reader.positive_integer(key_length_key)
    v_head_dim = reader.positive_integer(f"{arch}.attention.value_length{suffix}")
    if qk_head_dim <= rope_dims:
        raise reader.error(key_length_key, f"must exceed rope.dimension_count ({rope_dims})")
    q_lora_key = f"{arch}.attention.q_lora_rank"
    q_lora_rank = reader.optional_integer(q_lora_key)
    if q_lora_rank is not None:
        q_lora_rank = reader.positive_integer(q_lora_key)
    if header.has_tensor("blk.0.attn_q_a.weight") != (q_lora_rank is not None):
        problem = "is missing" if q_lora_rank is None else "is set"
        raise reader.error(q_lora_key, f"{problem}, but blk.0's query projection says otherwise")
    return MlaConfig(
        q_lora_rank=q_lora_rank,
        kv_lora_rank=reader.positive_integer(f"{arch}.attention.kv_lora_rank"),
        qk_nope_head_dim=qk_head_dim - rope_dims,
        qk_rope_head_dim=rope_dims,
        v_head_dim=v_head_dim,
        rope_interleave=True,
    )


def _yarn(scaling: RopeScaling | None, reader: FieldReader) -> RopeScaling | None:
    """``scaling`` with the YaRN keys and DeepSeek's mscales."""
    scaling = with_yarn_keys(scaling, reader, DEEPSEEK2_ARCHITECTURE)
    if scaling is None or scaling.rope_type != "yarn":
        return scaling
    log_key = f"{DEEPSEEK2_ARCHITECTURE}.rope.scaling.yarn_log_multiplier"
    log_multiplier = reader.optional_number(log_key)
    if log_multiplier is None:
        return scaling
    try:
        quotient = struct.pack("<f", log_multiplier / YARN_LOG_MULTIPLIER_SCALE)
    except (OverflowError, struct.error) as exc:
        raise reader.error(log_key, "is out of float32 range once divided by 0.1") from exc
    mscale_all_dim = cast("list[float]", shortest_float32s(quotient, "<"))[0]
    return attrs.evolve(scaling, mscale=mscale_all_dim, mscale_all_dim=mscale_all_dim)
