"""The pooling a sentence-transformers model directory declares (``modules.json`` and its
``Pooling`` module's ``config.json``), as ``PoolingParams``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metrale_server.pooling.params import PoolingMethod, PoolingParams

MODULES_FILE = "modules.json"
POOLING_CONFIG_FILE = "config.json"
# sentence-transformers' ``pooling_mode_*`` flags, for those the server can pool.
POOLING_MODES: dict[str, PoolingMethod] = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
# Modules that change no vector (the Transformer is the model itself) or that the server
# applies (Pooling, Normalize); any other (Dense...) would change the vector unseen.
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


def read_sentence_transformers_pooling(model_dir: Path) -> PoolingParams | None:
    """The pooling of the sentence-transformers layout in ``model_dir``; ``None`` when it has
    none (no ``modules.json``, or one without a ``Pooling`` module).

    Raises ``ValueError`` naming the file for a malformed layout, a module the server cannot
    apply (``Dense``...), or a pooling mode it cannot do (max, weighted mean...).
    """
    modules_path = model_dir / MODULES_FILE
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{modules_path}: expected an array of module objects")
    kinds = {_module_kind(modules_path, module): module for module in modules}
    unknown = [kind for kind in kinds if kind not in KNOWN_MODULES]
    if unknown:
        raise ValueError(
            f"{modules_path}: the {', '.join(unknown)} module(s) are not supported (the server "
            f"applies only {', '.join(KNOWN_MODULES)})"
        )
    pooling = kinds.get("Pooling")
    if pooling is None:
        return None
    folder = pooling.get("path")
    if not isinstance(folder, str):
        raise ValueError(f"{modules_path}: the Pooling module has no folder (its 'path')")
    method = _pooling_method(model_dir / folder / POOLING_CONFIG_FILE)
    return PoolingParams(method=method, normalize="Normalize" in kinds)


def _module_kind(modules_path: Path, module: dict[str, Any]) -> str:
    kind = module.get("type")
    if not isinstance(kind, str):
        raise ValueError(f"{modules_path}: a module without a 'type': {module}")
    return kind.rpartition(".")[2]


def _pooling_method(config_path: Path) -> PoolingMethod:
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    modes = sorted(name for name, value in config.items() if name.startswith("pooling_mode_"))
    chosen = [name for name in modes if config[name] is True]
    if len(chosen) != 1:
        raise ValueError(
            f"{config_path}: expected exactly one pooling mode set, got "
            f"{', '.join(chosen) or 'none'}"
        )
    (mode,) = chosen
    if mode not in POOLING_MODES:
        raise ValueError(
            f"{config_path}: pooling mode {mode} is not supported (supported: "
            f"{', '.join(POOLING_MODES)})"
        )
    method = POOLING_MODES[mode]
    # A mean without the prompt (the instruction's tokens) needs where the instruction ends,
    # which the server is not told: refused rather than pooled over the wrong tokens.
    if method == "mean" and config.get("include_prompt", True) is not True:
        raise ValueError(
            f"{config_path}: mean pooling with include_prompt false (the instruction's tokens "
            "left out) is not supported"
        )
    return method


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path}: cannot be read as JSON ({error})") from error
