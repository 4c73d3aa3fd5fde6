"""The declared ``METRALE_*`` levers: typed reads and the start-up environment check."""

from __future__ import annotations

import pytest

from metrale_config import (
    LEVERS,
    ConfigError,
    Lever,
    UndeclaredLeverError,
    check_environment,
    read_bool_lever,
    read_int_lever,
    read_lever,
    read_str_lever,
)

EXPECTED_LEVERS = {
    "METRALE_DEFAULT_MODEL": (str, None),
    "METRALE_NO_PROGRESS": (bool, False),
    "METRALE_NO_TUI": (bool, False),
    "METRALE_HOME": (str, "~/.metrale"),
    "METRALE_MAX_BODY_BYTES": (int, 8 * 1024 * 1024),
    "METRALE_API_KEY": (str, None),
    "METRALE_GLM_DSA_INDEXER_FLAT": (bool, False),
    "METRALE_NATIVE_MARCH": (str, "native"),
    "METRALE_ENFORCE_EAGER": (bool, False),
    "METRALE_BENCH_DIR": (str, None),
}


def test_declared_table() -> None:
    assert {name: (lever.type, lever.default) for name, lever in LEVERS.items()} == EXPECTED_LEVERS
    for name, lever in LEVERS.items():
        assert isinstance(lever, Lever)
        assert lever.name == name
        assert lever.doc
        assert "\n" not in lever.doc


@pytest.mark.parametrize("name", sorted(EXPECTED_LEVERS))
def test_unset_or_empty_reads_the_default(name: str) -> None:
    assert read_lever(name, {}) == EXPECTED_LEVERS[name][1]
    assert read_lever(name, {name: ""}) == EXPECTED_LEVERS[name][1]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        (" on ", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("off", False),
    ],
)
def test_bool_words(raw: str, expected: bool) -> None:
    assert read_lever("METRALE_NO_TUI", {"METRALE_NO_TUI": raw}) is expected
    assert read_bool_lever("METRALE_NO_TUI", {"METRALE_NO_TUI": raw}) is expected


def test_bad_bool_names_variable_and_type() -> None:
    with pytest.raises(ConfigError, match=r"METRALE_NO_PROGRESS must be a boolean .* got 'maybe'"):
        read_lever("METRALE_NO_PROGRESS", {"METRALE_NO_PROGRESS": "maybe"})


def test_int_lever() -> None:
    env = {"METRALE_MAX_BODY_BYTES": "1048576"}
    assert read_int_lever("METRALE_MAX_BODY_BYTES", env) == 1048576
    with pytest.raises(ConfigError, match="METRALE_MAX_BODY_BYTES must be an integer, got '1MB'"):
        read_lever("METRALE_MAX_BODY_BYTES", {"METRALE_MAX_BODY_BYTES": "1MB"})


def test_str_lever_keeps_the_value() -> None:
    env = {"METRALE_DEFAULT_MODEL": "/models/tiny"}
    assert read_str_lever("METRALE_DEFAULT_MODEL", env) == "/models/tiny"
    assert read_str_lever("METRALE_DEFAULT_MODEL", {}) is None


def test_typed_reads_refuse_the_wrong_lever_type() -> None:
    with pytest.raises(TypeError):
        read_int_lever("METRALE_NO_TUI", {})
    with pytest.raises(TypeError):
        read_str_lever("METRALE_MAX_BODY_BYTES", {})


def test_read_of_undeclared_name() -> None:
    with pytest.raises(UndeclaredLeverError, match="did you mean METRALE_NO_TUI"):
        read_lever("METRALE_NO_TIU", {})


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_NO_TUI", "1")
    assert read_lever("METRALE_NO_TUI") is True


def test_check_environment_accepts_declared_and_foreign_variables() -> None:
    check_environment({"METRALE_NO_TUI": "1", "PATH": "/bin", "XMETRALE_FOO": "x"})


def test_check_environment_names_every_undeclared_variable() -> None:
    env = {"METRALE_NO_PROGRES": "1", "METRALE_ZZZ_UNRELATED": "x", "METRALE_NO_TUI": "1"}
    with pytest.raises(UndeclaredLeverError) as info:
        check_environment(env)
    message = str(info.value)
    assert "METRALE_NO_PROGRES (did you mean METRALE_NO_PROGRESS?)" in message
    assert "METRALE_ZZZ_UNRELATED" in message
    assert "METRALE_ZZZ_UNRELATED (did you mean" not in message
    assert "METRALE_NO_TUI" not in message.replace("METRALE_NO_TUI?", "")


def test_check_environment_refuses_a_bad_declared_value() -> None:
    with pytest.raises(ConfigError, match="METRALE_MAX_BODY_BYTES must be an integer"):
        check_environment({"METRALE_MAX_BODY_BYTES": "lots"})


def test_check_environment_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_NOT_A_LEVER", "1")
    with pytest.raises(UndeclaredLeverError, match="METRALE_NOT_A_LEVER"):
        check_environment()
