"""The preflight: the memory plan for a serve, computed from the config before any weight loads.

``plan_engine_memory`` reads the device's total memory (CUDA: the device's; CPU: physical RAM or
the cgroup limit, whichever is smaller), applies ``--gpu-memory-utilization`` and asks
``metrale_model_arch.memory.plan_memory`` for the plan, which raises ``MemoryPlanError`` naming
the term and flags when the serve cannot fit. ``plan_log_lines`` is the boot log: one line per
owner, then the KV line.
"""

from __future__ import annotations

from pathlib import Path

import torch

from metrale_config import ModelConfig, read_bool_lever
from metrale_model_arch import (
    KvCacheDtype,
    Quantization,
    planned_tokens_per_image,
    read_model_config,
    resolve_model,
    serves_images,
)
from metrale_model_arch.memory import (
    GLM5_NEXT_MODEL_TYPES,
    DraftInputs,
    EncoderInputs,
    MemoryPlan,
    PlanInputs,
    draft_max_seq_len,
    paged_indexer_bytes_per_token,
    plan_memory,
)
from metrale_model_arch.parallel import shard_config
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.sliding_window_ring import SlidingWindowCache, ring_specs_of
from metrale_server.args import CPU_KV_CACHE_DEFAULT_GIB, DEFAULT_BLOCK_SIZE, EngineArgs
from metrale_server.devices import resolve_quantization
from metrale_server.memory.host_memory import host_total_memory_bytes

MIB = 2**20
GIB = 2**30


class PreflightError(RuntimeError):
    """The preflight could not run (e.g. the machine's memory size cannot be read)."""


def device_total_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    total = host_total_memory_bytes()
    if total is None:
        raise PreflightError(
            "cannot read this machine's memory size (/proc/meminfo); pass --num-kv-blocks"
        )
    return total


def indexer_paged() -> bool:
    """GLM-5.3's DSA indexer is paged in the KV pool unless METRALE_GLM_DSA_INDEXER_FLAT=1."""
    return not read_bool_lever("METRALE_GLM_DSA_INDEXER_FLAT")


def resolve_block_size(args: EngineArgs, config: ModelConfig) -> int:
    """``--block-size`` as given; unset, ``DEFAULT_BLOCK_SIZE``, or with the paged DSA indexer
    (which keeps each pool of ``index_kpool`` tokens in one block) the least multiple of
    ``index_kpool`` not below it. Raises ``ValueError`` naming the flag when a given size
    cannot hold whole pools."""
    pool = config.dsa.index_kpool if config.dsa is not None and indexer_paged() else None
    if args.block_size is None:
        return DEFAULT_BLOCK_SIZE if pool is None else -(-DEFAULT_BLOCK_SIZE // pool) * pool
    if pool is not None and args.block_size % pool:
        raise ValueError(
            f"--block-size {args.block_size} is not a multiple of index_kpool ({pool}): the "
            f"paged DSA indexer keeps each pool of {pool} tokens in one block; pass a multiple "
            f"of {pool}, leave it unset, or set METRALE_GLM_DSA_INDEXER_FLAT=1"
        )
    return args.block_size


def kv_cache_max_bytes(args: EngineArgs, device: torch.device) -> int | None:
    """``--kv-cache-memory-gib`` in bytes; unset, 4 GiB on the CPU and no cap on CUDA."""
    gib = args.kv_cache_memory_gib
    if gib is None and device.type == "cpu":
        gib = CPU_KV_CACHE_DEFAULT_GIB
    return None if gib is None else int(gib * GIB)


def plan_inputs(
    args: EngineArgs,
    config: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    total_bytes: int | None = None,
    quantization: Quantization | None = None,
) -> PlanInputs:
    """``quantization``: the weights' format as loaded (``None``: as ``args`` resolves it).

    Raises ``ValueError`` naming ``--block-size`` when the paged DSA indexer cannot use it.
    """
    if quantization is None:
        quantization = engine_quantization(args, config, device=device, dtype=dtype)
    paged = indexer_paged()
    block_size = resolve_block_size(args, config)
    speculative = args.speculative_config
    is_mtp = speculative is not None and speculative.is_mtp
    if is_mtp:
        check_mtp_config(config)
    draft = None
    if speculative is not None and speculative.model is not None:
        quantization_spec = speculative.quantization or args.quantization
        draft = draft_inputs(
            speculative.model, quantization_spec, device, dtype, args.kernel_backend
        )
    return PlanInputs(
        device_kind=device.type,
        total_bytes=device_total_bytes(device) if total_bytes is None else total_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype_bytes=dtype.itemsize,
        max_seq_len=args.max_seq_len or config.max_position_embeddings,
        block_size=block_size,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_max_bytes=kv_cache_max_bytes(args, device),
        spec_on=args.speculative_config is not None,
        indexer_paged=paged,
        quantization=quantization,
        mtp=is_mtp,
        kv_cache_dtype=KvCacheDtype.parse(args.kv_cache_dtype),
        draft=draft,
        encoder=encoder_inputs(args, config),
        sliding_window_cache=SlidingWindowCache.parse(args.sliding_window_cache),
    )


def encoder_inputs(args: EngineArgs, config: ModelConfig) -> EncoderInputs | None:
    """What to reserve for images: nothing for a config the engine runs text-only (its
    vision tower left out), else one image's most tokens under the checkpoint's own
    preprocessing and an encoder cache of ``--encoder-cache-tokens`` (default: the larger of
    ``--max-prefill-tokens`` and one image)."""
    if not serves_images(config):
        return None
    per_image = planned_tokens_per_image(config, model_directory(args.model))
    cache_tokens = args.encoder_cache_tokens or max(args.max_batch_tokens, per_image)
    return EncoderInputs(
        max_tokens_per_image=per_image,
        cache_tokens=cache_tokens,
        batch_tokens=args.max_batch_tokens,
    )


def model_directory(model: str | None) -> Path | None:
    """The checkpoint directory of ``model`` (a config.json's own), a GGUF's mmproj file (its
    preprocessing), or ``None`` (a GGUF without one)."""
    if model is not None and model.endswith(".json") and Path(model).is_file():
        return Path(model).parent
    source = resolve_model(model)
    return source.path if source.kind == "dir" else source.mmproj


def check_mtp_config(config: ModelConfig) -> None:
    """``ValueError`` naming the flag for method mtp on a config without MTP layers."""
    if config.mtp is None:
        raise ValueError(
            f"--speculative-config method mtp: {config.model_type} ({config.source}) has no "
            "MTP layers (num_nextn_predict_layers is 0, or the model type has none, as "
            "deepseek_v2); use method ngram or draft_model"
        )


def draft_inputs(
    model: str,
    quantization: str,
    device: torch.device,
    dtype: torch.dtype,
    kernel_backend: str = "auto",
) -> DraftInputs:
    """The draft model's config and weight format: ``quantization`` as it resolves for the
    draft's own model type (verification keeps the output exact whatever the draft's format).
    ``ValueError`` names the flag."""
    try:
        config = read_model_config(resolve_model(model))
    except (ValueError, OSError) as error:
        raise ValueError(f"--speculative-config model {model!r}: {error}") from error
    return DraftInputs(
        config=config,
        quantization=resolve_quantization(quantization, device, dtype, config, kernel_backend),
    )


def plan_engine_memory(
    args: EngineArgs,
    config: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    total_bytes: int | None = None,
    quantization: Quantization | None = None,
) -> MemoryPlan:
    """The plan for serving ``config`` with ``args``; raises ``MemoryPlanError`` if it cannot.

    With ``tensor_parallel_size`` N, the plan of one rank: its weights (the model's over N)
    and its KV heads, from ``shard_config`` (raising ``TensorParallelError``, a
    ``ValueError``, when N does not split the model).
    """
    inputs = plan_inputs(
        args, config, device=device, dtype=dtype, total_bytes=total_bytes, quantization=quantization
    )
    return plan_memory(shard_config(config, args.tensor_parallel_size), inputs)


def engine_quantization(
    args: EngineArgs, config: ModelConfig, *, device: torch.device, dtype: torch.dtype
) -> Quantization:
    """The weights' format ``args`` asks for, ``auto`` resolved for one rank's part of the model
    (q4 blocks must tile each rank's projections)."""
    if args.quantization == Quantization.FP8 and args.tensor_parallel_size > 1:
        raise ValueError(
            "--quantization fp8 runs on one rank: not with --tensor-parallel-size "
            f"{args.tensor_parallel_size}"
        )
    rank_config = shard_config(config, args.tensor_parallel_size)
    return resolve_quantization(args.quantization, device, dtype, rank_config, args.kernel_backend)


def weight_format(inputs: PlanInputs) -> str:
    """``int8 per channel, float32 activations`` / ``float32``: how the weights are stored."""
    activations = {4: "float32", 2: "16-bit"}.get(inputs.dtype_bytes, f"{inputs.dtype_bytes}-byte")
    if inputs.quantization == Quantization.INT8:
        return f"int8 per channel + {activations} norms and activations"
    if inputs.quantization == Quantization.Q4:
        return f"q4 blocks + int8 embeddings and head + {activations} norms and activations"
    if inputs.quantization == Quantization.FP8:
        return f"fp8 per channel + {activations} embeddings, head, norms and activations"
    return activations


def kv_format(inputs: PlanInputs) -> str:
    """``model dtype`` / ``int8 K/V + ...``: how K/V attention layers store the pool."""
    if inputs.kv_cache_dtype is KvCacheDtype.AUTO:
        return "model dtype"
    return f"{inputs.kv_cache_dtype} K/V + a float16 scale per token and kv head"


def _kv_format_note(inputs: PlanInputs) -> str:
    """Nothing at the model dtype (the KV line as the Rust engine prints it), else the format."""
    return "" if inputs.kv_cache_dtype is KvCacheDtype.AUTO else f", {kv_format(inputs)}"


def plan_log_lines(plan: MemoryPlan, config: ModelConfig) -> list[str]:
    """The boot log of the plan: one line per owner, then the KV line."""
    inputs = plan.inputs
    weights = plan.weights
    tied = " (tied to the embeddings)" if config.tie_word_embeddings else ""
    mtp = f" + MTP layers {_mb(weights.mtp)} MiB" if weights.mtp else ""
    mtp += f" + vision tower {_mb(weights.vision)} MiB" if weights.vision else ""
    lines = [
        f"Weights ({weight_format(inputs)}): {_gb(weights.total())} GiB = embeddings "
        f"{_mb(weights.embeddings)} MiB + layers {_mb(weights.layers)} MiB + final norm "
        f"{_mb(weights.final_norm)} MiB + lm_head {_mb(weights.lm_head)} MiB{tied}{mtp}",
        f"RoPE table: {_mb(plan.rope_table_bytes)} MiB ({inputs.max_seq_len} positions, float32)",
    ]
    if config.model_type in GLM5_NEXT_MODEL_TYPES and inputs.indexer_paged and config.dsa:
        per_token = paged_indexer_bytes_per_token(config.dsa.index_head_dim, inputs.dtype_bytes)
        lines.append(
            f"GLM-5.3 DSA indexer: paged in each DSA layer's KV pool, {per_token} B per token "
            "per DSA layer inside the KV price; nothing reserved per sequence for the target's "
            "layers (METRALE_GLM_DSA_INDEXER_FLAT=1 restores the flat cache)"
        )
    if plan.per_sequence_reserve_bytes > 0:
        lines.append(
            f"Per-sequence state reserve: {_mb(plan.per_sequence_reserve_bytes)} MiB = "
            f"{max(plan.max_batch_size, 1)} seq x ({_mb(plan.per_sequence.target_layers)} MiB "
            f"target DSA layers + {_mb(plan.per_sequence.proposer)} MiB proposer). Owned per "
            "sequence, replicated per rank (EP does not shard the indexer)."
        )
    else:
        lines.append("Per-sequence state reserve: 0 MiB (this model owns no per-sequence state)")
    if plan.linear_state_pool_bytes > 0:
        lines.append(
            f"Linear-attention state pool: {_mb(plan.linear_state_pool_bytes)} MiB = "
            f"{plan.max_batch_size + 1} slots (one dummy) of recurrent + conv state"
        )
    if plan.sliding_window_kv_bytes > 0:
        lines.append(_sliding_window_kv_line(plan, config))
    elif inputs.ring is not None and ring_specs_of(
        cache_specs(config, indexer_paged=inputs.indexer_paged, ring=inputs.ring)
    ):
        lines.append(
            "Sliding-window layers: in the KV pool (rings for "
            f"{max(plan.max_batch_size, 1)} slots would hold no more tokens in the budget)"
        )
    if inputs.draft is not None:
        draft = inputs.draft
        lines.append(
            f"Draft model ({draft.config.model_type}, {draft.quantization}): "
            f"{_mb(plan.draft_model_bytes)} MiB weights; its own KV pool "
            f"{_mb(plan.draft_kv_pool_bytes)} MiB = {plan.kv_blocks} blocks (one per KV block) "
            f"of {plan.draft_kv_block_bytes} B; positions up to "
            f"{draft_max_seq_len(draft.config, inputs.max_seq_len)}"
        )
    if inputs.mtp and plan.draft_kv_bytes_per_token:
        lines.append(
            f"MTP draft pool: {_mb(plan.draft_kv_pool_bytes)} MiB = {plan.kv_blocks} blocks (one "
            f"per KV block) of {plan.draft_kv_block_bytes} B for the MTP layer's K/V"
        )
    if inputs.encoder is not None:
        encoder = inputs.encoder
        lines.append(
            f"Image encoder: output cache {_mb(plan.encoder_cache_bytes)} MiB "
            f"({encoder.cache_tokens} image tokens, up to {encoder.max_tokens_per_image} an "
            f"image) + batch activations {_mb(plan.encoder_activation_bytes)} MiB "
            f"({encoder.encoder_batch_tokens} image tokens a batch; not allocated at start)"
        )
    lines += [
        f"Buffer arena: {_mb(plan.buffer_arena_bytes)} MiB (step inputs for "
        f"--max-prefill-tokens={inputs.max_batch_tokens}, logits for {plan.max_batch_size} rows)",
        f"Runtime headroom: {_mb(plan.runtime_headroom_bytes)} MiB (runtime floor + the widest "
        "step's activations and attention scratch; not allocated at start)",
    ]
    if inputs.max_batch_size is None:
        lines.append(
            f"--max-batch-size auto: {plan.max_batch_size} slot(s) admit "
            f"{plan.admitted_sequences} sequence(s) at the full --max-seq-len={inputs.max_seq_len}"
        )
    lines.append(
        f"KV cache: {_gb(inputs.total_bytes)} GiB total x {inputs.gpu_memory_utilization:.0%} util "
        f"= {_gb(plan.budget_bytes)} GiB budget; {_gb(plan.pre_kv_bytes)} GiB weights + "
        f"{_gb(plan.reserve_bytes)} GiB reserve -> {_gb(plan.kv_pool_bytes)} GiB for KV -> "
        f"{plan.kv_blocks} blocks x {inputs.block_size} tok/block = {plan.max_kv_tokens} max "
        f"KV tokens ({plan.kv_bytes_per_token} B/token{_kv_format_note(inputs)})"
    )
    return lines


def _sliding_window_kv_line(plan: MemoryPlan, config: ModelConfig) -> str:
    inputs = plan.inputs
    specs = cache_specs(
        config,
        indexer_paged=inputs.indexer_paged,
        kv_cache_dtype=inputs.kv_cache_dtype,
        ring=plan.ring,
    )
    rings = ring_specs_of(specs)
    first = rings[0]
    return (
        f"Sliding-window K/V rings: {_mb(plan.sliding_window_kv_bytes)} MiB = "
        f"{max(plan.max_batch_size, 1)} seq x {len(rings)} layers x {first.ring_tokens} tokens "
        f"(window {first.sliding_window} + {first.step_tokens} a step, prefill chunked to "
        f"{first.step_tokens}); those layers cost nothing in the KV pool "
        "(--sliding-window-cache full keeps them there)"
    )


def _mb(num_bytes: int) -> str:
    return f"{num_bytes / MIB:.1f}"


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f}"
