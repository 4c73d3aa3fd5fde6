"""Calibration for GPTQ: each projection's Hessian ``H = 2 X^T X / tokens`` over its inputs
while the float model reads a text.

All layers are calibrated at once from the float model (not GPTQ's sequential order, where
layer ``i + 1`` would see layer ``i``'s quantized output): one pass over the text, a forward
pre-hook on each llama-family projection summing ``X^T X``. The fused ``qkv_proj`` and
``gate_up_proj`` share one input, so ``q/k/v_proj`` share one Hessian, as do ``gate/up_proj``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import attrs
import torch

from metrale_kernels import build_attention_metadata
from metrale_model_arch.kv_cache import allocate_kv_cache
from metrale_model_arch.load import LoadedModel, load_model
from metrale_model_arch.model_source import ModelSource

CHUNK_TOKENS = 512
DEFAULT_CALIBRATION_TOKENS = 2048
_BLOCK_SIZE = 16
# A fused module of the llama family -> the checkpoint projections that read its input.
_FUSED = re.compile(r"(?P<prefix>model\.layers\.\d+\.(self_attn|mlp))\.(?P<module>\w+_proj)")
_READERS = {"qkv_proj": ("q", "k", "v"), "o_proj": ("o",), "gate_up_proj": ("gate", "up"),
            "down_proj": ("down",)}  # fmt: skip


@attrs.frozen(kw_only=True)
class Calibration:
    """A text to calibrate on and how many of its tokens to read."""

    text_path: Path
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS


def calibration_hessians(source: ModelSource, calibration: Calibration) -> dict[str, torch.Tensor]:
    """The float model of ``source`` run over the first ``calibration.num_tokens`` tokens of the
    text in chunks of :data:`CHUNK_TOKENS`: each projection's checkpoint weight name -> its
    Hessian ``(in, in)``, summed in float64, held in float32 (shared by the projections of one
    input)."""
    loaded = load_model(str(source.path))
    text = calibration.text_path.read_text(encoding="utf-8")
    tokens = loaded.tokenizer.encode(text, add_special_tokens=True)[: calibration.num_tokens]
    if len(tokens) < 2:
        raise ValueError(f"{calibration.text_path} has {len(tokens)} tokens: nothing to read")
    grams: dict[str, _InputGram] = {}
    handles = []
    for name, module in loaded.model.named_modules():
        match = _FUSED.fullmatch(name)
        if match is not None and match["module"] in _READERS:
            grams[name] = _InputGram(num_features=module.in_features)
            handles.append(module.register_forward_pre_hook(grams[name].add))
    try:
        for start in range(0, len(tokens), CHUNK_TOKENS):
            _run_chunk(loaded, tokens[start : start + CHUNK_TOKENS])
    finally:
        for handle in handles:
            handle.remove()
    hessians: dict[str, torch.Tensor] = {}
    for name, gram in grams.items():
        match = _FUSED.fullmatch(name)
        assert match is not None
        for part in _READERS[match["module"]]:
            hessians[f"{match['prefix']}.{part}_proj.weight"] = gram.hessian
    return hessians


@attrs.define(eq=False)
class _InputGram:
    """``X^T X`` summed over the inputs a module has seen."""

    num_features: int
    total: torch.Tensor = attrs.field(init=False)
    num_tokens: int = 0

    def __attrs_post_init__(self) -> None:
        self.total = torch.zeros(self.num_features, self.num_features, dtype=torch.float64)

    def add(self, _: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0].detach().reshape(-1, self.num_features).to(torch.float64)
        self.total += x.t() @ x
        self.num_tokens += x.shape[0]

    @property
    def hessian(self) -> torch.Tensor:
        return (2 * self.total / max(self.num_tokens, 1)).to(torch.float32)


def _run_chunk(loaded: LoadedModel, chunk: Sequence[int]) -> None:
    """One prefill of ``chunk`` as a fresh sequence."""
    num_blocks = -(-len(chunk) // _BLOCK_SIZE)
    kv_caches = allocate_kv_cache(
        loaded.config, num_blocks=num_blocks, block_size=_BLOCK_SIZE, dtype=loaded.dtype,
        device=loaded.device,
    )  # fmt: skip
    metadata = build_attention_metadata(
        block_tables=[list(range(num_blocks))],
        seq_lens=[len(chunk)],
        query_lens=[len(chunk)],
        block_size=_BLOCK_SIZE,
        device=loaded.device,
    )
    input_ids = torch.tensor(chunk, dtype=torch.int64, device=loaded.device)
    positions = torch.arange(len(chunk), dtype=torch.int64, device=loaded.device)
    with torch.inference_mode():
        loaded.model(input_ids, positions, kv_caches, metadata)
