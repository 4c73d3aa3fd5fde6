"""``--task`` resolved against a model's files: sentence-transformers layouts, the reranker's
yes/no tokens, Matryoshka configs, and the refusals that name the file at fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from metrale_model_arch import ModelSource, Tokenizer
from metrale_server.pooling.model_task import ModelTask, model_task_for
from metrale_server.pooling.params import PoolingParams

TRANSFORMER = {
    "idx": 0,
    "name": "0",
    "path": "",
    "type": "sentence_transformers.models.Transformer",
}
POOLING = {
    "idx": 1,
    "name": "1",
    "path": "1_Pooling",
    "type": "sentence_transformers.models.Pooling",
}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}  # fmt: skip
DENSE = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                 "weightedmean_tokens", "lasttoken")  # fmt: skip


def write_layout(
    path: Path,
    *modes: str,
    modules: tuple[dict[str, Any], ...] = (TRANSFORMER, POOLING, NORMALIZE),
    config: dict[str, Any] | None = None,
    include_prompt: bool = True,
) -> ModelSource:
    """A model directory with ``modules.json`` and a ``1_Pooling/config.json`` whose
    ``pooling_mode_*`` flags are set for ``modes``, as sentence-transformers saves them."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "qwen3"}))
    (path / "modules.json").write_text(json.dumps(list(modules)))
    (path / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "include_prompt": include_prompt}
    pooling.update({f"pooling_mode_{mode}": mode in modes for mode in POOLING_MODES})
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return ModelSource(kind="dir", path=path, name=str(path))


def plain_dir(path: Path, config: dict[str, Any] | None = None) -> ModelSource:
    (path / "config.json").write_text(json.dumps(config or {"model_type": "qwen3"}))
    return ModelSource(kind="dir", path=path, name=str(path))


def test_a_causal_lm_generates_unless_asked_otherwise(
    tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    source = plain_dir(tmp_path)
    assert model_task_for("auto", source, default_tokenizer) == ModelTask(name="generate")
    assert model_task_for("generate", source, default_tokenizer) == ModelTask(name="generate")
    embed = model_task_for("embed", source, default_tokenizer)
    assert embed == ModelTask(name="embed", pooling=PoolingParams(method="last", normalize=True))
    assert embed.describe() == "embed (last-token pooling, normalized)"


@pytest.mark.parametrize(
    ("mode", "modules", "expected"),
    [
        ("lasttoken", (TRANSFORMER, POOLING, NORMALIZE), PoolingParams(method="last")),
        ("mean_tokens", (TRANSFORMER, POOLING), PoolingParams(method="mean", normalize=False)),
        ("cls_token", (TRANSFORMER, POOLING, NORMALIZE), PoolingParams(method="cls")),
    ],
)
def test_a_sentence_transformers_layout_is_detected_as_embed(
    tmp_path: Path,
    default_tokenizer: Tokenizer,
    mode: str,
    modules: tuple[dict[str, Any], ...],
    expected: PoolingParams,
) -> None:
    source = write_layout(tmp_path, mode, modules=modules)
    for task in ("auto", "embed"):
        assert model_task_for(task, source, default_tokenizer) == ModelTask(
            name="embed", pooling=expected
        )
    assert model_task_for("generate", source, default_tokenizer).name == "generate"


def test_the_boot_line_names_method_normalization_and_matryoshka(
    tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    config = {"model_type": "qwen3", "matryoshka_dimensions": [128, 32]}
    source = write_layout(tmp_path, "mean_tokens", modules=(TRANSFORMER, POOLING), config=config)
    assert model_task_for("auto", source, default_tokenizer).describe() == (
        "embed (mean pooling, not normalized, Matryoshka dimensions: 32, 128)"
    )


@pytest.mark.parametrize("mode", ["max_tokens", "weightedmean_tokens", "mean_sqrt_len_tokens"])
def test_a_pooling_mode_the_server_cannot_do_names_file_and_mode(
    tmp_path: Path, default_tokenizer: Tokenizer, mode: str
) -> None:
    source = write_layout(tmp_path, mode)
    with pytest.raises(
        ValueError, match=f"pooling mode pooling_mode_{mode} is not supported"
    ) as info:
        model_task_for("auto", source, default_tokenizer)
    assert str(tmp_path / "1_Pooling" / "config.json") in str(info.value)


def test_a_mean_without_the_prompt_is_refused_and_a_last_token_ignores_it(
    tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    mean = write_layout(tmp_path / "mean", "mean_tokens", include_prompt=False)
    with pytest.raises(ValueError, match="include_prompt false"):
        model_task_for("auto", mean, default_tokenizer)
    last = write_layout(tmp_path / "last", "lasttoken", include_prompt=False)
    task = model_task_for("auto", last, default_tokenizer)
    assert task.pooling is not None
    assert task.pooling.method == "last"


@pytest.mark.parametrize("modes", [(), ("lasttoken", "mean_tokens")])
def test_a_pooling_config_must_set_exactly_one_mode(
    tmp_path: Path, default_tokenizer: Tokenizer, modes: tuple[str, ...]
) -> None:
    source = write_layout(tmp_path, *modes)
    with pytest.raises(ValueError, match="expected exactly one pooling mode set"):
        model_task_for("embed", source, default_tokenizer)


def test_a_module_that_would_change_the_vector_unseen_is_refused(
    tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    source = write_layout(tmp_path, "lasttoken", modules=(TRANSFORMER, POOLING, DENSE))
    with pytest.raises(ValueError, match="the Dense module") as info:
        model_task_for("auto", source, default_tokenizer)
    assert str(tmp_path / "modules.json") in str(info.value)


def test_modules_without_pooling_are_no_embedding_layout(
    tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    source = write_layout(tmp_path, "lasttoken", modules=(TRANSFORMER,))
    assert model_task_for("auto", source, default_tokenizer).name == "generate"


@pytest.mark.parametrize("content", ["{not json", '{"type": "Pooling"}', "[3]"])
def test_a_malformed_modules_file_is_named(
    tmp_path: Path, default_tokenizer: Tokenizer, content: str
) -> None:
    source = plain_dir(tmp_path)
    (tmp_path / "modules.json").write_text(content)
    with pytest.raises(ValueError, match=r"modules\.json"):
        model_task_for("auto", source, default_tokenizer)


def test_a_gguf_file_generates_or_embeds_by_its_last_token(default_tokenizer: Tokenizer) -> None:
    source = ModelSource(kind="gguf", path=Path("/models/m.gguf"), name="m.gguf")
    assert model_task_for("auto", source, default_tokenizer).name == "generate"
    assert model_task_for("embed", source, default_tokenizer) == ModelTask(
        name="embed", pooling=PoolingParams()
    )


def test_score_reads_the_yes_and_no_tokens(tmp_path: Path, default_tokenizer: Tokenizer) -> None:
    task = model_task_for("score", plain_dir(tmp_path), default_tokenizer)
    no_id, yes_id = default_tokenizer.encode("no", add_special_tokens=False) + (
        default_tokenizer.encode("yes", add_special_tokens=False)
    )
    assert task == ModelTask(name="score", pooling=PoolingParams(score_token_ids=(no_id, yes_id)))
    assert task.describe() == (
        f"score (sigmoid of the 'yes' - 'no' logits, tokens {yes_id} and {no_id})"
    )


def test_score_needs_yes_and_no_as_single_tokens(tmp_path: Path) -> None:
    letters = {letter: index for index, letter in enumerate("yesno")} | {"[UNK]": 5}
    backend = Backend(models.WordLevel(letters, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    with pytest.raises(ValueError, match=r"'no' to be one token .* encodes to 2 tokens"):
        model_task_for("score", plain_dir(tmp_path), Tokenizer(backend=backend))


@pytest.mark.parametrize(
    ("config", "is_matryoshka", "dimensions"),
    [
        ({}, False, ()),
        ({"is_matryoshka": True}, True, ()),
        ({"is_matryoshka": False}, False, ()),
        ({"matryoshka_dimensions": [256, 64, 128]}, True, (64, 128, 256)),
    ],
)
def test_matryoshka_is_read_from_the_config(
    tmp_path: Path,
    default_tokenizer: Tokenizer,
    config: dict[str, Any],
    is_matryoshka: bool,
    dimensions: tuple[int, ...],
) -> None:
    source = write_layout(tmp_path, "lasttoken", config={"model_type": "qwen3", **config})
    task = model_task_for("auto", source, default_tokenizer)
    assert (task.is_matryoshka, task.matryoshka_dimensions) == (is_matryoshka, dimensions)


def test_bad_matryoshka_dimensions_are_named(tmp_path: Path, default_tokenizer: Tokenizer) -> None:
    source = plain_dir(tmp_path, {"model_type": "qwen3", "matryoshka_dimensions": [64, 0]})
    with pytest.raises(ValueError, match="matryoshka_dimensions must be a list of positive"):
        model_task_for("embed", source, default_tokenizer)


def test_an_unknown_task_is_refused(tmp_path: Path, default_tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="task must be one of"):
        model_task_for("classify", plain_dir(tmp_path), default_tokenizer)
