"""Checks shared by the GGUF family tests: a GGUF load against the safetensors load of the
checkpoint it was converted from (:mod:`metrale_testing.llama_cpp_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import torch

from metrale_config import ModelConfig, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_testing.family_parity import random_prompts

Q = gguf.GGMLQuantizationType
PROMPT_LENS = (1, 5, 11, 17, 26)
# Fields that name the file rather than the model.
PROVENANCE_FIELDS = frozenset(
    {"source", "architectures", "torch_dtype", "quantization_method", "gguf_projection_types"}
)


@attrs.frozen(kw_only=True)
class ConvertedCheckpoint:
    """A tiny safetensors checkpoint and its GGUFs as llama.cpp's converter writes them (F32 and
    Q8_0)."""

    name: str
    checkpoint_dir: Path
    f32: Path
    q8_0: Path

    def path(self, qtype: Q) -> Path:
        return self.f32 if qtype == Q.F32 else self.q8_0

    def safetensors_config(self) -> ModelConfig:
        return model_config_from_hf_file(self.checkpoint_dir)

    def load_safetensors(self) -> Any:
        """The checkpoint loaded in float32 on the CPU, as the GGUF is."""
        options = LoadOptions(dtype=torch.float32, device="cpu")
        return load_safetensors_model(self.checkpoint_dir, self.safetensors_config(), options)


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


# A_log comes back from the -exp(A_log) a linear-attention GGUF stores within this (float32: one
# rounding of exp, one of the log; measured 9e-8 on Qwen3-Next).
A_LOG_ATOL = 2e-7


def assert_gguf_weights_equal(loaded: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """A GGUF load's weights equal ``expected`` (what the file holds): exactly, but a
    linear-attention layer's A_log within :data:`A_LOG_ATOL`."""
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        if name.endswith("A_log"):
            torch.testing.assert_close(tensor, expected[name], atol=A_LOG_ATOL, rtol=0)
        else:
            assert torch.equal(tensor, expected[name]), name


def assert_gguf_logits_equal(
    gguf_model: Any, reference: Any, expected_state: dict[str, Any], paged_runner: Any
) -> None:
    """``gguf_model``'s prefill logits within 1e-5 of ``reference`` loaded with
    ``expected_state`` and, for a linear-attention model, the file's own A_log: its ~1e-7
    round trip alone moves logits of size ~7 by up to 3.4e-5 (measured on Qwen3-Next); with it
    they agree exactly."""
    for name, tensor in gguf_model.state_dict().items():
        if name.endswith("A_log"):
            expected_state[name] = tensor
    reference.load_state_dict(expected_state)
    ours = prefill_logits(gguf_model, paged_runner)
    for seq_id, logits in prefill_logits(reference, paged_runner).items():
        torch.testing.assert_close(ours[seq_id], logits, atol=1e-5, rtol=0)
