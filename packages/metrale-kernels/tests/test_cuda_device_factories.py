"""The CUDA backend's Python side names the device of every tensor it makes: no CPU run reaches
that code, so a ``torch.arange(n)`` made on the CPU beside CUDA tensors is found by reading it.
(The model code and the reference ops are checked by running them with the default device
``meta``: ``metrale_testing.device_scan``.)"""

from __future__ import annotations

import ast
from pathlib import Path

import metrale_kernels.cuda

# torch's factories that take ``device``; ``*_like`` and ``Tensor.new_*`` follow their input.
FACTORIES = frozenset(
    {"arange", "empty", "empty_strided", "eye", "full", "linspace", "ones", "rand", "randint",
     "randn", "randperm", "tensor", "as_tensor", "zeros"}
)  # fmt: skip
CUDA_PACKAGE = Path(next(iter(metrale_kernels.cuda.__path__)))


def factories_without_device(source: str) -> list[int]:
    """Lines of ``source`` calling ``torch.<factory>(...)`` with no ``device=`` (a ``**kwargs``
    call counts as naming it)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        called = node.func
        is_torch = isinstance(called.value, ast.Name) and called.value.id == "torch"
        if is_torch and called.attr in FACTORIES:
            names = {keyword.arg for keyword in node.keywords}
            if "device" not in names and None not in names:
                lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_factory_without_a_device() -> None:
    source = (
        "import torch\n"
        "a = torch.arange(4, device=x.device)\n"
        "b = torch.arange(4)\n"
        "c = torch.zeros_like(x)\n"
        "d = torch.empty(3, **options)\n"
        "e = torch.tensor([1], dtype=torch.int64)\n"
    )
    assert factories_without_device(source) == [3, 6]


def test_every_cuda_module_names_its_devices() -> None:
    modules = sorted(CUDA_PACKAGE.rglob("*.py"))
    assert len(modules) > 10
    found = {
        str(path.relative_to(CUDA_PACKAGE)): lines
        for path in modules
        if (lines := factories_without_device(path.read_text()))
    }
    assert found == {}
