from pathlib import Path

import attrs
import pytest

from metrale_bench import HostDescription, describe_host


def test_describe_host_reads_model_name(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t: avx2\n")
    host = describe_host(cpuinfo=cpuinfo)
    assert host.cpu_model == "Test CPU 9000"
    assert host.num_cpus is not None
    assert host.num_cpus >= 1
    assert host.memory_bytes is not None
    assert host.memory_bytes > 2**20


def test_unreadable_cpuinfo_is_not_invented(tmp_path: Path) -> None:
    host = describe_host(cpuinfo=tmp_path / "missing")
    assert host.cpu_model is None or host.cpu_model != ""


def test_host_description_is_frozen() -> None:
    host = describe_host()
    assert isinstance(host, HostDescription)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        host.num_cpus = 1  # type: ignore[misc]
