"""``Architecture``: everything Metrale knows about one model type, in one record."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.cache_spec import LayerCacheSpec
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping
from metrale_model_arch.families.gguf_names import GgufNames


class CacheSpecs(Protocol):
    def __call__(
        self, config: ModelConfig, *, indexer_paged: bool
    ) -> tuple[LayerCacheSpec, ...]: ...


class Trait(enum.StrEnum):
    """What a model type's layers may hold beyond dense full attention (its configs say which
    layers do)."""

    SLIDING_WINDOW = "sliding window"
    MOE = "MoE"
    MLA = "MLA"
    LINEAR_STATE = "linear state"


@attrs.frozen(kw_only=True)
class Architecture:
    """One model type: how to run it, load it and plan its memory.

    ``module`` is ``None`` for a type that is planned but not yet runnable (its memory plan
    works, building it raises :class:`~metrale_model_arch.registry.UnsupportedModelError`);
    ``checkpoint_mapping`` is then ``None`` too. ``gguf_names`` is ``None`` for a type with no
    llama.cpp counterpart. ``param_counts`` counts exactly the parameters ``module`` builds (and
    those the mapping keeps in float32, in ``layers_fp32``); ``cache_specs`` gives one spec per
    layer, priced by the plan and allocated by the runner. ``skeleton`` is the stack's shape from
    the config alone, for types whose layers differ by more than ``layer_types`` says.
    ``int8_linears``: the attribute names of the linear layers int8 weights replace (with the
    embeddings); empty where the type has no int8 path. ``traits``: what its layers may hold
    (the README's supported-model table lists them).
    """

    model_type: str
    module: type[CausalLM] | None
    checkpoint_mapping: Callable[[ModelConfig], CheckpointMapping] | None
    gguf_names: GgufNames | None
    param_counts: Callable[[ModelConfig], ParamCounts]
    cache_specs: CacheSpecs
    skeleton: Callable[[ModelConfig], object] | None = None
    int8_linears: frozenset[str] = frozenset()
    traits: frozenset[Trait] = frozenset()
    # Whether its sliding-window layers may keep their K/V in a ring per sequence (their
    # attention reads ``metadata.for_window``): :mod:`metrale_model_arch.sliding_window_ring`.
    rings_sliding_window: bool = False

    @property
    def is_runnable(self) -> bool:
        return self.module is not None and self.checkpoint_mapping is not None
