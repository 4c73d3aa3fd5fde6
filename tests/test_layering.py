"""Each package imports only the layers DESIGN.md allows, declares the siblings and the
third-party distributions it imports, and has no import cycle among its own modules."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
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


# Imports a package makes of what only a declared dependency brings (each with why it is safe);
# a new entry wants a reason as good, or the dependency declared.
TRANSITIVE_IMPORTS: dict[str, set[str]] = {}


def _distribution(requirement: str) -> tuple[str, list[str]]:
    """A requirement's normalized distribution name, and the extras it asks for."""
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert match is not None, requirement
    extras = [extra.strip() for extra in (match[2] or "").split(",") if extra.strip()]
    return re.sub(r"[-_.]+", "-", match[1]).lower(), extras


def declared_distributions(package: str) -> set[str]:
    """The distributions ``package`` declares: required, in any extra, and in the extras of
    siblings it asks for (``metrale-model-arch[hub]``)."""
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    project = project["project"]
    requirements = [*project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    declared: set[str] = set()
    for requirement in requirements:
        name, extras = _distribution(requirement)
        declared.add(name)
        if name in PACKAGES and extras:
            sibling = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
            for extra in extras:
                for nested in sibling["project"]["optional-dependencies"][extra]:
                    declared.add(_distribution(nested)[0])
    return declared


def undeclared_imports(
    imports: dict[str, set[str]],
    own_module: str,
    declared: set[str],
    providers: dict[str, list[str]],
) -> dict[str, list[str]]:
    """Top-level modules imported that are neither the standard library, the package itself,
    nor provided by a declared distribution (a module not installed here counts when a declared
    distribution is named after it: ``cupy`` for ``cupy-cuda12x``)."""
    bad: dict[str, list[str]] = {}
    for module, files in imports.items():
        if module in sys.stdlib_module_names or module in ("__future__", own_module):
            continue
        names = {_distribution(dist)[0] for dist in providers.get(module, [])}
        if not names:
            stem = _distribution(module)[0]
            names = {dist for dist in declared if dist == stem or dist.startswith(stem + "-")}
        if not names & declared:
            bad[module] = sorted(files)
    return bad


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_import_is_stdlib_or_a_declared_dependency(package: str) -> None:
    """What one test environment per package used to prove: the package runs with only what it
    declares (imports inside functions count too; ``metrale_testing`` is never declared)."""
    imports = imported_top_levels(ROOT / "packages" / package / "src")
    providers = importlib.metadata.packages_distributions()
    bad = undeclared_imports(imports, PACKAGES[package], declared_distributions(package), providers)
    for module in TRANSITIVE_IMPORTS.get(package, set()):
        bad.pop(module, None)
    assert not bad, f"{package} imports what its pyproject.toml does not declare: {bad}"


def test_undeclared_import_checker_sees_a_missing_dependency(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "import os, cupy, attrs\nimport metrale_testing\nfrom metrale_config import x\n"
    )
    imports = imported_top_levels(tmp_path, root=tmp_path)
    providers = {"attrs": ["attrs"], "metrale_config": ["metrale-config"]}
    declared = {"attrs", "cupy-cuda12x"}
    assert undeclared_imports(imports, "pkg", declared, providers) == {
        "metrale_testing": ["a.py"],
        "metrale_config": ["a.py"],
    }
    declared |= {"metrale-config"}
    assert set(undeclared_imports(imports, "pkg", declared, providers)) == {"metrale_testing"}


def test_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import torch\nfrom metrale_server.cli.main import main\n")
    imports = imported_top_levels(tmp_path, root=tmp_path)
    assert imports["torch"] == {"bad.py"}
    assert imports["metrale_server"] == {"bad.py"}


def module_names(source_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under a ``src`` directory."""
    modules: dict[str, Path] = {}
    for path in sorted(source_dir.rglob("*.py")):
        parts = path.relative_to(source_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(statements: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not in functions, not ``if TYPE_CHECKING``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in statements:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += module_level_imports(node.body)
            found += module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                found += module_level_imports(block)
            for handler in node.handlers:
                found += module_level_imports(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            found += module_level_imports(node.body)
    return found


def every_import(statements: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Every import, those in functions included (a cycle they hide is a cycle still); only
    ``if TYPE_CHECKING`` blocks, which never run, are left out."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in statements:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            found += every_import(node.orelse)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    found += every_import([child])
                elif isinstance(child, ast.ExceptHandler):
                    found += every_import(child.body)
    return found


def import_graph(source_dir: Path, *, deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the same source tree it imports at module level (with
    ``deferred``, in functions too).

    ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``;
    relative imports are resolved against the importing module's package.
    """
    modules = module_names(source_dir)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in (every_import if deferred else module_level_imports)(tree.body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None`` when the graph has none."""
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(module: str) -> list[str] | None:
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target in on_stack:
                return [*stack[stack.index(target) :], target]
            if target not in done and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        on_stack.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (cycle := visit(module)) is not None:
            return cycle
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_has_no_import_cycle(package: str) -> None:
    """Counting the imports inside functions: deferring one hides a cycle, never breaks it."""
    cycle = find_cycle(import_graph(ROOT / "packages" / package / "src", deferred=True))
    assert cycle is None, f"{package} has an import cycle: {' -> '.join(cycle)}"


def test_cycle_checker_resolves_relative_imports_and_skips_deferred_ones(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from .sub import b\nA = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.a import A\n"
        "def f():\n    from ..a import A\n"
    )
    assert import_graph(tmp_path) == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": set(),
    }
    assert find_cycle(import_graph(tmp_path)) is None
    # Counted, the import in the function closes a cycle; TYPE_CHECKING's never does.
    assert find_cycle(import_graph(tmp_path, deferred=True)) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (pkg / "sub" / "b.py").write_text("try:\n    from .. import a\nexcept ImportError:\n    pass\n")
    assert find_cycle(import_graph(tmp_path)) == ["pkg.a", "pkg.sub.b", "pkg.a"]


# metrale-server's subpackages, lowest first: each may import only those before it.
SERVER_LAYERS = (
    ("arg_choices",),
    ("args", "devices", "speculative_config", "image_limits"),
    ("structured", "parsers", "pooling"),
    ("sampling",),
    ("speculative",),
    ("output",),
    ("memory",),
    ("engine",),
    ("webui",),
    ("api",),
    ("tui",),
    ("cli", "__main__"),
)


def test_server_subpackages_import_only_lower_layers() -> None:
    source = ROOT / "packages" / "metrale-server" / "src"
    rank = {name: level for level, names in enumerate(SERVER_LAYERS) for name in names}
    violations: list[str] = []
    for module, imported in sorted(import_graph(source).items()):
        part = module.split(".")[1] if "." in module else None
        if part is None:
            continue
        for target in sorted(imported):
            target_part = target.split(".")[1] if "." in target else None
            if target_part is None or target_part == part:
                continue
            if rank[target_part] > rank[part]:
                violations.append(f"{module} imports {target}")
    assert not violations, "\n".join(violations)


def test_model_families_never_import_the_loaders() -> None:
    """The loaders build families: the mapping types and name tables the families declare live
    in ``families``, and ``loading`` sits above it (deferred imports counted)."""
    source = ROOT / "packages" / "metrale-model-arch" / "src"
    graph = import_graph(source, deferred=True)
    below_loading = {"metrale_model_arch.families", "metrale_model_arch.q4_1_blocks"}
    violations = [
        f"{module} imports {target}"
        for module, imported in sorted(graph.items())
        if any(module == lower or module.startswith(f"{lower}.") for lower in below_loading)
        for target in sorted(imported)
        if target.startswith("metrale_model_arch.loading")
    ]
    assert not violations, "\n".join(violations)
