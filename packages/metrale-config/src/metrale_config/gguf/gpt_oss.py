"""GGUF metadata of gpt-oss (``gpt-oss``, llama.cpp's ``GptOssModel``).

The converter writes ``TextModel``'s keys (YaRN with its betas), the sliding window and the
routed experts (``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``).
Where the file says nothing, the values are the architecture's own, fixed in llama.cpp and in
every gpt-oss checkpoint: sliding-window layers at even indices, the top-k router logits
softmaxed, the SwiGLU's ``alpha`` 1.702 and clamp 7.0, and YaRN without truncating its ramp
(transformers' ``truncate: false`` for gpt-oss).
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.gguf.yarn import with_yarn_keys
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig, MoeConfig

GPT_OSS_ARCHITECTURE = "gpt-oss"
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def with_gpt_oss(config: ModelConfig, reader: FieldReader, header: GgufHeader) -> ModelConfig:
    """``config`` (read as a llama-like stack) as gpt-oss's sliding layers, sinks and experts."""
    del header
    arch = GPT_OSS_ARCHITECTURE
    num_layers = config.num_hidden_layers
    window = reader.positive_integer(f"{arch}.attention.sliding_window")
    moe = MoeConfig(
        num_experts=reader.positive_integer(f"{arch}.expert_count"),
        num_experts_per_tok=reader.positive_integer(f"{arch}.expert_used_count"),
        moe_intermediate_size=reader.positive_integer(
            f"{arch}.expert_feed_forward_length", config.intermediate_size
        ),
        norm_topk_prob=True,
        mlp_layer_types=("sparse",) * num_layers,
    )
    scaling = with_yarn_keys(config.rope_scaling, reader, arch)
    if scaling is not None and scaling.rope_type == "yarn":
        scaling = attrs.evolve(scaling, truncate=False)
    return attrs.evolve(
        config,
        sliding_window=window,
        layer_types=tuple(
            LayerType.SLIDING_ATTENTION if i % 2 == 0 else LayerType.FULL_ATTENTION
            for i in range(num_layers)
        ),
        moe=moe,
        rope_scaling=scaling,
        swiglu_alpha=SWIGLU_ALPHA,
        swiglu_limit=SWIGLU_LIMIT,
    )
