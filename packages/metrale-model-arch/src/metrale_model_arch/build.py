"""Turn a config and a stream of checkpoint tensors into a ready model, without random init."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, cast

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import get_backend
from metrale_model_arch.allocator import TensorAllocator
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.fp8_layers import Fp8Linear, swap_in_fp8
from metrale_model_arch.families.int4_layers import order_q4_inputs
from metrale_model_arch.families.int8_layers import Int8Rows, swap_in_int8, tie_int8_heads
from metrale_model_arch.families.moe import StackedExperts
from metrale_model_arch.families.q4_layers import Q4Linear, swap_in_q4
from metrale_model_arch.families.row_invariant_layers import make_float_linears_row_invariant
from metrale_model_arch.fp8_rows import Fp8Rows
from metrale_model_arch.int4_format import has_input_order
from metrale_model_arch.load_options import DEFAULT_LOAD_OPTIONS, LoadOptions
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.owners import (
    MTP_PARAM_PREFIX,
    ROPE_TABLE,
    ROPE_TABLE_BUFFER,
    weight_owner,
)
from metrale_model_arch.parallel import (
    apply_tensor_parallel,
    apply_tensor_parallel_quantized,
    check_runs_split,
    shard_checkpoint,
    shard_config,
)
from metrale_model_arch.q4_1_blocks import Q4_1Blocks, dense
from metrale_model_arch.registry import architecture_for
from metrale_model_arch.weight_format import Quantization

__all__ = ["CheckpointError", "build_model", "column_major_names"]

# Checkpoints from older transformers versions carry the rotary buffer; it is derived here.
IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq",)
HEAD = "lm_head"  # stays int8 under q4: one matrix with the embeddings when tied
TIED_LM_HEAD = f"{HEAD}.weight"
_MAX_LISTED_NAMES = 20


# The initializers torch's layers call in ``reset_parameters``.
_INITIALIZERS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "trunc_normal_", "zeros_", "ones_", "constant_")  # fmt: skip


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """Layers built on the meta device skip their random init.

    NOTE: not only wasted work: on the meta device ``normal_`` goes through torch's Python
    reference ops, whose first use imports ``torch._dynamo`` (over a second of start-up).
    """

    def keep(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return tensor

    saved = {name: getattr(nn.init, name) for name in _INITIALIZERS}
    try:
        for name in _INITIALIZERS:
            setattr(nn.init, name, keep)
        yield
    finally:
        for name, initializer in saved.items():
            setattr(nn.init, name, initializer)


class _Coverage:
    """Which parts of one parameter were written: a mask over the leading dims the targets'
    indices address (deepened when a longer index arrives)."""

    def __init__(self, shape: torch.Size) -> None:
        self.shape = shape
        self.mask = torch.zeros((), dtype=torch.bool)

    def mark(self, index: tuple[int | slice, ...]) -> bool:
        """Mark ``index`` written; ``False`` when part of it already was."""
        depth = len(index)
        if depth > self.mask.dim():
            grown = self.mask.reshape(self.mask.shape + (1,) * (depth - self.mask.dim()))
            self.mask = grown.expand(tuple(self.shape[:depth])).clone()
        region = self.mask[index] if index else self.mask
        if bool(region.any()):
            return False
        if index:
            self.mask[index] = True
        else:
            self.mask.fill_(True)
        return True

    def missing_parts(self) -> list[str]:
        """``[]`` when complete; ``[""]`` when nothing was written; else the unwritten indices."""
        if bool(self.mask.all()):
            return []
        if not bool(self.mask.any()):
            return [""]
        return [str(tuple(int(i) for i in row)) for row in torch.nonzero(~self.mask)]


def build_model(
    config: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor | Q4_1Blocks | Fp8Rows]],
    options: LoadOptions = DEFAULT_LOAD_OPTIONS,
    *,
    mapping: CheckpointMapping | None = None,
    is_sharded: bool = False,
) -> CausalLM:
    """Construct ``config``'s family on the meta device and fill it from ``weights``.

    Every name below without a home is a field of ``options`` (:class:`LoadOptions`). Each
    checkpoint tensor goes where the architecture's checkpoint mapping (or ``mapping``) says:
    into ``param[index]``, converted to ``dtype`` (float32 for ``keep_float32``) on ``device``;
    a GGUF's Q4_1 blocks (``Q4_1Blocks``) go into a q4 projection as they are, anywhere else
    dequantized. Unmapped tensors, parameters (or parts of stacked ones) never
    written, tensors written twice and misshapen tensors raise :class:`CheckpointError` naming
    them. With ``tie_word_embeddings`` the head shares ``model.embed_tokens.weight`` and a
    ``lm_head.weight`` in ``weights`` is ignored. Each parameter's storage, and the derived
    tables (RoPE), come from ``allocator`` under their owner (``owners.weight_owner``). On the
    CPU, projection weights and stacked experts are stored column-major (see
    :func:`column_major_names`).
    With ``quantization`` ``int8``, the embeddings and the projections the architecture lists
    (``int8_linears``) are quantized per row as their tensors arrive
    (:mod:`~metrale_model_arch.families.int8_layers`); an architecture that lists none raises
    ``ValueError``. With ``q4``, the same projections but the head are 4-bit blocks
    (:mod:`~metrale_model_arch.families.q4_layers`), the embeddings and the head int8; a
    projection the blocks cannot tile (a rank's part of it, when split) raises ``ValueError``.
    With ``fp8``, the same projections but the head are float8_e4m3fn per output channel
    (:mod:`~metrale_model_arch.families.fp8_layers`), an fp8 checkpoint's rows
    (``Fp8Rows``) moved in as they are; the embeddings and the head stay in ``dtype``; one
    rank only (a split raises ``ValueError``).
    With a ``shard`` of a world over one rank, the model is that rank's part
    (:mod:`~metrale_model_arch.parallel`): built from ``shard_config``, with its collective
    layers swapped in (quantized ones too), from ``weights`` narrowed to the shard as they stream
    (or already narrowed, ``is_sharded``: a loader that read only the shard's slices). The
    model's ops run on ``kernel_backend`` (``metrale_kernels.get_backend``: ``auto``, ``torch``
    or ``cupy``). Returns the model in eval mode, no grads.
    """
    device, dtype, quantization = options.device, options.dtype, options.quantization
    shard, allocator, max_seq_len = options.shard, options.allocator, options.max_seq_len
    record = architecture_for(config)
    assert record.module is not None
    assert record.checkpoint_mapping is not None
    is_split = shard is not None and shard.world_size > 1
    rank_config = shard_config(config, shard.world_size) if shard is not None else config
    if is_split:
        assert shard is not None
        if quantization == Quantization.FP8:
            raise ValueError("--quantization fp8 runs on one rank, not split over several")
        check_runs_split(config, shard.world_size)
        if not is_sharded:
            # No Fp8Rows here: fp8 checkpoints are refused split (``quantized_checkpoint_error``).
            floats = cast("Iterable[tuple[str, torch.Tensor | Q4_1Blocks]]", weights)
            weights = shard_checkpoint(floats, config, shard)
    target_of = mapping or record.checkpoint_mapping(rank_config)
    with torch.device("meta"), _no_weight_init():
        model = record.module(
            rank_config,
            max_seq_len=max_seq_len,
            backend=get_backend(device, options.kernel_backend),
        )
        if is_split:
            assert shard is not None
            apply_tensor_parallel(model, shard)
        int8_rows: dict[str, Int8Rows | Q4Linear | Fp8Linear] = {}
        if quantization == Quantization.FP8:
            if not record.int8_linears:
                raise ValueError(
                    f"{config.model_type}: --quantization fp8 is not supported for this model "
                    "type yet; use quantization 'none'"
                )
            int8_rows.update(swap_in_fp8(model, record.int8_linears - {HEAD}, model.backend))
        elif quantization in (Quantization.INT8, Quantization.Q4):
            if not record.int8_linears:
                raise ValueError(
                    f"{config.model_type}: {quantization} weights are not supported for this "
                    "model type yet; use quantization 'none'"
                )
            if quantization == Quantization.Q4:
                q4_linears = swap_in_q4(model, record.int8_linears - {HEAD}, model.backend)
                if has_input_order(config):
                    q4_linears = order_q4_inputs(model, q4_linears)
                int8_rows.update(q4_linears)
            int8_rows.update(swap_in_int8(model, record.int8_linears, model.backend))
            if is_split:
                assert shard is not None
                apply_tensor_parallel_quantized(model, shard)
    aliases: dict[str, list[str]] = {}
    canonical: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(canonical.setdefault(id(param), name), []).append(name)
    meta_params = dict(model.named_parameters())
    column_major = column_major_names(model, dtype) if device.type == "cpu" else set()
    shapes: dict[str, torch.Size] = {name: param.shape for name, param in meta_params.items()}
    shapes.update((name, torch.Size(rows.logical_shape)) for name, rows in int8_rows.items())
    coverage = {name: _Coverage(shape) for name, shape in shapes.items()}
    loaded: dict[str, torch.Tensor] = {}
    allocated: set[str] = set()  # the quantized stand-ins' parameters
    seen: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in weights:
        if name.endswith(IGNORED_TENSOR_SUFFIXES) or (
            config.tie_word_embeddings and name == TIED_LM_HEAD
        ):
            continue
        if name in seen:
            raise CheckpointError(f"tensor {name!r} appears more than once in the checkpoint")
        seen.add(name)
        target = target_of(name, tuple(tensor.shape))
        if isinstance(target, Skip):
            continue
        if target is None or target.param not in shapes:
            unexpected.append(name)
            continue
        _check_shape(name, tensor, target, shapes[target.param])
        if not coverage[target.param].mark(target.index):
            raise CheckpointError(
                f"tensor {name!r} writes {_describe(target)}, which another tensor already wrote"
            )
        if (rows := int8_rows.get(target.param)) is not None:
            if target.param not in allocated:
                rows.allocate(allocator, weight_owner(target.param), device)
                allocated.add(target.param)
            _write_stand_in(rows, target.index, tensor)
            continue
        tensor = _dense(tensor)
        data = loaded.get(target.param)
        if data is None:
            data = _allocate(
                target.param,
                meta_params[target.param],
                target.param in column_major,
                allocator,
                torch.float32 if target.keep_float32 else dtype,
                device,
            )
            loaded[target.param] = data
            param = nn.Parameter(data, requires_grad=False)
            for alias in aliases[target.param]:
                module_name, _, leaf = alias.rpartition(".")
                setattr(model.get_submodule(module_name), leaf, param)
        (data[target.index] if target.index else data).copy_(tensor)
    missing = [
        name if parts == [""] else f"{name} (parts never written: {', '.join(parts[:8])})"
        for name, cover in coverage.items()
        if (parts := cover.missing_parts())
    ]
    if missing or unexpected:
        raise CheckpointError(_mismatch_message(config, sorted(missing), unexpected))
    tie_int8_heads(model)
    for name, buffer in list(model.named_buffers()):
        module_name, _, leaf = name.rpartition(".")
        if isinstance(model.get_submodule(module_name), (Int8Rows, Q4Linear, Fp8Linear)):
            continue  # allocated and filled while loading
        owner = ROPE_TABLE if leaf == ROPE_TABLE_BUFFER else weight_owner(name)
        table = allocator(owner, tuple(buffer.shape), buffer.dtype, device)
        table.copy_(buffer)
        model.get_submodule(module_name).register_buffer(leaf, table, persistent=False)
    if device.type == "cpu":
        make_float_linears_row_invariant(model, dtype)
    return model.eval()


def column_major_names(model: nn.Module, dtype: torch.dtype) -> set[str]:
    """Projection weights to keep as a transposed view of ``(in, out)`` storage, and stacked
    experts (:class:`~metrale_model_arch.families.moe.StackedExperts`) of ``(experts, in,
    out)`` storage.

    Same values, names and shapes; only the strides change. On CPU, a matrix-vector product
    streams such a weight ~15-40% faster (batch-1 decode is bound by reading weights), and
    wider batches run at the same speed; the CPU backend's ``fused_moe`` multiplies experts so
    stored natively, and its ``row_invariant_linear`` a float32 head. A weight shared with an
    embedding stays row-major (the embedding gathers its rows), except a float32 head tied to
    a plain ``nn.Embedding``: its decode step, 2.5x faster input-major, outweighs the gather
    of columns (a 2048-token prompt's: 18-80 ms instead of 1-4 ms, measured).
    """
    embedding_weights = {
        id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)
    }
    names: set[str] = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in embedding_weights:
            names.add(f"{module_name}.weight")
        elif isinstance(module, StackedExperts):
            names.update(f"{module_name}.{leaf}" for leaf in StackedExperts.WEIGHTS)
    head = getattr(model, "lm_head", None)
    if dtype == torch.float32 and type(head) is nn.Linear:
        tied = [
            f"{module_name}.weight"
            for module_name, module in model.named_modules()
            if type(module) is nn.Embedding and module.weight is head.weight
        ]
        names.update(tied and [*tied, "lm_head.weight"])
    return names


def _dense(tensor: torch.Tensor | Q4_1Blocks | Fp8Rows) -> torch.Tensor:
    return tensor.dequantize() if isinstance(tensor, Fp8Rows) else dense(tensor)


def _write_stand_in(
    rows: Int8Rows | Q4Linear | Fp8Linear,
    index: tuple[int | slice, ...],
    tensor: torch.Tensor | Q4_1Blocks | Fp8Rows,
) -> None:
    """A quantized stand-in's rows ``index`` from ``tensor``: its own format's blocks or rows
    as they are, anything else as floats."""
    if isinstance(rows, Fp8Linear):
        rows.write_rows(index, tensor if isinstance(tensor, Fp8Rows) else dense(tensor))
    elif isinstance(rows, Q4Linear):
        rows.write_rows(index, tensor if isinstance(tensor, Q4_1Blocks) else _dense(tensor))
    else:
        rows.write_rows(index, _dense(tensor))


def _check_shape(
    name: str,
    tensor: torch.Tensor | Q4_1Blocks | Fp8Rows,
    target: TensorTarget,
    shape: torch.Size,
) -> None:
    if len(target.index) > len(shape):
        raise CheckpointError(
            f"tensor {name!r} maps to {_describe(target)}, but {target.param!r} has only "
            f"{len(shape)} dims {tuple(shape)}"
        )
    meta = torch.empty(shape, device="meta")
    expected = (meta[target.index] if target.index else meta).shape
    if tensor.shape != expected:
        where = "the model expects" if not target.index else f"{_describe(target)} is"
        raise CheckpointError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, {where} {tuple(expected)}"
        )


def _describe(target: TensorTarget) -> str:
    if not target.index:
        return repr(target.param)
    parts = [
        f"{part.start or ''}:{'' if part.stop is None else part.stop}"
        if isinstance(part, slice)
        else str(part)
        for part in target.index
    ]
    return f"{target.param}[{', '.join(parts)}]"


def _allocate(
    name: str,
    meta: nn.Parameter,
    is_column_major: bool,
    allocator: TensorAllocator,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    shape = tuple(meta.shape)
    if is_column_major:
        stored = (*shape[:-2], shape[-1], shape[-2])
        return allocator(weight_owner(name), stored, dtype, device).transpose(-1, -2)
    return allocator(weight_owner(name), shape, dtype, device)


def _mismatch_message(config: ModelConfig, missing: list[str], unexpected: list[str]) -> str:
    parts = [f"checkpoint does not match the {config.model_type} model ({config.source})"]
    for label, names in (("missing", missing), ("unexpected", sorted(unexpected))):
        if names:
            listed = ", ".join(names[:_MAX_LISTED_NAMES])
            num_more = len(names) - _MAX_LISTED_NAMES
            more = f" and {num_more} more" if num_more > 0 else ""
            parts.append(f"{len(names)} {label} tensor(s): {listed}{more}")
    if config.mtp is not None and any(name.startswith(MTP_PARAM_PREFIX) for name in missing):
        parts.append(
            f"config.json declares num_nextn_predict_layers {config.mtp.num_layers} but the "
            "checkpoint lacks those MTP layers (a transformers save drops them): set "
            "num_nextn_predict_layers to 0 to serve without them"
        )
    return "; ".join(parts)
