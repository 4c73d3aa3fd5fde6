"""What a parameter counter returns."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class ParamCounts:
    """Parameter counts by owner at the serve dtype, plus the layers' float32 parameters.

    ``layers_int8_weights``: how many of ``layers`` are weights of the linear layers int8
    quantization replaces, in ``layers_int8_rows`` output channels (each with a scale);
    ``layers_projection_shapes``: those linear layers' ``(out, in)`` shapes, every layer's.
    ``mtp`` / ``mtp_fp32``: the multi-token-prediction layers a family loads beside its stack
    (glm4_moe), at the serve dtype and in float32; zero where they are not loaded.
    ``vision``: a vision tower loaded beside the stack (glm5_next), at the serve dtype.
    """

    embeddings: int
    layers: int
    final_norm: int
    lm_head: int
    layers_fp32: int = 0
    layers_int8_weights: int = 0
    layers_int8_rows: int = 0
    layers_projection_shapes: tuple[tuple[int, int], ...] = ()
    mtp: int = 0
    mtp_fp32: int = 0
    vision: int = 0
