"""``met memory``: the memory plan of a serve with these flags, from the config alone."""

from __future__ import annotations

from pathlib import Path

import click

from metrale_server.cli.common import (
    CONTEXT,
    check_environment_or_exit,
    locate_model,
    revision_option,
)
from metrale_server.cli.plan_options import PlanOptions, plan_options


@click.command(context_settings=CONTEXT)
@click.argument("model", required=False)
@revision_option
@plan_options
@click.option(
    "--device-memory-gib",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Plan for a device of this many GiB instead of this machine's (e.g. with "
    "--device cuda on a machine without a GPU).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def memory(
    model: str | None,
    revision: str | None,
    plan: PlanOptions,
    device_memory_gib: float | None,
    as_json: bool,
) -> None:
    """Print the memory plan of serving MODEL with these flags, from its config alone.

    MODEL is what `met serve` takes, or a config.json file; no weight is read, and nothing is
    downloaded (a hub repo id must be in the HF hub cache). Exits 1 when the serve would not
    fit, naming the term and the flags to change.
    """
    from metrale_server.cli.memory_report import run_memory

    check_environment_or_exit()
    if model is None or not (Path(model).is_file() and Path(model).suffix == ".json"):
        model, _ = locate_model(model, revision=revision, offline=True, download=False)
    elif revision is not None:
        raise click.BadParameter(
            "applies to a Hugging Face repo id, not a config.json file", param_hint="'--revision'"
        )
    try:
        engine_args = plan.engine_args(model)
        exit_code = run_memory(
            model, engine_args, device_memory_gib=device_memory_gib, as_json=as_json
        )
    except (ValueError, OSError, RuntimeError) as error:
        raise click.ClickException(str(error)) from error
    click.get_current_context().exit(exit_code)
