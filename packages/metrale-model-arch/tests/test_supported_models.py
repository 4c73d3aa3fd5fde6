from __future__ import annotations

from pathlib import Path

import pytest

from metrale_model_arch.registry import SUPPORTED_MODEL_TYPES
from metrale_model_arch.supported_models import (
    TABLE_END,
    TABLE_START,
    supported_model_rows,
    supported_models_section,
)

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_table_is_the_generated_one() -> None:
    if not README.is_file():
        pytest.skip("not in the monorepo checkout")
    text = README.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    assert text[start:end] == supported_models_section(), (
        "README.md's supported-model table is stale: paste "
        "metrale_model_arch.supported_models.supported_models_section() between its markers"
    )


def test_one_row_per_runnable_model_type_with_its_traits() -> None:
    header, rule, *rows = supported_model_rows()
    assert header.split(" | ")[1:6] == ["sliding window", "MoE", "MLA", "linear state", "GGUF"]
    assert rule.count("---") == header.count("|") - 1
    assert [row.split("`")[1] for row in rows] == list(SUPPORTED_MODEL_TYPES)
    by_type = {row.split("`")[1]: row for row in rows}
    assert by_type["gemma2"] == "| `gemma2` | yes | — | — | — | yes | — |"
    assert by_type["gemma3"] == "| `gemma3` | yes | — | — | — | yes | — |"
    assert by_type["glm5_next"] == "| `glm5_next` | — | yes | yes | yes | no GGUF | — |"
    assert by_type["llama"] == "| `llama` | — | — | — | — | yes | yes |"
