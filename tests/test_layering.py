"""Each package imports only the layers DESIGN.md allows, and declares the siblings it imports."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "metrale-config": "metrale_config",
    "metrale-kernels": "metrale_kernels",
    "metrale-model-arch": "metrale_model_arch",
    "metrale-bench": "metrale_bench",
    "metrale-server": "metrale_server",
}
# DESIGN.md's "must not import" column.
FORBIDDEN = {
    "metrale-config": {
        "torch",
        "metrale_kernels",
        "metrale_model_arch",
        "metrale_bench",
        "metrale_server",
    },
    "metrale-kernels": {"metrale_config", "metrale_model_arch", "metrale_bench", "metrale_server"},
    "metrale-model-arch": {"metrale_server", "metrale_bench"},
    "metrale-bench": {"metrale_server", "torch", "metrale_model_arch", "metrale_kernels"},
    "metrale-server": set(),
}


def imported_top_levels(source_dir: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Top-level module name -> the files importing it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted(source_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(root)))
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_imports_only_allowed_layers(package: str) -> None:
    imports = imported_top_levels(ROOT / "packages" / package / "src")
    violations = {
        name: sorted(files) for name, files in imports.items() if name in FORBIDDEN[package]
    }
    assert not violations, f"{package} imports layers it must not: {violations}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_sibling_imports_are_declared_dependencies(package: str) -> None:
    imports = imported_top_levels(ROOT / "packages" / package / "src")
    pyproject = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    declared = {
        dep.split("~")[0].split("=")[0].split(">")[0].strip()
        for dep in pyproject["project"]["dependencies"]
    }
    own = PACKAGES[package]
    for sibling, module in PACKAGES.items():
        if module != own and module in imports:
            assert sibling in declared, f"{package} imports {module} but does not declare {sibling}"


def test_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import torch\nfrom metrale_server.cli.main import main\n")
    imports = imported_top_levels(tmp_path, root=tmp_path)
    assert imports["torch"] == {"bad.py"}
    assert imports["metrale_server"] == {"bad.py"}
