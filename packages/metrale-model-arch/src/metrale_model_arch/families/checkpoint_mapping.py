"""The per-family hook from checkpoint tensors to module parameters.

A :data:`CheckpointMapping` takes a checkpoint tensor's name and shape and says where it goes:
a :class:`TensorTarget` (copied into ``param[index]``: a rename, one expert of a stacked
``(experts, ...)`` parameter, one half of a fused gate/up projection), a :class:`Skip` (a tensor
knowingly ignored, with the reason) or ``None`` (unmapped: the loader names it in its error).
Both loaders use it: safetensors names directly, GGUF names after the family's llama.cpp
translation (:mod:`metrale_model_arch.families.gguf_names`).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from metrale_config import ModelConfig


@attrs.frozen
class TensorTarget:
    """Copy the checkpoint tensor into ``module_param[index]`` (its shape must equal that view's).

    ``keep_float32``: the parameter stays float32 whatever the serve dtype (routers, gates).
    """

    param: str
    index: tuple[int | slice, ...] = ()
    keep_float32: bool = False


@attrs.frozen
class Skip:
    """A checkpoint tensor knowingly not loaded (vision tower, an MTP layer), and why."""

    reason: str


CheckpointMapping = Callable[[str, tuple[int, ...]], TensorTarget | Skip | None]


def same_names(config: ModelConfig) -> CheckpointMapping:
    """Every checkpoint tensor goes to the parameter of the same name (the llama family)."""
    del config

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget:
        del shape
        return TensorTarget(name)

    return target
