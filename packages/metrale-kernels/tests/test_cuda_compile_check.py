"""Every kernel source compiles for sm_80 and sm_90 with each compiler found here, and a
broken source is reported (these compile; they never run a kernel)."""

from __future__ import annotations

import pytest

from metrale_kernels.cuda.compile_check import (
    ARCHS,
    Compile,
    check_source,
    check_sources,
    find_compiler,
)
from metrale_kernels.cuda.sources import (
    DTYPE_SUFFIXES,
    KERNEL_SOURCES,
    KV_FORMAT_SUFFIXES,
    KernelSource,
    source_code,
)

COMPILERS = [name for name in ("nvrtc", "nvcc") if find_compiler((name,)) is not None]
pytestmark = pytest.mark.skipif(
    not COMPILERS, reason="neither NVRTC (cupy + nvidia-cuda-nvrtc) nor nvcc is available"
)


@pytest.fixture(params=COMPILERS)
def compiler(request: pytest.FixtureRequest) -> tuple[str, Compile]:
    found = find_compiler((request.param,))
    assert found is not None
    return found


def test_every_source_compiles_for_each_arch(compiler: tuple[str, Compile]) -> None:
    results = check_sources(compiler)
    assert [(r.source, r.arch) for r in results] == [
        (source.name, arch) for source in KERNEL_SOURCES for arch in ARCHS
    ]
    failed = [r.line() for r in results if not r.is_ok]
    assert not failed, "\n".join(failed)


def test_a_syntax_error_is_reported_with_the_log(compiler: tuple[str, Compile]) -> None:
    source = KernelSource(name="broken", functions=("broken_f32",))
    code = 'extern "C" __global__ void broken_f32(float* x) { x[0] = undefined_name; }'
    result = check_source(source, code, "sm_80", compiler)
    assert not result.is_ok
    assert result.error is not None
    assert "undefined_name" in result.error
    assert "error" in result.line()


def test_a_kernel_missing_from_the_source_is_reported(compiler: tuple[str, Compile]) -> None:
    norms = next(source for source in KERNEL_SOURCES if source.name == "norms")
    expecting_more = KernelSource(name="norms", functions=(*norms.functions, "rms_norm_f64"))
    result = check_source(expecting_more, source_code(norms), "sm_90", compiler)
    assert result.error == "kernels missing from the PTX: rms_norm_f64"


def test_every_source_file_is_shipped() -> None:
    for source in KERNEL_SOURCES:
        code = source_code(source)
        for function in source.functions:
            base = function.rsplit("_", 1)[0]
            if base.endswith(tuple(f"_{kv}" for kv in KV_FORMAT_SUFFIXES)):
                base = f"{base.rsplit('_', 1)[0]}_##KV##_##SUFFIX"
            assert base in code


def test_the_quantized_cache_variants_are_compiled() -> None:
    # Every kernel listed is compiled and looked for in the PTX (above): the quantized cache
    # variants are listed, one per format and float dtype.
    functions = {function for source in KERNEL_SOURCES for function in source.functions}
    for base in ("write_kv", "paged_attention_partial"):
        for kv in KV_FORMAT_SUFFIXES:
            for suffix in DTYPE_SUFFIXES:
                assert f"{base}_{kv}_{suffix}" in functions
    assert {"i8", "e4m3", "e5m2"} == set(KV_FORMAT_SUFFIXES)
