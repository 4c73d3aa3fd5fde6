"""``met``: the command line (``met generate`` now; serve, memory and bench come as they land)."""

from __future__ import annotations

import sys

import click

from metrale_config import ConfigError, check_environment
from metrale_server.devices import DTYPES

MODEL_HELP = (
    "A local model directory (config.json + safetensors), a .gguf file, or a name found in the "
    "HF hub cache. Default: the bundled SmolLM2-135M-Instruct."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="metrale-server", prog_name="met")
def main() -> None:
    """Metrale: an LLM inference server."""
    try:
        check_environment()
    except ConfigError as error:
        raise click.UsageError(str(error)) from error


@main.command()
@click.argument("prompt")
@click.option("--model", "-m", default=None, help=MODEL_HELP)
@click.option(
    "--chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template."
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="New tokens at most.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Sampling temperature; 0 is greedy.",
)
@click.option("--seed", type=int, default=None, help="Seed for sampling (same seed, same text).")
@click.option(
    "--dtype",
    type=click.Choice(["auto", *DTYPES]),
    default="auto",
    show_default=True,
    help="Activation and weight dtype; auto is float32 on CPU, bfloat16 on CUDA.",
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
def generate(
    prompt: str,
    model: str | None,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    dtype: str,
    device: str,
) -> None:
    """Print the model's continuation of PROMPT."""
    from metrale_server.generate_command import run_generate

    try:
        run_generate(
            prompt,
            model=model,
            chat=chat,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            dtype=dtype,
            device=device,
            out=sys.stdout,
        )
    except (ValueError, OSError) as error:
        # Config, checkpoint, tokenizer and model-resolution errors all say what is wrong.
        raise click.ClickException(str(error)) from error
