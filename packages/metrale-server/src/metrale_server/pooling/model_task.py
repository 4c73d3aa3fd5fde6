"""``ModelTask``: what the served model does (generate, embed, score), settled once at start
from ``--task`` and the model's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import attrs

from metrale_config import ModelConfig
from metrale_model_arch import (
    LoadedModel,
    ModelSource,
    Tokenizer,
    mtp_free_config,
    read_model_config,
    resolve_model,
    serves_images,
    text_only_config,
)
from metrale_server.args import EngineArgs
from metrale_server.pooling.params import PoolingParams
from metrale_server.pooling.sentence_transformers import read_sentence_transformers_pooling

TaskName = Literal["generate", "embed", "score"]
# Qwen3-Embedding's card: the last token's state, normalized.
DEFAULT_EMBED_POOLING = PoolingParams(method="last", normalize=True)
# Qwen3-Reranker's answer tokens: the score is P("yes") against P("no").
SCORE_FALSE_TOKEN = "no"
SCORE_TRUE_TOKEN = "yes"
_METHOD_NAMES = {"last": "last-token", "mean": "mean", "cls": "cls-token"}


@attrs.frozen(kw_only=True)
class ModelTask:
    """The served model's task and how its pooling requests read their vector.

    ``pooling``: ``embed``'s method and normalization, ``score``'s yes/no token ids; ``None``
    for ``generate``. ``is_matryoshka`` (config.json ``is_matryoshka`` or
    ``matryoshka_dimensions``): an embedding may be asked shorter (``dimensions``), to one of
    ``matryoshka_dimensions`` when the config lists them, else to any length.
    """

    name: TaskName
    pooling: PoolingParams | None = None
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()

    def describe(self) -> str:
        """One line for the boot log: ``embed (last-token pooling, normalized)``."""
        pooling = self.pooling
        if pooling is None:
            return self.name
        if pooling.score_token_ids is not None:
            false_id, true_id = pooling.score_token_ids
            return (
                f"{self.name} (sigmoid of the {SCORE_TRUE_TOKEN!r} - {SCORE_FALSE_TOKEN!r} "
                f"logits, tokens {true_id} and {false_id})"
            )
        parts = [
            f"{_METHOD_NAMES[pooling.method]} pooling",
            "normalized" if pooling.normalize else "not normalized",
        ]
        if self.is_matryoshka:
            listed = ", ".join(map(str, self.matryoshka_dimensions)) or "any"
            parts.append(f"Matryoshka dimensions: {listed}")
        return f"{self.name} ({', '.join(parts)})"


def serves_embeddings(task: str, model: str | None) -> bool:
    """Whether ``task`` (``--task``) makes ``model`` an embedding model, from its files alone
    (before anything loads): such a model is planned and loaded without a head of its own.
    Raises ``ValueError`` for a sentence-transformers layout the server cannot pool."""
    if task in ("generate", "score"):
        return False
    if task == "embed":
        return True
    if model is not None and model.endswith(".json") and Path(model).is_file():
        model_dir: Path | None = Path(model).parent  # ``met memory CONFIG.json``
    else:
        source = resolve_model(model)
        model_dir = source.path if source.kind == "dir" else None
    return model_dir is not None and read_sentence_transformers_pooling(model_dir) is not None


def engine_model_config(args: EngineArgs) -> ModelConfig:
    """The config the engine runs ``args.model`` with: without its head for an embedding
    task (:func:`serves_embeddings`), and as :func:`engine_view` trims it."""
    without_head = serves_embeddings(args.task, args.model)
    config = read_model_config(resolve_model(args.model), without_head=without_head)
    return engine_view(args, config)


def engine_view(args: EngineArgs, config: ModelConfig) -> ModelConfig:
    """``config`` without the parts the engine would not run: its vision tower unless it
    takes images (:func:`engine_text_only`), its MTP layers unless it speculates with them."""
    if engine_text_only(args, config):
        config = text_only_config(config)
    speculative = args.speculative_config
    if speculative is None or not speculative.is_mtp:
        config = mtp_free_config(config)
    return config


def engine_text_only(args: EngineArgs, config: ModelConfig) -> bool:
    """Whether the engine leaves ``config``'s vision tower out: a tower it cannot serve, an
    embedding or scoring task, ``images_per_prompt`` 0, or a split model (images do not run
    under tensor parallelism yet)."""
    return (
        not serves_images(config)
        or args.images_per_prompt == 0
        or args.tensor_parallel_size > 1
        or serves_embeddings(args.task, args.model)
        or args.task == "score"
    )


def resolve_model_task(task: str, loaded: LoadedModel) -> ModelTask:
    """The task ``task`` (``--task``: ``auto``, ``generate``, ``embed``, ``score``) names for
    ``loaded``. Raises ``ValueError`` saying which file or token is at fault."""
    return model_task_for(task, loaded.source, loaded.tokenizer)


def model_task_for(task: str, source: ModelSource, tokenizer: Tokenizer) -> ModelTask:
    """:func:`resolve_model_task` from the model's files and tokenizer alone.

    ``auto`` is ``embed`` for a sentence-transformers directory (a ``Pooling`` module in
    ``modules.json``), else ``generate``: a causal-LM reranker looks like any causal LM, so
    ``score`` is only ever asked for. ``embed`` without those files pools the last token,
    normalized.
    """
    if task == "generate":
        return ModelTask(name="generate")
    if task == "score":
        score_ids = (
            _single_token(tokenizer, SCORE_FALSE_TOKEN),
            _single_token(tokenizer, SCORE_TRUE_TOKEN),
        )
        return ModelTask(name="score", pooling=PoolingParams(score_token_ids=score_ids))
    if task not in ("auto", "embed"):
        raise ValueError(f"task must be one of auto, generate, embed, score; got {task!r}")
    model_dir = source.path if source.kind == "dir" else None
    pooling = None if model_dir is None else read_sentence_transformers_pooling(model_dir)
    if pooling is None and task == "auto":
        return ModelTask(name="generate")
    matryoshka = None if model_dir is None else _matryoshka(model_dir)
    return ModelTask(
        name="embed",
        pooling=pooling or DEFAULT_EMBED_POOLING,
        is_matryoshka=matryoshka is not None,
        matryoshka_dimensions=matryoshka or (),
    )


def _single_token(tokenizer: Tokenizer, text: str) -> int:
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    if len(token_ids) != 1:
        raise ValueError(
            f"task score needs {text!r} to be one token of the model's tokenizer (a yes/no "
            f"reranker such as Qwen3-Reranker), but it encodes to {len(token_ids)} tokens"
        )
    return token_ids[0]


def _matryoshka(model_dir: Path) -> tuple[int, ...] | None:
    """``None``: not a Matryoshka model; ``()``: one whose config lists no dimensions."""
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # the model's loader has read it already; nothing more to say here
    listed = config.get("matryoshka_dimensions") if isinstance(config, dict) else None
    if listed is not None:
        if not isinstance(listed, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in listed
        ):
            raise ValueError(f"{path}: matryoshka_dimensions must be a list of positive integers")
        return tuple(sorted(set(listed)))
    return () if isinstance(config, dict) and config.get("is_matryoshka") is True else None
