"""Each instruction-set path of the native ops this CPU can run (float32 and quantized K/V
caches), built on purpose: the machine
picks one at build time (-march=native), so the AVX2 and plain-C paths of an AVX-512 machine
would otherwise never be compiled or checked here. Each build runs in its own process (one
process holds one ``metrale`` op library) against the reference ops."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metrale_kernels import cpu_features
from metrale_kernels.cpu.native import load_native_ops

CHECK = r"""
import itertools
import os
import torch
from metrale_kernels.testing.native_layers import check_layer_ops
from metrale_kernels import TorchBackend
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import load_native_ops
from metrale_kernels.testing.paged_batches import paged_batch
from metrale_kernels.reference.q4_matmul import dequantize_q4, q4_linear, quantize_q4

ops = load_native_ops()
print(ops.int8_path, ops.q4_path, torch.ops.metrale.q4_mm_path(),
      torch.ops.metrale.input_major_mm_path())
generator = torch.Generator().manual_seed(0)
for rows, n, k in [(1, 7, 5), (2, 33, 100), (8, 64, 576), (3, 5, 1536), (67, 40, 200)]:
    a = torch.randint(-127, 128, (rows, k), generator=generator, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    want = (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.int32)
    assert torch.equal(torch.ops.metrale.int8_mm(a, w), want), (rows, n, k)
# q4_mm: the reference's product (float32 summation order aside), each row on its own.
for rows, n, k in [(1, 16, 32), (5, 48, 96), (9, 32, 576), (64, 16, 1536)]:
    w = torch.randn(n, k, generator=generator) * 0.05 + 0.1
    packed, scales = quantize_q4(w)
    x = torch.randn(rows, k, generator=generator)
    x[rows // 2] = 0  # a zero row gives the bias
    bias = torch.randn(n, generator=generator)
    scale = float((x.abs() @ dequantize_q4(packed, scales).abs().T).amax())
    for b in (None, bias):
        got = torch.ops.metrale.q4_mm(x, packed, scales, b)
        torch.testing.assert_close(got, q4_linear(x, packed, scales, b), rtol=1e-5,
                                   atol=1e-5 * scale, msg=lambda m: f"{(rows, n, k)}: {m}")
        for i in range(rows):
            alone = torch.ops.metrale.q4_mm(x[i : i + 1], packed, scales, b)
            assert torch.equal(alone[0], got[i]), (rows, n, k, i)
    assert torch.equal(got[rows // 2], bias), (rows, n, k)
# input_major_mm: x @ w (+ bias), each row on its own, few rows (streamed) and many (tiles).
for rows, k, n in [(1, 64, 130), (7, 96, 64), (40, 64, 200)]:
    x = torch.randn(rows, k, generator=generator)
    w = torch.randn(k, n, generator=generator)
    bias = torch.randn(n, generator=generator)
    got = torch.ops.metrale.input_major_mm(x, w, bias)
    torch.testing.assert_close(got, x @ w + bias, rtol=1e-5, atol=1e-4)
    for i in range(rows):
        alone = torch.ops.metrale.input_major_mm(x[i : i + 1], w, bias)
        assert torch.equal(alone[0], got[i]), (rows, k, n, i)
# input_major_mm over blocks of K: the test compares these bits with its own build's.
cases = torch.load(os.environ["INPUT_MAJOR_CASES"])
torch.save([torch.ops.metrale.input_major_mm(*case) for case in cases],
           os.environ["INPUT_MAJOR_OUTPUTS"])
cpu = CpuBackend()
kv_dtypes = (torch.float32, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
for window, kv_dtype in itertools.product((None, 5), kv_dtypes):
    batch = paged_batch(seq_lens=[1, 30, 77, 9], query_lens=[1, 1, 1, 4], num_heads=6,
                        num_kv_heads=2, head_dim=40, dtype=torch.float32,
                        device=torch.device("cpu"), block_size=8, kv_dtype=kv_dtype)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.metadata, 0.3, window)
    torch.testing.assert_close(cpu.paged_attention(*args), TorchBackend().paged_attention(*args),
                               rtol=1e-5, atol=1e-5)
for kv_dtype in kv_dtypes:
    check_layer_ops(cpu, 0, kv_dtype)
"""

# (-march, the int8 and q4 paths it builds, the CPU flags it needs)
PATHS = [("haswell", "avx2", {"avx2", "fma", "f16c"}), ("x86-64", "scalar", set())]


@pytest.mark.parametrize(("march", "path", "needs"), PATHS)
def test_an_instruction_set_path_matches_the_reference(
    tmp_path: Path, march: str, path: str, needs: set[str]
) -> None:
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("needs a C++ compiler")
    if not needs <= cpu_features().flags or cpu_features().machine != "x86_64":
        pytest.skip(f"this CPU cannot run the {path} path")
    cases = input_major_cases()
    torch.save(cases, tmp_path / "cases.pt")
    env = {
        **os.environ,
        "METRALE_NATIVE_MARCH": march,
        "XDG_CACHE_HOME": str(tmp_path),
        "INPUT_MAJOR_CASES": str(tmp_path / "cases.pt"),
        "INPUT_MAJOR_OUTPUTS": str(tmp_path / "outputs.pt"),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    int8_path, q4_path, q4_mm_path, input_major_path = done.stdout.split()[:4]
    assert int8_path == path
    assert q4_path == path
    assert q4_mm_path == path
    assert input_major_path == path
    # Every instruction set sums each output in the same order: the same bits as this
    # machine's own build (AVX-512 tiles over blocks of K, where it has them).
    load_native_ops()
    for case, theirs in zip(cases, torch.load(tmp_path / "outputs.pt"), strict=True):
        assert torch.equal(torch.ops.metrale.input_major_mm(*case), theirs), case[0].shape


def input_major_cases() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(x, w, bias) past one block of K, with a last tile of fewer than 64 columns."""
    generator = torch.Generator().manual_seed(0)
    cases: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    for rows, k, n in [(7, 3000, 200), (16, 3000, 130), (129, 4500, 70), (300, 3000, 70)]:
        x = torch.randn(rows, k, generator=generator)
        w = torch.randn(k, n, generator=generator)
        cases.append((x, w, torch.randn(n, generator=generator) if rows % 2 else None))
    return cases
