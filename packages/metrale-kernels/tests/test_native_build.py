"""How the native ops are built, with a stand-in compiler that records its command lines and
writes its ``-o`` file: each source compiled on its own, as many at once as ``build_jobs``,
each logged as it ends, then one link into the cache; a failed compile names its source and
leaves nothing in the cache. (The real build is checked by every native op test.)"""

from __future__ import annotations

import json
import logging
import stat
import sys
from pathlib import Path

import pytest

from metrale_kernels.cpu import build
from metrale_kernels.cpu.native import NativeBuildError

FAKE_COMPILER = """#!{python}
import json, os, pathlib, sys, time

args = sys.argv[1:]
if args == ["--version"]:
    print("fake c++ 1.0")
    sys.exit(0)
calls = pathlib.Path(os.environ["FAKE_CXX_CALLS"])
with calls.open("a") as log:
    log.write(json.dumps(args) + "\\n")
if "-c" in args:
    source = pathlib.Path(args[args.index("-c") + 1]).name
    if source == os.environ.get("FAKE_CXX_FAIL"):
        print("error: no such luck", file=sys.stderr)
        sys.exit(1)
    # Each compile waits until two have started, so one at a time fails.
    started = pathlib.Path(os.environ["FAKE_CXX_STARTED"])
    (started / source).touch()
    deadline = time.monotonic() + float(os.environ.get("FAKE_CXX_WAIT_S", "30"))
    while len(list(started.iterdir())) < 2:
        if time.monotonic() > deadline:
            print("error: compiled alone", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.01)
pathlib.Path(args[args.index("-o") + 1]).write_bytes(b"built")
"""


@pytest.fixture
def fake_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake-c++"
    script.write_text(FAKE_COMPILER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.jsonl"
    started = tmp_path / "started"
    started.mkdir()
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("FAKE_CXX_CALLS", str(calls))
    monkeypatch.setenv("FAKE_CXX_STARTED", str(started))
    monkeypatch.setattr(build, "build_jobs", lambda: 2)
    return calls


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_source_compiles_on_its_own_then_one_link(
    tmp_path: Path, fake_compiler: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="metrale.kernels"):
        path, cached = build.build_library(cache)
    assert not cached
    assert path == build.library_path(cache)
    assert path.read_bytes() == b"built"
    assert list(cache.iterdir()) == [path]  # no scratch left behind
    *compiles, link = _calls(fake_compiler)
    compiled = sorted(Path(args[args.index("-c") + 1]).name for args in compiles)
    assert compiled == sorted(build.SOURCES)
    assert all("-shared" not in args for args in compiles)
    assert "-shared" in link
    objects = [arg for arg in link if arg.endswith(".o")]
    assert sorted(Path(obj).stem for obj in objects) == sorted(
        Path(source).stem for source in build.SOURCES
    )
    progress = [r.getMessage() for r in caplog.records if "native CPU ops: compiled" in r.message]
    count = len(build.SOURCES)
    assert [line.split("(")[1].split(" ")[0] for line in progress] == [
        f"{done}/{count}" for done in range(1, count + 1)
    ]
    # Cached from now on: no compiler runs.
    assert build.build_library(cache) == (path, True)
    assert len(_calls(fake_compiler)) == len(build.SOURCES) + 1


def test_compiles_run_at_once_up_to_the_jobs(
    tmp_path: Path, fake_compiler: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build.build_library(tmp_path / "cache")
    assert len(list((tmp_path / "started").iterdir())) == len(build.SOURCES)
    monkeypatch.setattr(build, "build_jobs", lambda: 1)
    monkeypatch.setenv("FAKE_CXX_STARTED", str(tmp_path / "started-alone"))
    monkeypatch.setenv("FAKE_CXX_WAIT_S", "1")
    (tmp_path / "started-alone").mkdir()
    with pytest.raises(NativeBuildError, match="compiled alone"):
        build.build_library(tmp_path / "cache-alone")


def test_a_failed_compile_names_its_source_and_leaves_no_library(
    tmp_path: Path, fake_compiler: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CXX_FAIL", "q4_mm.cpp")
    cache = tmp_path / "cache"
    with pytest.raises(NativeBuildError, match=r"compiling q4_mm\.cpp failed:\nerror: no such"):
        build.build_library(cache)
    assert list(cache.iterdir()) == []


def test_build_jobs_is_one_per_cpu_at_most_one_per_source() -> None:
    assert 1 <= build.build_jobs() <= len(build.SOURCES)
