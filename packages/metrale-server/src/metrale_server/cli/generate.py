"""``met generate``: load a model, run one prompt through the engine, stream the text to a file."""

from __future__ import annotations

import sys
from typing import TextIO

import click

from metrale_server.args import EngineArgs
from metrale_server.cli.common import (
    CONTEXT,
    MODEL_HELP,
    locate_model,
    offline_option,
    revision_option,
)
from metrale_server.cli.plan_options import PlanOptions, plan_options


def run_generate(
    prompt: str,
    *,
    engine_args: EngineArgs,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    out: TextIO,
) -> None:
    """Errors reach the user as ``ValueError`` (``RequestError`` included) or ``OSError``."""
    from metrale_server.engine.bootstrap import build_engine
    from metrale_server.engine.core import RequestError
    from metrale_server.sampling.params import SamplingParams

    engine = build_engine(engine_args)
    engine.wait_for_native_kernels()
    loaded = engine.loaded
    if chat:
        text = loaded.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        prompt_ids = loaded.tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = loaded.tokenizer.encode(prompt, add_special_tokens=True)
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
    engine.add_request("generate", prompt_ids, params, prompt=prompt)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.error is not None:
                raise RequestError(output.error)
            out.write(output.outputs[0].delta_text)
            out.flush()
    out.write("\n")
    out.flush()


@click.command(context_settings=CONTEXT)
@click.argument("prompt")
@click.option("--model", "-m", default=None, help=MODEL_HELP)
@revision_option
@offline_option
@plan_options
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
def generate(
    prompt: str,
    model: str | None,
    revision: str | None,
    offline: bool,
    plan: PlanOptions,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
) -> None:
    """Print the model's continuation of PROMPT (the engine flags are met serve's)."""
    engine_model, _ = locate_model(model, revision=revision, offline=offline)
    try:
        run_generate(
            prompt,
            # One generation ends long before a background compile would: never start one.
            engine_args=plan.engine_args(engine_model, seed=seed or 0, enforce_eager=True),
            chat=chat,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            out=sys.stdout,
        )
    except (ValueError, OSError) as error:
        # Config, checkpoint, tokenizer and model-resolution errors all say what is wrong.
        raise click.ClickException(str(error)) from error
