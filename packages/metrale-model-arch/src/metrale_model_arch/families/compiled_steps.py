"""The layer segments of a dense llama-family model, compiled by ``torch.compile`` (inductor).

Eager, a decode step at batch 1 is mostly dispatch: ~100 small ops per layer (norms, the int8
activation quantizer, rotary, SiLU, residuals), each a few microseconds of Python and dispatch
around little work. Inductor fuses the elementwise chains into C++ loops built by the machine's
compiler, leaving the matmuls to oneDNN. Paged attention stays eager between the segments.

One compiled graph per segment serves every layer (the layer's weights are its inputs), with a
dynamic token count (a separate graph for exactly one token, which inductor specializes), so a
batch of any size runs without recompiling. Compiled artifacts are cached on disk by inductor
(its FX graph cache), so a second start skips the C++ builds.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.fp8_layers import Fp8Linear
from metrale_model_arch.families.llama import (
    LayerExecutor,
    LlamaForCausalLM,
    OutputStep,
    QkvStep,
    layer_output,
    layer_qkv,
)

logger = logging.getLogger("metrale.compile")

# Token counts the warm-up runs: one (decode at batch 1), then a dynamic size.
WARM_UP_TOKENS = (1, 3)


def can_compile(model: CausalLM) -> bool:
    """Whether ``model`` has compilable layer segments (a dense llama-family model on CPU, its
    projections not fp8)."""
    # NOTE: fp8 projections stay eager: torch's CPU _scaled_mm converts the weight every call
    # (what a compiled graph cannot remove), and compiling them took 745 s on 2 cores.
    return (
        isinstance(model, LlamaForCausalLM)
        and model.has_dense_layers
        and model.model.cos_sin_cache.device.type == "cpu"
        and not any(isinstance(module, Fp8Linear) for module in model.modules())
    )


@functools.cache
def compiled_steps() -> tuple[QkvStep, OutputStep]:
    """The compiled segment functions, shared by every model in the process."""
    return (
        torch.compile(layer_qkv, dynamic=True),
        torch.compile(layer_output, dynamic=True),
    )


def compile_executor(model: LlamaForCausalLM) -> LayerExecutor:
    """The compiled executor, compiled and warmed on ``model``'s first layer (not installed).

    Warming runs each segment at every ``WARM_UP_TOKENS`` size on scratch inputs (nothing is
    written to the KV cache), under inference mode as the engine runs, so it may run on another
    thread while the model serves with its eager executor.
    """
    started = time.perf_counter()
    qkv_step, output_step = compiled_steps()
    layer = model.model.layers[0]
    config = model.config
    positions_table = model.model.cos_sin_cache
    weight = model.model.norm.weight
    for num_tokens in WARM_UP_TOKENS:
        # As the engine passes them: positions a view of a step buffer made outside inference
        # mode, activations made inside it (a guard tells the two kinds apart).
        positions = torch.zeros(num_tokens, dtype=torch.int64)
        with torch.inference_mode():
            hidden = torch.zeros(num_tokens, config.hidden_size, dtype=weight.dtype)
            q, _, _ = qkv_step(layer, hidden, positions, positions_table)  # type: ignore[arg-type]
            output_step(layer, hidden, torch.zeros_like(q))  # type: ignore[arg-type]
    logger.info("compiled layer segments ready in %.1f s", time.perf_counter() - started)
    return LayerExecutor("compiled", qkv_step, output_step)
