"""The background thread prepares the kernel backend: on a first start (no cached native
build) the cpu backend's ops are built there, also under --enforce-eager, and the native layer
segments swapped in."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import load_native_ops_if_possible
from metrale_model_arch import LoadOptions, load_model
from metrale_model_arch.families.llama import EAGER_EXECUTOR, LlamaForCausalLM
from metrale_server.engine.layer_compiler import LayerCompiler


def test_enforce_eager_still_prepares_a_cold_cpu_backend(tiny_model_dir: Path) -> None:
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here")
    loaded = load_model(str(tiny_model_dir), LoadOptions(quantization="int8"))
    model = loaded.model
    assert isinstance(model, LlamaForCausalLM)
    # As on a machine with no cached build yet: the reference ops and the eager segments.
    model.install_executor(EAGER_EXECUTOR)
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
    assert model.executor_name == "native"
    compiler.wait(timeout=300)
    assert compiler.error is None
    assert cold.native is not None
    assert not cold.needs_prepare()
    assert "native int8_mm" in cold.describe()
    # The native one-call segments were swapped in once the ops were built.
    assert model.executor_name == "native"
    assert LayerCompiler.state(compiler, model) == "native"
    assert compiler.compiled


def test_nothing_starts_when_there_is_nothing_to_do(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), LoadOptions(kernel_backend="torch"))
    assert LayerCompiler.start_if_useful(loaded.model, enforce_eager=True) is None
