"""The one table of model types: each maps to its :class:`Architecture` record."""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.architecture import Architecture, Trait
from metrale_model_arch.cache_spec import LayerCacheSpec, attention_cache_specs
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.deepseek import deepseek_param_counts
from metrale_model_arch.counts.dense_variants import dense_variant_param_counts
from metrale_model_arch.counts.gemma3 import gemma3_param_counts
from metrale_model_arch.counts.glm4_moe import glm4_moe_param_counts
from metrale_model_arch.counts.glm5_next import glm5_next_param_counts
from metrale_model_arch.counts.gpt_oss import gpt_oss_param_counts
from metrale_model_arch.counts.kimi_linear import kimi_linear_param_counts
from metrale_model_arch.counts.llama import llama_param_counts
from metrale_model_arch.counts.moe import mixtral_param_counts, qwen3_moe_param_counts
from metrale_model_arch.counts.qwen2_5_vl import qwen2_5_vl_param_counts
from metrale_model_arch.counts.qwen3_next import qwen3_next_param_counts
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.deepseek import DeepseekForCausalLM, deepseek_checkpoint_mapping
from metrale_model_arch.families.dense_variants import DenseVariantForCausalLM
from metrale_model_arch.families.gemma3 import (
    Gemma3ForConditionalGeneration,
    gemma3_checkpoint_mapping,
)
from metrale_model_arch.families.gguf_names import (
    DEEPSEEK2_GGUF_NAMES,
    GEMMA_GGUF_NAMES,
    GLM4_MOE_GGUF_NAMES,
    GPT_OSS_GGUF_NAMES,
    KIMI_LINEAR_GGUF_NAMES,
    LLAMA_GGUF_NAMES,
    OLMO2_GGUF_NAMES,
    PHI3_GGUF_NAMES,
    QWEN3NEXT_GGUF_NAMES,
    QWEN_GGUF_NAMES,
    GgufNames,
)
from metrale_model_arch.families.glm4_moe import Glm4MoeForCausalLM, glm4_moe_checkpoint_mapping
from metrale_model_arch.families.glm5_next import Glm5NextForCausalLM, glm5_next_checkpoint_mapping
from metrale_model_arch.families.gpt_oss import GptOssForCausalLM, gpt_oss_checkpoint_mapping
from metrale_model_arch.families.kimi_linear import (
    KimiLinearForCausalLM,
    kimi_linear_checkpoint_mapping,
)
from metrale_model_arch.families.llama import LlamaForCausalLM, llama_checkpoint_mapping
from metrale_model_arch.families.mixtral import MixtralForCausalLM, mixtral_checkpoint_mapping
from metrale_model_arch.families.qwen2_5_vl import (
    Qwen2_5_VLForCausalLM,
    qwen2_5_vl_checkpoint_mapping,
)
from metrale_model_arch.families.qwen3_moe import (
    Qwen3MoeForCausalLM,
    qwen3_moe_checkpoint_mapping,
)
from metrale_model_arch.families.qwen3_next import (
    Qwen3NextForCausalLM,
    qwen3_next_checkpoint_mapping,
)
from metrale_model_arch.glm5_next_skeleton import Glm5NextTextSkeleton
from metrale_model_arch.kv_cache_dtype import KvCacheDtype, quantized_kv_specs
from metrale_model_arch.sliding_window_ring import RingLayout, ring_window_specs

LLAMA = Architecture(
    model_type="llama",
    module=LlamaForCausalLM,
    checkpoint_mapping=llama_checkpoint_mapping,
    gguf_names=LLAMA_GGUF_NAMES,
    param_counts=llama_param_counts,
    cache_specs=attention_cache_specs,
    int8_linears=frozenset({"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}),
    rings_sliding_window=True,
)
QWEN3_MOE = Architecture(
    model_type="qwen3_moe",
    module=Qwen3MoeForCausalLM,
    checkpoint_mapping=qwen3_moe_checkpoint_mapping,
    gguf_names=QWEN_GGUF_NAMES,
    param_counts=qwen3_moe_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE, Trait.SLIDING_WINDOW}),
    rings_sliding_window=True,
)
MIXTRAL = Architecture(
    model_type="mixtral",
    module=MixtralForCausalLM,
    checkpoint_mapping=mixtral_checkpoint_mapping,
    gguf_names=LLAMA_GGUF_NAMES,
    param_counts=mixtral_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE, Trait.SLIDING_WINDOW}),
    rings_sliding_window=True,
)
GLM5_NEXT = Architecture(
    model_type="glm5_next",
    module=Glm5NextForCausalLM,
    checkpoint_mapping=glm5_next_checkpoint_mapping,
    gguf_names=None,
    param_counts=glm5_next_param_counts,
    cache_specs=attention_cache_specs,
    skeleton=Glm5NextTextSkeleton.from_config,
    traits=frozenset({Trait.MOE, Trait.MLA, Trait.LINEAR_STATE}),
)
# Eager only (partial rotary, GLM's MoE block); MTP layers loaded and owned (weights.mtp).
GLM4_MOE = Architecture(
    model_type="glm4_moe",
    module=Glm4MoeForCausalLM,
    checkpoint_mapping=glm4_moe_checkpoint_mapping,
    gguf_names=GLM4_MOE_GGUF_NAMES,
    param_counts=glm4_moe_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE}),
)
# Eager only (MLA over a paged latent, DeepSeek's MoE); V3's MTP layers loaded and owned
# (weights.mtp).
DEEPSEEK_V2 = Architecture(
    model_type="deepseek_v2",
    module=DeepseekForCausalLM,
    checkpoint_mapping=deepseek_checkpoint_mapping,
    gguf_names=DEEPSEEK2_GGUF_NAMES,
    param_counts=deepseek_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE, Trait.MLA}),
)


def paged_indexer_cache_specs(
    config: ModelConfig, *, indexer_paged: bool
) -> tuple[LayerCacheSpec, ...]:
    """:func:`attention_cache_specs` with the indexer keys always in the KV pool (the flat
    layout, ``METRALE_GLM_DSA_INDEXER_FLAT``, is GLM-5.3's)."""
    del indexer_paged
    return attention_cache_specs(config, indexer_paged=True)


# DeepSeek-V3.2: V3 with a lightning indexer over single tokens on every layer. llama.cpp has
# no architecture for it: no GGUF.
DEEPSEEK_V32 = attrs.evolve(
    DEEPSEEK_V2,
    model_type="deepseek_v32",
    gguf_names=None,
    cache_specs=paged_indexer_cache_specs,
)


# Eager only (attention sinks on the row-invariant torch path, gpt-oss's biased MoE).
GPT_OSS = Architecture(
    model_type="gpt_oss",
    module=GptOssForCausalLM,
    checkpoint_mapping=gpt_oss_checkpoint_mapping,
    gguf_names=GPT_OSS_GGUF_NAMES,
    param_counts=gpt_oss_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE, Trait.SLIDING_WINDOW}),
    rings_sliding_window=True,
)
# Eager only (KDA state slots beside NoPE MLA over a paged latent, DeepSeek-V3's MoE).
KIMI_LINEAR = Architecture(
    model_type="kimi_linear",
    module=KimiLinearForCausalLM,
    checkpoint_mapping=kimi_linear_checkpoint_mapping,
    gguf_names=KIMI_LINEAR_GGUF_NAMES,
    param_counts=kimi_linear_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE, Trait.MLA, Trait.LINEAR_STATE}),
)
# Eager only (Gated DeltaNet state slots beside gated, partially rotary GQA; a gated shared
# expert).
QWEN3_NEXT = Architecture(
    model_type="qwen3_next",
    module=Qwen3NextForCausalLM,
    checkpoint_mapping=qwen3_next_checkpoint_mapping,
    gguf_names=QWEN3NEXT_GGUF_NAMES,
    param_counts=qwen3_next_param_counts,
    cache_specs=attention_cache_specs,
    traits=frozenset({Trait.MOE, Trait.LINEAR_STATE}),
)
SLIDING = frozenset({Trait.SLIDING_WINDOW})
# Eager only, no int8 path (see ``families.dense_variants``).
DENSE_VARIANT = Architecture(
    model_type="olmo2",
    module=DenseVariantForCausalLM,
    checkpoint_mapping=llama_checkpoint_mapping,
    gguf_names=None,
    param_counts=dense_variant_param_counts,
    cache_specs=attention_cache_specs,
    rings_sliding_window=True,
)
# Eager only (M-RoPE positions), no int8 path; its vision tower owned (weights.vision). GGUF:
# llama.cpp's qwen2vl text file, with its mmproj's tower beside it (``loading.mmproj_loader``).
QWEN2_5_VL = Architecture(
    model_type="qwen2_5_vl",
    module=Qwen2_5_VLForCausalLM,
    checkpoint_mapping=qwen2_5_vl_checkpoint_mapping,
    gguf_names=QWEN_GGUF_NAMES,
    param_counts=qwen2_5_vl_param_counts,
    cache_specs=attention_cache_specs,
    traits=SLIDING,
    rings_sliding_window=True,
)
# model type -> traits, llama.cpp names (granite and smollm3 convert as llama: permuted)
DENSE_VARIANT_TYPES: dict[str, tuple[frozenset[Trait], GgufNames]] = {
    "olmo2": (frozenset(), OLMO2_GGUF_NAMES),
    "granite": (frozenset(), LLAMA_GGUF_NAMES),
    "smollm3": (SLIDING, LLAMA_GGUF_NAMES),
    "phi3": (SLIDING, PHI3_GGUF_NAMES),
    "gemma2": (SLIDING, GEMMA_GGUF_NAMES),
    "gemma3_text": (SLIDING, GEMMA_GGUF_NAMES),
}
# Eager only: gemma3_text's stack under a SigLIP tower and Gemma 3's projector. GGUF: the
# gemma3 text file and its mmproj (``loading.mmproj_loader`` puts the text names under
# ``model.language_model.``).
GEMMA3 = Architecture(
    model_type="gemma3",
    module=Gemma3ForConditionalGeneration,
    checkpoint_mapping=gemma3_checkpoint_mapping,
    gguf_names=GEMMA_GGUF_NAMES,
    param_counts=gemma3_param_counts,
    cache_specs=attention_cache_specs,
    traits=SLIDING,
    rings_sliding_window=True,
)

ARCHITECTURES: dict[str, Architecture] = {
    record.model_type: record
    for record in (
        LLAMA,
        attrs.evolve(LLAMA, model_type="mistral", traits=SLIDING),
        attrs.evolve(LLAMA, model_type="qwen2", gguf_names=QWEN_GGUF_NAMES, traits=SLIDING),
        attrs.evolve(LLAMA, model_type="qwen3", gguf_names=QWEN_GGUF_NAMES, traits=SLIDING),
        QWEN3_MOE,
        MIXTRAL,
        GLM4_MOE,
        DEEPSEEK_V2,
        attrs.evolve(DEEPSEEK_V2, model_type="deepseek_v3"),
        DEEPSEEK_V32,
        GPT_OSS,
        KIMI_LINEAR,
        QWEN3_NEXT,
        GLM5_NEXT,
        attrs.evolve(GLM5_NEXT, model_type="glm5_next_text"),
        GEMMA3,
        QWEN2_5_VL,
        *(
            attrs.evolve(DENSE_VARIANT, model_type=name, traits=traits, gguf_names=names)
            for name, (traits, names) in DENSE_VARIANT_TYPES.items()
        ),
    )
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(
    sorted(name for name, record in ARCHITECTURES.items() if record.is_runnable)
)
PLANNED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(ARCHITECTURES))


class UnsupportedModelError(ValueError):
    """A config this build parses but has no torch family to run (or no record at all)."""


def architecture_for(config: ModelConfig) -> Architecture:
    """The record of ``config.model_type`` with a runnable module, or
    :class:`UnsupportedModelError` listing the supported model types."""
    record = ARCHITECTURES.get(config.model_type)
    if record is None or not record.is_runnable:
        raise UnsupportedModelError(
            f"model_type {config.model_type!r} ({config.source}) has no runnable model family; "
            f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return record


def planned_architecture(config: ModelConfig) -> Architecture:
    """The record of ``config.model_type`` for memory planning: runnable or only planned."""
    record = ARCHITECTURES.get(config.model_type)
    if record is None:
        raise UnsupportedModelError(
            f"{config.source}: no weight plan for model_type {config.model_type!r} "
            f"(planned: {', '.join(PLANNED_MODEL_TYPES)})"
        )
    return record


def family_for(config: ModelConfig) -> type[CausalLM]:
    """The torch module class for ``config.model_type``, or :class:`UnsupportedModelError`."""
    module = architecture_for(config).module
    assert module is not None  # is_runnable
    return module


def cache_specs(
    config: ModelConfig,
    *,
    indexer_paged: bool,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
    ring: RingLayout | None = None,
) -> tuple[LayerCacheSpec, ...]:
    """One cache spec per layer of ``config`` (see :mod:`metrale_model_arch.cache_spec`), its
    K/V attention layers stored as ``kv_cache_dtype``; with ``ring``, the sliding-window layers
    of a type that rings them in a ring per sequence where that saves memory."""
    record = planned_architecture(config)
    specs = record.cache_specs(config, indexer_paged=indexer_paged)
    specs = quantized_kv_specs(specs, kv_cache_dtype, config.model_type)
    if ring is None or not record.rings_sliding_window:
        return specs
    return ring_window_specs(specs, ring)


def param_counts(config: ModelConfig) -> ParamCounts:
    """Parameters of ``config`` by owner, from its record's counter."""
    return planned_architecture(config).param_counts(config)
