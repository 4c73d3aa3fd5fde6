"""Checks shared by the GGUF family tests: a GGUF load against the safetensors load of the
checkpoint it was converted from (:mod:`metrale_testing.llama_cpp_gguf`)."""

from __future__ import annotations

from typing import Any

import attrs
import gguf
import numpy as np

from metrale_config import ModelConfig
from metrale_testing.family_parity import random_prompts

Q = gguf.GGMLQuantizationType
PROMPT_LENS = (1, 5, 11, 17, 26)
# Fields that name the file rather than the model.
PROVENANCE_FIELDS = frozenset(
    {"source", "architectures", "torch_dtype", "quantization_method", "gguf_projection_types"}
)


def model_fields(config: ModelConfig) -> dict[str, Any]:
    """``config``'s fields but those naming the file it was read from."""
    return {
        field: value
        for field, value in attrs.asdict(config, recurse=False).items()
        if field not in PROVENANCE_FIELDS
    }


def as_the_file_holds(matrix: np.ndarray, qtype: Q) -> np.ndarray:
    """What a ``qtype`` file holds of ``matrix`` (float32): blocks along its rows, or float16
    where the rows are not whole blocks (the converter's fallback)."""
    if qtype == Q.F32:
        return matrix
    try:
        return gguf.quants.dequantize(gguf.quants.quantize(matrix, qtype), qtype)
    except gguf.QuantError:
        return matrix.astype(np.float16).astype(np.float32)


def prefill_logits(model: Any, paged_runner: Any) -> dict[int, Any]:
    """The last-position logits of random prompts of ``PROMPT_LENS`` tokens, by sequence id."""
    prompts = random_prompts(model.config.vocab_size, PROMPT_LENS)
    logits: dict[int, Any] = paged_runner(model, num_blocks=64, block_size=4).step(prompts)
    return logits
