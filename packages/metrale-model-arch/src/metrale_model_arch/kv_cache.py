"""Device caches allocated from the per-layer cache specs: the paged KV pool and state slots.

The allocations are exactly what the memory plan prices from the same specs: the pool's bytes
are ``num_blocks * block_size * kv_bytes_per_token`` (owner ``kv_pool``), each state pool's
bytes its slots times the specs' per-slot bytes (owners ``per_sequence_state``,
``linear_state_pool``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

import attrs
import torch

from metrale_config import ModelConfig
from metrale_kernels import compute_dtype
from metrale_model_arch.allocator import TensorAllocator, plain_allocator
from metrale_model_arch.cache_spec import LayerCacheSpec, PagedTensors, StateTensor, TensorDtype
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.kv_cache_dtype import KvCacheDtype
from metrale_model_arch.memory.kv_price import kv_bytes_per_token
from metrale_model_arch.owners import KV_POOL
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.sliding_window_ring import RingLayout

T = TypeVar("T")
_FIXED_DTYPES = {
    "float32": torch.float32,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


def _torch_dtype(dtype: TensorDtype, model_dtype: torch.dtype) -> torch.dtype:
    if dtype == "model":
        return model_dtype
    if dtype == "compute":
        return compute_dtype(model_dtype)
    return _FIXED_DTYPES[dtype]


def kv_cache_bytes_per_token(
    config: ModelConfig,
    dtype: torch.dtype,
    *,
    indexer_paged: bool = True,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
    ring: RingLayout | None = None,
) -> int:
    """Bytes one token occupies across all layers' paged caches (``memory.kv_bytes_per_token``)."""
    return kv_bytes_per_token(
        config,
        dtype.itemsize,
        indexer_paged=indexer_paged,
        kv_cache_dtype=kv_cache_dtype,
        ring=ring,
    )


@attrs.define(eq=False)
class KvCachePool(Sequence[LayerCache]):
    """The paged caches of every layer: ``pool[i]`` is layer ``i``'s :data:`LayerCache`.

    Layers with equal :class:`~metrale_model_arch.cache_spec.PagedTensors` share one zeroed
    allocation ``(roles, layers, num_blocks, block_size, *token_shape)``; each layer's tensors
    are contiguous views of it.
    """

    layers: tuple[LayerCache, ...]
    num_blocks: int
    block_size: int
    allocations: tuple[torch.Tensor, ...] = attrs.field(repr=False)

    @overload
    def __getitem__(self, index: int) -> LayerCache: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[LayerCache, ...]: ...

    def __getitem__(self, index: int | slice) -> LayerCache | tuple[LayerCache, ...]:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[LayerCache]:
        return iter(self.layers)

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy blocks ``src[i]`` to ``dst[i]`` in every paged tensor (copy-on-write)."""
        for allocation in self.allocations:
            raw = allocation.view(torch.uint8)  # as bytes: torch cannot index-assign fp8
            raw[:, :, dst] = raw[:, :, src]

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.allocations)


def allocate_kv_cache(
    config: ModelConfig,
    *,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    allocator: TensorAllocator = plain_allocator,
    indexer_paged: bool = True,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
    ring: RingLayout | None = None,
) -> KvCachePool:
    """The KV pool of ``config``'s cache specs, from ``allocator`` under owner ``kv_pool``.

    For full and sliding attention each layer is ``(k_cache, v_cache)``, each ``(num_blocks,
    block_size, kv_heads, head_dim)`` (quantized, ``kv_cache_dtype``: one byte a value,
    ``head_dim + 2`` a row with its scale); MLA layers hold ``(latent,)`` of ``(num_blocks,
    block_size, latent_dim)``, paged DSA layers add ``index_keys`` (float32). With ``ring``, a
    sliding-window layer held in a ring per sequence has nothing here (``()``; its ring is
    state: ``allocate_state_slots``).

    NOTE: not zeroed. The attention ops never read a slot that was not written (their
    contract), and an untouched allocation stays out of resident memory until the cache
    fills, so a large pool costs a laptop nothing while it is empty.
    """
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
    specs = cache_specs(
        config, indexer_paged=indexer_paged, kv_cache_dtype=kv_cache_dtype, ring=ring
    )
    groups = _group_layers([spec.paged() for spec in specs])
    device = torch.device(device)
    views: dict[tuple[PagedTensors, int], LayerCache] = {}
    allocations = []
    for tensors, layer_indices in groups.items():
        shape = (len(tensors.roles), len(layer_indices), num_blocks, block_size)
        allocation = allocator(
            KV_POOL, shape + tensors.token_shape, _torch_dtype(tensors.dtype, dtype), device
        )
        allocations.append(allocation)
        for position, layer in enumerate(layer_indices):
            views[tensors, layer] = tuple(
                allocation[r, position] for r in range(len(tensors.roles))
            )
    layers = tuple(
        tuple(view for tensors in spec.paged() for view in views[tensors, layer])
        for layer, spec in enumerate(specs)
    )
    return KvCachePool(
        layers=layers, num_blocks=num_blocks, block_size=block_size, allocations=tuple(allocations)
    )


def allocate_layer_cache(
    spec: LayerCacheSpec,
    *,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    owner: str,
    allocator: TensorAllocator = plain_allocator,
) -> KvCachePool:
    """A one-layer paged pool of ``spec`` under ``owner`` (a speculative MTP layer's, in the
    draft pool): ``spec.paged_bytes_per_token`` per token, laid out as ``allocate_kv_cache``
    lays out each layer."""
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
    allocations = tuple(
        allocator(
            owner,
            (len(tensors.roles), 1, num_blocks, block_size, *tensors.token_shape),
            _torch_dtype(tensors.dtype, dtype),
            torch.device(device),
        )
        for tensors in spec.paged()
    )
    layer = tuple(a[r, 0] for a in allocations for r in range(a.shape[0]))
    return KvCachePool(
        layers=(layer,), num_blocks=num_blocks, block_size=block_size, allocations=allocations
    )


@attrs.define(eq=False)
class StateSlots:
    """Per-sequence state of every layer: ``slots[i]`` is layer ``i``'s tensors, each
    ``(slots, *shape)`` indexed by slot (``()`` for a layer without state).

    Pools with a dummy slot (linear attention) hold it at index ``num_slots``.
    """

    layers: tuple[tuple[torch.Tensor, ...], ...]
    num_slots: int
    allocations: tuple[torch.Tensor, ...] = attrs.field(repr=False)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, ...]:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    def reset(self, slot: int) -> None:
        """Zero slot ``slot`` of every state tensor (a new sequence starts from zero state)."""
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} is outside 0..{self.num_slots - 1}")
        for allocation in self.allocations:
            allocation[:, :, slot].zero_()

    def copy(self, src: int, dst: int) -> None:
        """Slot ``dst`` of every state tensor becomes slot ``src``'s (a forked sequence goes on
        from its parent's state)."""
        for slot in (src, dst):
            if not 0 <= slot < self.num_slots:
                raise IndexError(f"slot {slot} is outside 0..{self.num_slots - 1}")
        for allocation in self.allocations:
            allocation[:, :, dst] = allocation[:, :, src]


def allocate_state_slots(
    config: ModelConfig,
    *,
    num_slots: int,
    max_seq_len: int,
    dtype: torch.dtype,
    device: torch.device | str,
    allocator: TensorAllocator = plain_allocator,
    indexer_paged: bool = True,
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
    ring: RingLayout | None = None,
) -> StateSlots:
    """The per-sequence state of ``config``'s cache specs for ``num_slots`` sequences.

    Each pool is allocated from ``allocator`` under its owner (``linear_state_pool`` with one
    more dummy slot, ``per_sequence_state`` for a flat DSA indexer of ``max_seq_len`` tokens,
    ``sliding_window_kv`` for the K/V rings of sliding-window layers with ``ring``), zeroed. A
    model without per-sequence state allocates nothing.
    """
    if num_slots <= 0:
        raise ValueError(f"num_slots ({num_slots}) must be > 0")
    specs: Sequence[LayerCacheSpec] = cache_specs(
        config, indexer_paged=indexer_paged, kv_cache_dtype=kv_cache_dtype, ring=ring
    )
    groups = _group_layers([spec.state(max_seq_len) for spec in specs])
    device = torch.device(device)
    views: dict[tuple[StateTensor, int], torch.Tensor] = {}
    allocations = []
    for tensor, layer_indices in groups.items():
        shape = (1, len(layer_indices), num_slots + tensor.num_dummy_slots, *tensor.shape)
        allocation = allocator(
            tensor.owner, shape, _torch_dtype(tensor.dtype, dtype), device
        ).zero_()
        allocations.append(allocation)
        for position, layer in enumerate(layer_indices):
            views[tensor, layer] = allocation[0, position]
    layers = tuple(
        tuple(views[tensor, layer] for tensor in spec.state(max_seq_len))
        for layer, spec in enumerate(specs)
    )
    return StateSlots(layers=layers, num_slots=num_slots, allocations=tuple(allocations))


def _group_layers(per_layer: Sequence[tuple[T, ...]]) -> dict[T, list[int]]:
    """Each distinct item -> the layers that hold it, in layer order."""
    groups: dict[T, list[int]] = {}
    for layer, items in enumerate(per_layer):
        for item in items:
            groups.setdefault(item, []).append(layer)
    return groups
