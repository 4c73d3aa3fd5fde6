"""glibc's malloc keeps a step's freed activations mapped once the thresholds are set."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Steps as a prefill's: 12-24 MiB activations alive together, freed at the step's end; prints
# whether the thresholds hold, then the minor page faults of five more steps.
_STEPS = """
import resource
import torch
from metrale_kernels.cpu.host_allocator import retain_step_memory

print(retain_step_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
sizes = [6 << 20, 5 << 20, 6 << 20, 3 << 20]  # floats: 24, 20, 24, 12 MiB
def step():
    return [torch.ones(size) for size in sizes]
step()
before = faults()
for _ in range(5):
    step()
print(faults() - before)
"""


def _run(env: dict[str, str]) -> tuple[bool, int]:
    result = subprocess.run(
        [sys.executable, "-c", _STEPS], capture_output=True, text=True, env=env, check=True
    )
    applied, faults = result.stdout.split()
    return applied == "True", int(faults)


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return {**env, **extra}


def test_freed_step_memory_is_reused_without_page_faults() -> None:
    applied, faults = _run(_environment())
    assert applied
    # Five steps of 80 MiB are 102,400 pages: glibc's defaults fault in ~78,000 of them again
    # (the heap's top trimmed after every step); kept mapped, 1,000-6,000 (a block placed
    # anew now and then).
    assert faults < 102_400 // 4


def test_the_users_malloc_settings_are_kept() -> None:
    applied, _ = _run(_environment(MALLOC_TRIM_THRESHOLD_="131072"))
    assert not applied
