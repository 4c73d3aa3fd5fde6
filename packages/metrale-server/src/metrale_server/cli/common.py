"""What every ``met`` command shares: click settings, the environment check, help texts."""

from __future__ import annotations

import click

from metrale_config import ConfigError, check_environment

CONTEXT = {"help_option_names": ["-h", "--help"]}
LOG_LEVELS = ("debug", "info", "warning", "error")
MODEL_HELP = (
    "A local model directory (config.json + safetensors), a .gguf file, or a name found in the "
    "HF hub cache. Default: the bundled SmolLM2-135M-Instruct."
)


def check_environment_or_exit() -> None:
    """Refuse an undeclared ``METRALE_*`` variable as a usage error."""
    try:
        check_environment()
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
