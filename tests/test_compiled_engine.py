"""An engine that compiles its layer steps in the background: it serves eagerly while the
compile runs, swaps the compiled steps in when done, and decodes what the eager engine does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_kernels.cpu.native import load_native_ops_if_possible
from metrale_server import LLM, SamplingParams

# torch.compile imports modules that warn of their own deprecations.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

MAX_SEQ_LEN = 128
PROMPTS = [{"prompt_token_ids": ids} for ids in ([5, 6, 7, 8, 9], [300, 12], [77] * 20)]


def greedy(llm: LLM) -> list[tuple[int, ...]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return [tuple(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_background_compile_swaps_in_and_decodes_as_eager(
    tiny_model_factory: Callable[[int], Path], quantization: str
) -> None:
    model = str(tiny_model_factory(MAX_SEQ_LEN))
    # The reference ops: with the cpu backend's native ops an int8 model runs native segments.
    common = {
        "model": model,
        "device": "cpu",
        "quantization": quantization,
        "kernel_backend": "torch",
    }
    eager = LLM(**common, enforce_eager=True)
    assert eager.engine.core.compiler is None
    compiling = LLM(**common, enforce_eager=False)
    compiler = compiling.engine.core.compiler
    assert compiler is not None
    assert greedy(compiling) == greedy(eager)  # served while (or after) compiling
    assert compiler.wait(timeout=600), compiler.error
    assert compiler.seconds is not None
    assert compiling.engine.loaded.model.executor_name == "compiled"
    assert greedy(compiling) == greedy(eager)


def test_the_native_segments_decode_as_the_reference_ops(
    tiny_model_factory: Callable[[int], Path],
) -> None:
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here")
    common = {
        "model": str(tiny_model_factory(MAX_SEQ_LEN)),
        "device": "cpu",
        "quantization": "int8",
    }
    reference = LLM(**common, kernel_backend="torch", enforce_eager=True)
    native = LLM(**common, enforce_eager=False)  # no flags: the cpu backend
    assert native.engine.loaded.model.executor_name == "native"
    assert native.engine.core.compiler is None  # nothing to compile or build
    assert greedy(native) == greedy(reference)
