"""A product whose input columns are split over ranks gives the single-process product: int8
bit for bit (whole-row scales, int32 sums added), q4 up to the order of its float sums. Two
ranks are two threads here, reducing through a barrier, as a process group would."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from metrale_kernels import ColumnSplit, dequantize_q4, quantize_per_row, quantize_q4
from metrale_kernels.backend import TorchBackend
from metrale_kernels.cpu.backend import CpuBackend
from metrale_kernels.cpu.native import NativeOps
from metrale_kernels.reference.int8_matmul import int8_linear, two_digit_rows
from metrale_kernels.reference.q4_matmul import q4_linear


class ThreadSplit:
    """One rank's end of an in-process group: each reduction waits for every rank's tensor."""

    def __init__(self, rank: int, slots: list[torch.Tensor | None], barrier: threading.Barrier):
        self.rank, self.slots, self.barrier = rank, slots, barrier

    def _reduce(self, tensor: torch.Tensor, combine: Callable[..., torch.Tensor]) -> None:
        self.slots[self.rank] = tensor.clone()
        self.barrier.wait()
        parts = [part for part in self.slots if part is not None]
        result = parts[0]
        for part in parts[1:]:
            result = combine(result, part)
        self.barrier.wait()  # every rank has read the slots before any writes the next ones
        tensor.copy_(result)

    def max_(self, tensor: torch.Tensor) -> None:
        self._reduce(tensor, torch.maximum)

    def sum_(self, tensor: torch.Tensor) -> None:
        self._reduce(tensor, torch.add)


def run_split(ranks: int, work: Callable[[int, ColumnSplit], torch.Tensor]) -> list[torch.Tensor]:
    """``work(rank, split)`` on ``ranks`` threads at once; each rank's result."""
    slots: list[torch.Tensor | None] = [None] * ranks
    barrier = threading.Barrier(ranks, timeout=30)
    results: list[torch.Tensor | None] = [None] * ranks
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = work(rank, ThreadSplit(rank, slots, barrier))
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=target, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [result for result in results if result is not None]


def columns(tensor: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    width = tensor.shape[-1] // ranks
    return tensor[..., rank * width : (rank + 1) * width].contiguous()


def outlier_rows(tokens: int, cols: int, seed: int) -> torch.Tensor:
    """Activations whose largest value sits in one rank's columns only, so a rank's own
    ``max|x|`` is not the row's."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, cols, generator=generator)
    x[:, 3] *= 40.0
    return x


@pytest.mark.parametrize("backend", [TorchBackend(), CpuBackend()], ids=["torch", "cpu"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_a_split_int8_product_is_the_whole_one_bit_for_bit(
    backend: TorchBackend, ranks: int, native_ops: NativeOps
) -> None:
    del native_ops  # built: the cpu backend's int8_mm multiplies the digits
    backend.prepare()
    assert not isinstance(backend, CpuBackend) or backend.native is not None
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 128, generator=generator)
    weight[:, 100] *= 30.0  # a weight row's largest value in the last rank's columns
    x = outlier_rows(5, 128, seed=2)
    bias = torch.randn(48, generator=generator)
    qweight, scale = quantize_per_row(weight)
    whole = backend.int8_linear(x, qweight, scale, bias)

    def rank_product(rank: int, split: ColumnSplit) -> torch.Tensor:
        q, s = quantize_per_row(columns(weight, rank, ranks), split=split)
        return backend.int8_linear(columns(x, rank, ranks), q, s, bias, split=split)

    for result in run_split(ranks, rank_product):
        assert torch.equal(result, whole)


def test_each_ranks_own_scales_would_not_be_the_whole_product() -> None:
    """What the whole-row scales fix: a rank quantizing by its own columns' ``max|x|``."""
    weight, x = torch.randn(16, 64), outlier_rows(3, 64, seed=3)
    whole = int8_linear(x, *quantize_per_row(weight))
    apart = sum(
        int8_linear(columns(x, rank, 2), *quantize_per_row(columns(weight, rank, 2)))
        for rank in range(2)
    )
    assert not torch.equal(apart, whole)


def test_a_split_q4_product_is_the_whole_one_up_to_float_sums() -> None:
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(32, 128, generator=generator)
    x = outlier_rows(6, 128, seed=5)
    bias = torch.randn(32, generator=generator)
    whole = q4_linear(x, *quantize_q4(weight), bias)

    def rank_product(rank: int, split: ColumnSplit) -> torch.Tensor:
        packed, scales = quantize_q4(columns(weight, rank, 2))
        return q4_linear(columns(x, rank, 2), packed, scales, bias, split=split)

    for result in run_split(2, rank_product):
        torch.testing.assert_close(result, whole, rtol=1e-6, atol=1e-5)


def test_the_native_q4_mm_writes_digits_over_the_amax_it_is_given(native_ops: NativeOps) -> None:
    """``row_amax`` is each row's ``max|x|`` over all ranks: the digits, so the product, are the
    reference's for that scale (and a row's own ``max|x|`` gives the plain product's bits)."""
    del native_ops
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(32, 64, generator=generator)
    packed, scales = quantize_q4(weight)
    x = torch.randn(4, 64, generator=generator)
    own = x.abs().amax(dim=-1)
    plain = torch.ops.metrale.q4_mm(x, packed, scales, None)
    assert torch.equal(torch.ops.metrale.q4_mm(x, packed, scales, None, own), plain)
    wider = own * torch.tensor([1.0, 3.0, 7.5, 1.25])
    digits, x_scale = two_digit_rows(x, wider)
    first, second = digits[:4].float(), digits[4:].float()
    x_hat = (second / 254 + first) * x_scale.unsqueeze(-1)
    expected = x_hat @ dequantize_q4(packed, scales).t()
    got = torch.ops.metrale.q4_mm(x, packed, scales, None, wider)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, plain)
