"""What every ``met`` command shares: click settings, the environment check, help texts, and
finding (or downloading) the model a command names."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from metrale_config import ConfigError, check_environment

if TYPE_CHECKING:
    from metrale_model_arch import ModelSource

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"]}
LOG_LEVELS = ("debug", "info", "warning", "error")
MODEL_HELP = (
    "A local model directory (config.json + safetensors), a .gguf file, or a Hugging Face repo "
    "id (org/name, or org/name/FILE.gguf) from the HF hub cache, downloaded into it when missing. "
    "Default: the bundled SmolLM2-135M-Instruct."
)
REVISION_HELP = (
    "The branch, tag or commit (a hash, or a unique prefix of 7+ hex digits) of a Hugging Face "
    "repo id MODEL. Default: main, or, when the hub cache has no refs/main, its newest snapshot."
)
OFFLINE_HELP = "Never download: MODEL must be local or in the HF hub cache (also HF_HUB_OFFLINE=1)."


def revision_option(command: F) -> F:
    """``--revision REV``, handed to the command as ``revision``."""
    return click.option("--revision", default=None, metavar="REV", help=REVISION_HELP)(command)


def offline_option(command: F) -> F:
    """``--offline``, handed to the command as ``offline``."""
    return click.option("--offline", is_flag=True, help=OFFLINE_HELP)(command)


def locate_model(
    model: str | None, *, revision: str | None, offline: bool, download: bool = True
) -> tuple[str | None, ModelSource]:
    """Find ``model`` at ``revision`` (local path, hub cache, bundled default), downloading a
    hub repo id missing from the cache unless ``offline`` or ``download`` is false.

    Returns what to hand the engine as its model and the source found: a model from the hub
    cache goes by its snapshot path, so the engine (which resolves names offline, at refs/main)
    loads exactly the revision found here; anything else goes by ``model`` as given. Errors
    (every place looked at, why nothing was downloaded) are a ``click.ClickException``.
    """
    from metrale_model_arch.model_download import find_or_download_model
    from metrale_model_arch.model_source import resolve_model

    try:
        if download:
            source = find_or_download_model(
                model,
                revision,
                offline=offline,
                announce=lambda line: click.echo(line, err=True),
            )
        else:
            source = resolve_model(model, revision)
    except (ValueError, OSError) as error:
        raise click.ClickException(str(error)) from error
    return (str(source.path) if source.commit is not None else model), source


def check_environment_or_exit() -> None:
    """Refuse an undeclared ``METRALE_*`` variable as a usage error."""
    try:
        check_environment()
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
