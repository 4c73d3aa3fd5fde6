"""What installing a package pulls in: the server's closure of required dependencies holds no
plotting library (matplotlib is metrale-bench's ``plots`` extra)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PACKAGES = Path(__file__).resolve().parent.parent / "packages"


def required(package: str) -> list[str]:
    project = tomllib.loads((PACKAGES / package / "pyproject.toml").read_text())["project"]
    return [re.split(r"[<>=~!\[; ]", spec, maxsplit=1)[0] for spec in project["dependencies"]]


def closure(package: str) -> set[str]:
    """The package's required dependencies, through its sibling packages."""
    seen: set[str] = set()
    pending = [package]
    while pending:
        for name in required(pending.pop()):
            if name not in seen:
                seen.add(name)
                if (PACKAGES / name).is_dir():
                    pending.append(name)
    return seen


def test_the_server_installs_without_matplotlib() -> None:
    names = closure("metrale-server")
    assert "metrale-bench" in names  # the wire types it reports in
    assert "matplotlib" not in names


def test_plots_are_metrale_benchs_extra() -> None:
    project = tomllib.loads((PACKAGES / "metrale-bench" / "pyproject.toml").read_text())["project"]
    assert any(spec.startswith("matplotlib") for spec in project["optional-dependencies"]["plots"])
