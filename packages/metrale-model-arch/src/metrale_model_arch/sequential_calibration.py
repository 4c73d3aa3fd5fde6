"""GPTQ's sequential calibration: a llama-family model rounded a layer at a time, each
projection's Hessian from its inputs in the model rounded so far.

The float model reads the calibration text (:func:`~metrale_model_arch.calibration.
calibration_chunks`) one decoder layer at a time: layer ``i``'s inputs are what layers
``0 .. i - 1``, already rounded, output. Inside a layer the projections are rounded in the
order they read: ``q/k/v`` (one input, one Hessian), ``o``, ``gate/up`` (one input), ``down``;
for each, the layer runs again over the chunks up to that projection (its input hook stops the
run), so its input comes through the projections before it already rounded. The rounded
weights replace the float ones in the model, and the layer then runs whole to give the next
layer its inputs.

What is returned is each projection's rounding, in the form it is stored (levels and scales),
for the checkpoint writers to write as they are: each projection is rounded once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import attrs
import torch

from metrale_kernels import AttentionMetadata, build_attention_metadata
from metrale_model_arch.calibration import Calibration, InputGram, calibration_chunks
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from metrale_model_arch.kv_cache import allocate_kv_cache
from metrale_model_arch.load import LoadedModel, load_model
from metrale_model_arch.model_source import ModelSource


class RoundedWeight(Protocol):
    """A weight rounded to its grid, as it is stored."""

    def dequantized(self) -> torch.Tensor:
        """The weight it stands for, ``(out, in)`` float32."""
        ...


RoundedT = TypeVar("RoundedT", bound=RoundedWeight)
# (checkpoint weight name, float32 weight (out, in), Hessian (in, in)) -> the weight rounded.
Rounding = Callable[[str, torch.Tensor, torch.Tensor], RoundedT]

_BLOCK_SIZE = 16


@attrs.frozen
class _Step:
    """One input of a layer: the fused module that reads it and its checkpoint projections."""

    block: str  # self_attn or mlp
    module: str
    parts: tuple[str, ...]


# In the order a layer reads them.
_STEPS = (
    _Step("self_attn", "qkv_proj", ("q", "k", "v")),
    _Step("self_attn", "o_proj", ("o",)),
    _Step("mlp", "gate_up_proj", ("gate", "up")),
    _Step("mlp", "down_proj", ("down",)),
)


class _InputSeenError(Exception):
    """Raised by a step's input hook: the rest of the layer is not needed."""


@attrs.frozen(eq=False)
class _Chunk:
    """One calibration chunk as a fresh sequence: its positions, KV cache and metadata."""

    positions: torch.Tensor
    kv_caches: Sequence[LayerCache]
    metadata: AttentionMetadata

    @classmethod
    def of(cls, loaded: LoadedModel, num_tokens: int) -> _Chunk:
        num_blocks = -(-num_tokens // _BLOCK_SIZE)
        kv_caches = allocate_kv_cache(
            loaded.config, num_blocks=num_blocks, block_size=_BLOCK_SIZE, dtype=loaded.dtype,
            device=loaded.device,
        )  # fmt: skip
        metadata = build_attention_metadata(
            block_tables=[list(range(num_blocks))],
            seq_lens=[num_tokens],
            query_lens=[num_tokens],
            block_size=_BLOCK_SIZE,
            device=loaded.device,
        )
        positions = torch.arange(num_tokens, dtype=torch.int64, device=loaded.device)
        return cls(positions, kv_caches, metadata)


def sequential_rounding(
    source: ModelSource, calibration: Calibration, rounding: Rounding[RoundedT]
) -> dict[str, RoundedT]:
    """``source``'s float model (float32) rounded by ``rounding`` a projection at a time as the
    module says, each given the Hessian ``(in, in)`` float32 of its input (one for ``q/k/v``,
    one for ``gate/up``); each projection's checkpoint weight name -> its rounding."""
    loaded = load_model(str(source.path))
    model = loaded.model
    if not isinstance(model, LlamaForCausalLM) or not model.has_dense_layers:
        raise ValueError(f"{type(model).__name__}: calibration reads dense llama-family layers")
    token_chunks = calibration_chunks(loaded.tokenizer, calibration)
    chunks = [_Chunk.of(loaded, len(tokens)) for tokens in token_chunks]
    rounded: dict[str, RoundedT] = {}
    with torch.no_grad():
        hidden = [
            model.model.embed_tokens(torch.tensor(tokens, device=loaded.device))
            for tokens in token_chunks
        ]
        cos_sin = model.model.cos_sin_cache
        for index, layer in enumerate(model.model.layers):
            assert isinstance(layer, LlamaDecoderLayer)

            def run(x: torch.Tensor, chunk: _Chunk, i: int = index) -> torch.Tensor:
                out: torch.Tensor = model.model.layers[i](
                    x, chunk.positions, cos_sin, chunk.kv_caches[i], chunk.metadata
                )
                return out

            for step in _STEPS:
                hessian = _step_hessian(layer, step, hidden, chunks, run)
                _round_step(layer, index, step, hessian, rounding, rounded)
            hidden = [run(x, chunk) for x, chunk in zip(hidden, chunks, strict=True)]
    return rounded


def _step_hessian(
    layer: LlamaDecoderLayer,
    step: _Step,
    hidden: Sequence[torch.Tensor],
    chunks: Sequence[_Chunk],
    run: Callable[[torch.Tensor, _Chunk], torch.Tensor],
) -> torch.Tensor:
    """The Hessian of ``step``'s module over the chunks, the layer run up to it."""
    module = getattr(getattr(layer, step.block), step.module)
    gram = InputGram(num_features=module.in_features)

    def seen(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        gram.add(module, args)
        raise _InputSeenError

    handle = module.register_forward_pre_hook(seen)
    try:
        for x, chunk in zip(hidden, chunks, strict=True):
            with contextlib.suppress(_InputSeenError):
                run(x, chunk)
    finally:
        handle.remove()
    return gram.hessian


def _round_step(
    layer: LlamaDecoderLayer,
    index: int,
    step: _Step,
    hessian: torch.Tensor,
    rounding: Rounding[RoundedT],
    rounded: dict[str, RoundedT],
) -> None:
    """Each of ``step``'s projections rounded in place in the fused weight (rows stacked in
    ``parts``' order)."""
    block = getattr(layer, step.block)
    weight = getattr(block, step.module).weight
    if step.module == "qkv_proj":
        sizes: Sequence[int] = block.qkv_split
    elif step.module == "gate_up_proj":
        assert isinstance(block, LlamaMLP)
        sizes = (weight.shape[0] // 2,) * 2
    else:
        sizes = (weight.shape[0],)
    start = 0
    for part, size in zip(step.parts, sizes, strict=True):
        name = f"model.layers.{index}.{step.block}.{part}_proj.weight"
        rows = weight[start : start + size]
        rounded[name] = rounding(name, rows.float(), hessian)
        rows.copy_(rounded[name].dequantized().to(weight.dtype))
        start += size
