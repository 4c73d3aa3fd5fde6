"""Tests marked ``gpu`` run only where torch sees a CUDA device; elsewhere they are skipped."""

from __future__ import annotations

import pytest
import torch


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False")
