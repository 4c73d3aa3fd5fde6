"""The caches a step's layers read when sliding-window layers keep their K/V in rings.

A ringed layer's state tensors are ``(slots, ring_blocks * block_size, *row)``: viewed as
``(slots * ring_blocks, block_size, *row)`` they are a paged pool of their own, addressed by
the step's ring view of the attention metadata (``metadata.for_window``, which the engine
builds from each window's ``ring_blocks``: :func:`ring_windows`).
"""

from __future__ import annotations

from collections.abc import Sequence

from metrale_model_arch.cache_spec import LayerCacheSpec, SlidingWindowRingSpec
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.kv_cache import StateSlots
from metrale_model_arch.sliding_window_ring import ring_specs_of


def layer_caches_with_rings(
    pool: Sequence[LayerCache],
    states: StateSlots,
    specs: Sequence[LayerCacheSpec],
) -> tuple[LayerCache, ...]:
    """Each layer's cache as its attention reads it: the pool's (a ``KvCachePool``), or, for
    a layer in a ring, its ring tensors in ``states`` viewed as blocks."""
    return tuple(
        tuple(ring.view(-1, spec.block_size, *ring.shape[2:]) for ring in states[layer])
        if isinstance(spec, SlidingWindowRingSpec)
        else pool[layer]
        for layer, spec in enumerate(specs)
    )


def ring_windows(specs: Sequence[LayerCacheSpec]) -> dict[int, int]:
    """Each ringed sliding window -> its ring's blocks per slot."""
    return {spec.sliding_window: spec.ring_blocks for spec in ring_specs_of(specs)}
