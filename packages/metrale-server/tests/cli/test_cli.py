"""``met`` through click's runner: flags, errors naming the flag, the environment check."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from metrale_server.cli.main import main


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_generate_greedy_is_deterministic(runner: CliRunner) -> None:
    args = ["generate", "--max-tokens", "8", "The capital of France is"]
    first = runner.invoke(main, args, env={})
    second = runner.invoke(main, args, env={})
    assert first.exit_code == 0, first.output
    assert first.output.strip()
    assert first.output == second.output


def test_seeded_sampling_repeats(runner: CliRunner) -> None:
    args = ["generate", "--max-tokens", "12", "--temperature", "1.0", "--seed", "7", "Once upon"]
    assert runner.invoke(main, args).output == runner.invoke(main, args).output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["generate", "--max-tokens", "0", "hi"], "--max-tokens"),
        (["generate", "--temperature", "-1", "hi"], "--temperature"),
        (["generate", "--dtype", "int3", "hi"], "--dtype"),
        (["generate", "--seed", "abc", "hi"], "--seed"),
    ],
)
def test_bad_flag_values_name_the_flag(runner: CliRunner, args: list[str], flag: str) -> None:
    result = runner.invoke(main, args)
    assert result.exit_code == 2
    assert flag in result.output


def test_missing_model_says_where_it_looked(runner: CliRunner, tmp_path: object) -> None:
    result = runner.invoke(main, ["generate", "--model", "no/such-model", "hi"])
    assert result.exit_code == 1
    assert "no/such-model" in result.output
    assert "Looked at" in result.output


def test_prompt_longer_than_context_is_an_error(runner: CliRunner) -> None:
    result = runner.invoke(main, ["generate", "--max-tokens", "9000", "hi"])
    assert result.exit_code == 1
    assert "max_seq_len" in result.output


def test_undeclared_lever_is_refused_with_its_name(runner: CliRunner) -> None:
    result = runner.invoke(main, ["generate", "hi"], env={"METRALE_NO_TUII": "1"})
    assert result.exit_code == 2
    assert "METRALE_NO_TUII" in result.output
