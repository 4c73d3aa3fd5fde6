"""``met memory``: the memory plan of a serve, from the config alone; no weight is read.

MODEL is what ``met serve`` takes (a directory, a GGUF file, a hub-cache name, nothing for the
default model) or a bare ``config.json``. ``--device-memory-gib`` plans for a device other than
this machine's (say an 80 GiB GPU, from a laptop).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import click
import torch

from metrale_config import ModelConfig, model_config_from_hf_file
from metrale_model_arch import (
    KvCacheDtype,
    Quantization,
    headless_config,
    read_model_config,
    resolve_model,
)
from metrale_model_arch.memory import (
    MemoryPlan,
    MemoryPlanError,
    kv_bytes_per_token,
    weight_bytes,
)
from metrale_server.args import EngineArgs
from metrale_server.devices import resolve_device
from metrale_server.engine.rank_setup import plan_engine, resolve_target
from metrale_server.memory.preflight import (
    PreflightError,
    engine_quantization,
    indexer_paged,
    plan_log_lines,
)
from metrale_server.pooling.model_task import engine_view, serves_embeddings

GIB = 2**30


def read_config(model: str | None, engine_args: EngineArgs) -> ModelConfig:
    """The config ``met serve`` would run (:func:`~metrale_server.pooling.model_task.engine_view`:
    its vision tower only where the engine takes images, its MTP layers only to speculate)."""
    if model is not None and Path(model).is_file() and Path(model).suffix == ".json":
        config = model_config_from_hf_file(model)
    else:
        config = read_model_config(resolve_model(model))
    return engine_view(engine_args, config)


def plan_device(spec: str, device_memory_gib: float | None) -> torch.device:
    """The device to plan for; a CUDA device need not be present when its size is given."""
    if device_memory_gib is not None and spec != "auto":
        return torch.device(spec)
    return resolve_device(spec)


def run_memory(
    model: str | None,
    engine_args: EngineArgs,
    *,
    device_memory_gib: float | None,
    as_json: bool,
) -> int:
    """Print the plan (or why it does not fit); returns the exit status: 0 fits, 1 does not."""
    config = read_config(model, engine_args)
    if serves_embeddings(engine_args.task, model):
        config = headless_config(config)
    device = plan_device(engine_args.device, device_memory_gib)
    target = resolve_target(engine_args, device=device, config=config)
    dtype = target.dtype
    quantization = engine_quantization(engine_args, config, device=device, dtype=dtype)
    total = None if device_memory_gib is None else int(device_memory_gib * GIB)
    try:
        plan = plan_engine(engine_args, target, total_bytes=total)
    except (MemoryPlanError, PreflightError) as error:
        _print_refusal(
            config, device, dtype, quantization, error, as_json=as_json, kv_cache=engine_args
        )
        return 1
    if as_json:
        click.echo(
            json.dumps(plan_json(plan, config, device, engine_args.tensor_parallel_size), indent=2)
        )
    else:
        click.echo(f"{config.model_type} ({config.source}) on {device}, {_dtype_name(dtype)}")
        if engine_args.tensor_parallel_size > 1:
            click.echo(
                f"Tensor parallel size {engine_args.tensor_parallel_size}: each rank's plan "
                "(its share of the weights, its KV heads) on a device of this size"
            )
        for line in plan_log_lines(plan, config):
            click.echo(line)
        click.echo(
            f"Fits: {plan.admitted_sequences} full-length sequence(s) at once, "
            f"{plan.max_kv_tokens} KV tokens; {plan.used_bytes / GIB:.2f} of "
            f"{plan.budget_bytes / GIB:.2f} GiB planned"
        )
    return 0


def plan_json(
    plan: MemoryPlan, config: ModelConfig, device: torch.device, tensor_parallel_size: int = 1
) -> dict[str, Any]:
    return {
        "fits": True,
        "model_type": config.model_type,
        "source": config.source,
        "device": str(device),
        "tensor_parallel_size": tensor_parallel_size,
        "inputs": attrs.asdict(plan.inputs),
        "budget_bytes": plan.budget_bytes,
        "max_batch_size": plan.max_batch_size,
        "kv_blocks": plan.kv_blocks,
        "kv_block_bytes": plan.kv_block_bytes,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "max_kv_tokens": plan.max_kv_tokens,
        "admitted_sequences": plan.admitted_sequences,
        "per_sequence_state": attrs.asdict(plan.per_sequence),
        "by_owner": plan.by_owner(),
        "used_bytes": plan.used_bytes,
    }


def _print_refusal(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    quantization: Quantization,
    error: Exception,
    *,
    as_json: bool,
    kv_cache: EngineArgs,
) -> None:
    weights = weight_bytes(config, dtype.itemsize, quantization)
    per_token = kv_bytes_per_token(
        config,
        dtype.itemsize,
        indexer_paged=indexer_paged(),
        kv_cache_dtype=KvCacheDtype.parse(kv_cache.kv_cache_dtype),
    )
    term = error.term if isinstance(error, MemoryPlanError) else "device"
    if as_json:
        document = {
            "fits": False,
            "model_type": config.model_type,
            "source": config.source,
            "device": str(device),
            "term": term,
            "error": str(error),
            "weights_by_owner": weights.by_owner(),
            "kv_bytes_per_token": per_token,
        }
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(f"{config.model_type} ({config.source}) on {device}, {_dtype_name(dtype)}")
    click.echo(
        f"Weights: {weights.total() / GIB:.2f} GiB; KV price: {per_token} B/token "
        f"({per_token * 1024 / GIB:.4f} GiB per 1k tokens)"
    )
    click.echo(f"Does not fit ({term}): {error}", err=True)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
