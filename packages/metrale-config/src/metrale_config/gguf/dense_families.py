"""GGUF metadata of the dense families that depart from llama: gemma2, gemma3, phi3, olmo2,
granite, smollm3 (llama.cpp's converter classes ``Gemma2Model`` ... ``SmolLM3Model``).

Each reads what the converter writes and, where the converter writes nothing, takes the value
llama.cpp's loader fixes for the architecture (so a file runs here as it runs there):

- gemma2 / gemma3: GELU (tanh), the sandwich norms scaled by ``1 + w`` (the loader takes the
  converter's ``+ 1`` back off), embeddings times sqrt(hidden). The softmax scale is
  ``key_length ** -0.5`` (``hidden / heads`` for the 27B layer counts): the converter drops
  ``query_pre_attn_scalar``. Sliding layers follow llama.cpp's fixed period (2; 6) unless the
  file has ``attention.sliding_window_pattern``; gemma3's local RoPE base is
  ``rope.freq_base_swa``, else llama.cpp's 10000;
- phi3: partial rotary from ``rope.dimension_count``; LongRoPE from the ``rope_factors_long`` /
  ``rope_factors_short`` tensors and ``rope.scaling.original_context_length``;
- olmo2: norms after attention and the MLP, q/k norms over the whole projection;
- granite: the four multipliers, required (llama.cpp requires them too);
- smollm3: NoPE every 4th layer (llama.cpp's fixed step: the file does not say).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.gguf.tensor_values import read_float32_vector
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig, NormLayout
from metrale_config.rope import RopeScaling

FULL = LayerType.FULL_ATTENTION
SLIDING = LayerType.SLIDING_ATTENTION
GEMMA_HIDDEN_ACT = "gelu_pytorch_tanh"
# llama.cpp: every n-th layer is full attention, the others slide (``set_swa_pattern``).
GEMMA_SLIDING_PERIOD = {"gemma2": 2, "gemma3": 6}
# llama.cpp's layer count of each 27B model, whose softmax scale is (hidden / heads) ** -0.5.
GEMMA_27B_NUM_LAYERS = {"gemma2": 46, "gemma3": 62}
GEMMA2_DEFAULT_SLIDING_WINDOW = 4096
GEMMA3_DEFAULT_LOCAL_ROPE_THETA = 10000.0
SMOLLM3_NOPE_STEP = 4
ROPE_FACTORS_LONG = "rope_factors_long.weight"
ROPE_FACTORS_SHORT = "rope_factors_short.weight"
# A stored LongRoPE attention factor this close to the one derived from the context lengths is
# that one (float32 rounding): the config then leaves it derived, as config.json does.
_DERIVED_REL_TOL = 1e-6


def with_dense_family(
    config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str
) -> ModelConfig:
    """``config`` with its family's departures from llama when ``arch`` is one of this
    module's; else unchanged."""
    parse = _FAMILIES.get(arch)
    return config if parse is None else parse(config, reader, header, arch)


def _gemma(config: ModelConfig, reader: FieldReader, arch: str, window: int | None) -> ModelConfig:
    num_layers = config.num_hidden_layers
    if window is None or window <= 0:
        window, layer_types = None, (FULL,) * num_layers
    else:
        layer_types = _sliding_pattern(reader, arch, num_layers, GEMMA_SLIDING_PERIOD[arch])
    return attrs.evolve(
        config,
        hidden_act=GEMMA_HIDDEN_ACT,
        norm_layout=NormLayout.SANDWICH,
        norm_weight_offset=1.0,
        embedding_multiplier=config.hidden_size**0.5,
        attention_scale=_gemma_attention_scale(config, reader, arch),
        sliding_window=window,
        layer_types=layer_types,
    )


def _gemma_attention_scale(config: ModelConfig, reader: FieldReader, arch: str) -> float:
    scale_key = f"{arch}.attention.scale"
    if reader.has(scale_key):
        return reader.number(scale_key)
    # transformers' query_pre_attn_scalar ** -0.5, with the scalar llama.cpp assumes.
    scalar = config.head_dim
    if config.num_hidden_layers == GEMMA_27B_NUM_LAYERS[arch]:
        scalar = config.hidden_size // config.num_attention_heads
    scale: float = scalar**-0.5
    return scale


def _sliding_pattern(
    reader: FieldReader, arch: str, num_layers: int, period: int
) -> tuple[LayerType, ...]:
    """Per layer: the file's ``sliding_window_pattern`` (a flag per layer, or a period), else
    llama.cpp's fixed ``period``."""
    key = f"{arch}.attention.sliding_window_pattern"
    declared = reader.data.get(key)
    if isinstance(declared, list):
        if len(declared) != num_layers or not all(isinstance(x, bool) for x in declared):
            raise reader.error(key, f"must hold {num_layers} booleans (one per layer)")
        return tuple(SLIDING if is_sliding else FULL for is_sliding in declared)
    period = reader.positive_integer(key, period)
    return tuple(FULL if (i + 1) % period == 0 else SLIDING for i in range(num_layers))


def _gemma2(config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str) -> ModelConfig:
    del header
    window = reader.integer(f"{arch}.attention.sliding_window", GEMMA2_DEFAULT_SLIDING_WINDOW)
    return attrs.evolve(
        _gemma(config, reader, arch, window),
        attn_logit_softcapping=reader.number(f"{arch}.attn_logit_softcapping", 50.0),
        final_logit_softcapping=reader.number(f"{arch}.final_logit_softcapping", 30.0),
    )


def _gemma3(config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str) -> ModelConfig:
    del header
    window = reader.optional_integer(f"{arch}.attention.sliding_window")
    return attrs.evolve(
        _gemma(config, reader, arch, window),
        local_rope_theta=reader.number(
            f"{arch}.rope.freq_base_swa", GEMMA3_DEFAULT_LOCAL_ROPE_THETA
        ),
        final_logit_softcapping=reader.optional_number(f"{arch}.final_logit_softcapping"),
    )


def _phi3(config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str) -> ModelConfig:
    rotary_dims = reader.integer(f"{arch}.rope.dimension_count", config.head_dim)
    window = reader.integer(f"{arch}.attention.sliding_window", 0)
    # The converter writes 0 for "no window" (llama.cpp ignores Phi's window; transformers,
    # and so this, slides every layer).
    sliding_window = window if window > 0 else None
    return attrs.evolve(
        config,
        partial_rotary_factor=rotary_dims / config.head_dim,
        rope_scaling=_longrope(config, reader, header, arch) or config.rope_scaling,
        sliding_window=sliding_window,
        layer_types=(FULL if sliding_window is None else SLIDING,) * config.num_hidden_layers,
    )


def _longrope(
    config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str
) -> RopeScaling | None:
    if not header.has_tensor(ROPE_FACTORS_LONG):
        return None
    original = reader.positive_integer(f"{arch}.rope.scaling.original_context_length")
    factor = config.max_position_embeddings / original
    derived = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    stored = reader.optional_number(f"{arch}.rope.scaling.attn_factor")
    is_derived = stored is None or math.isclose(stored, derived, rel_tol=_DERIVED_REL_TOL)
    return RopeScaling(
        rope_type="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        short_factor=read_float32_vector(header, ROPE_FACTORS_SHORT),
        long_factor=read_float32_vector(header, ROPE_FACTORS_LONG),
        attention_factor=None if is_derived else stored,
    )


def _olmo2(config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str) -> ModelConfig:
    del header
    window_key = f"{arch}.attention.sliding_window"
    if reader.has(window_key):
        raise reader.error(window_key, "is not supported (Olmo 3's sliding-window layers)")
    return attrs.evolve(config, norm_layout=NormLayout.POST, qk_norm_per_head=False)


def _granite(
    config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str
) -> ModelConfig:
    del header
    return attrs.evolve(
        config,
        embedding_multiplier=reader.number(f"{arch}.embedding_scale"),
        attention_scale=reader.number(f"{arch}.attention.scale"),
        residual_multiplier=reader.number(f"{arch}.residual_scale"),
        logits_scaling=reader.number(f"{arch}.logit_scale"),
    )


def _smollm3(
    config: ModelConfig, reader: FieldReader, header: GgufHeader, arch: str
) -> ModelConfig:
    del reader, header, arch
    num_layers = config.num_hidden_layers
    return attrs.evolve(
        config,
        nope_layers=tuple(i for i in range(num_layers) if (i + 1) % SMOLLM3_NOPE_STEP == 0),
    )


_FAMILIES: Mapping[str, Callable[[ModelConfig, FieldReader, GgufHeader, str], ModelConfig]] = {
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "phi3": _phi3,
    "olmo2": _olmo2,
    "granite": _granite,
    "smollm3": _smollm3,
}
DENSE_GGUF_ARCHITECTURES = tuple(_FAMILIES)
