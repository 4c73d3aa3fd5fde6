"""The background thread prepares the kernel backend: on a first start (no cached native
build) the cpu backend's ops are built there, also under --enforce-eager, and the native layer
segments swapped in."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_kernels.cpu_backend import CpuBackend
from metrale_kernels.native import load_native_ops_if_possible
from metrale_model_arch import load_model
from metrale_model_arch.families.llama import LlamaForCausalLM, layer_output, layer_qkv
from metrale_model_arch.families.native_steps import uses_native_steps
from metrale_server.engine.layer_compiler import LayerCompiler


def test_enforce_eager_still_prepares_a_cold_cpu_backend(tiny_model_dir: Path) -> None:
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here")
    loaded = load_model(str(tiny_model_dir), quantization="int8")
    model = loaded.model
    assert isinstance(model, LlamaForCausalLM)
    # As on a machine with no cached build yet: the reference ops and the eager segments.
    model.layer_steps, model.decode_layer_step = (layer_qkv, layer_output), None
    cold = CpuBackend()
    cold.native = None
    model.backend = cold
    for module in model.modules():
        if hasattr(module, "backend"):
            module.backend = cold
    assert cold.needs_prepare()
    compiler = LayerCompiler.start_if_useful(model, enforce_eager=True)
    assert compiler is not None
    assert compiler.builds_kernels
    # What met serve waits for before it says ready: the ops built, the native steps in.
    assert compiler.prepared.wait(timeout=300)
    assert cold.native is not None
    assert uses_native_steps(model)
    compiler.wait(timeout=300)
    assert compiler.error is None
    assert cold.native is not None
    assert not cold.needs_prepare()
    assert "native int8_mm" in cold.describe()
    # The native one-call segments were swapped in once the ops were built.
    assert uses_native_steps(model)
    assert LayerCompiler.state(compiler, model) == "native"
    assert compiler.compiled


def test_nothing_starts_when_there_is_nothing_to_do(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), kernel_backend="torch")
    assert LayerCompiler.start_if_useful(loaded.model, enforce_eager=True) is None
