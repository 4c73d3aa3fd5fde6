"""The click options that shape the memory plan, shared by ``met serve`` and ``met memory``.

``@plan_options`` adds them to a command and hands the command one ``plan: PlanOptions``
argument instead of ten, from which ``engine_args`` builds the ``EngineArgs``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import click

from metrale_server.arg_choices import (
    DTYPE_NAMES,
    KERNEL_BACKEND_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    QUANTIZATION_CHOICES,
    SLIDING_WINDOW_CACHE_CHOICES,
    TASK_CHOICES,
)
from metrale_server.args import EngineArgs
from metrale_server.speculative_config import SpeculativeConfig

_DEFAULTS = EngineArgs()
F = TypeVar("F", bound=Callable[..., Any])


class BatchSizeType(click.ParamType):  # type: ignore[type-arg]
    """A positive integer, or ``auto``."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            number = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a positive integer nor 'auto'", param, ctx)
        if number < 1:
            self.fail(f"{number} is not >= 1", param, ctx)
        return number


@attrs.frozen(kw_only=True)
class PlanOptions:
    max_seq_len: int | None
    block_size: int | None
    gpu_memory_utilization: float
    max_batch_size: int | None
    max_prefill_tokens: int
    num_kv_blocks: int | None
    kv_cache_memory_gib: float | None
    dtype: str
    quantization: str
    kv_cache_dtype: str
    sliding_window_cache: str
    device: str
    speculative_config: SpeculativeConfig | None
    tensor_parallel_size: int
    enable_prefix_caching: bool
    enforce_eager: bool
    kernel_backend: str
    task: str
    limit_mm_per_prompt: int
    encoder_cache_tokens: int | None

    def engine_args(self, model: str | None, **fields: Any) -> EngineArgs:
        return EngineArgs(
            model=model,
            dtype=self.dtype,
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            device=self.device,
            block_size=self.block_size,
            max_seq_len=self.max_seq_len,
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_prefill_tokens,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory_gib=self.kv_cache_memory_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            speculative_config=self.speculative_config,
            tensor_parallel_size=self.tensor_parallel_size,
            **{
                "enable_prefix_caching": self.enable_prefix_caching,
                "enforce_eager": self.enforce_eager,
                "kernel_backend": self.kernel_backend,
                "task": self.task,
                "images_per_prompt": self.limit_mm_per_prompt,
                "encoder_cache_tokens": self.encoder_cache_tokens,
                "sliding_window_cache": self.sliding_window_cache,
                **fields,
            },
        )


_PLAN_FIELDS = tuple(field.name for field in attrs.fields(PlanOptions))


def _speculative_config(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> SpeculativeConfig | None:
    if value is None:
        return None
    try:
        return SpeculativeConfig.from_json(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from error


def _limit_mm_per_prompt(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    """vLLM's JSON ``{"image": N}`` (a bare N also reads as the image limit)."""
    if value is None:
        return _DEFAULTS.images_per_prompt
    try:
        limits = json.loads(value)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", ctx=ctx, param=param) from error
    if isinstance(limits, int) and not isinstance(limits, bool):
        limits = {"image": limits}
    if not isinstance(limits, dict) or set(limits) - {"image", "video", "audio"}:
        raise click.BadParameter("expected JSON such as '{\"image\": 4}'", ctx=ctx, param=param)
    for kind in ("video", "audio"):
        if limits.get(kind, 0) != 0:
            raise click.BadParameter(
                f"{kind} inputs are not served (only images)", ctx=ctx, param=param
            )
    count = limits.get("image", _DEFAULTS.images_per_prompt)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise click.BadParameter(
            f"image must be an integer >= 0, got {count!r}", ctx=ctx, param=param
        )
    return count


def plan_options(command: F) -> F:
    """``--max-seq-len``, ``--block-size``, ``--gpu-memory-utilization``, ``--max-batch-size``,
    ``--max-prefill-tokens``, ``--num-kv-blocks``, ``--kv-cache-memory-gib``, ``--dtype``,
    ``--quantization``, ``--kv-cache-dtype``, ``--device``, ``--speculative-config`` and
    ``--tensor-parallel-size``."""
    options = [
        click.option(
            "--max-seq-len",
            type=click.IntRange(min=1),
            default=None,
            help="Most tokens in one sequence (prompt + output). Default: the model's context.",
        ),
        click.option(
            "--block-size",
            type=click.IntRange(min=1),
            default=None,
            help="Tokens per KV-cache block. Default: 16, or with GLM-5.3's paged DSA indexer "
            "the least multiple of index_kpool not below 16.",
        ),
        click.option(
            "--gpu-memory-utilization",
            type=click.FloatRange(0.0, 1.0, min_open=True),
            default=_DEFAULTS.gpu_memory_utilization,
            show_default=True,
            help="Fraction of device memory the server may use, in (0, 1]: of the GPU's total "
            "on CUDA, of physical RAM (or the cgroup limit, if smaller) on the CPU. Weights, "
            "reserve and the KV pool must fit in it.",
        ),
        click.option(
            "--max-batch-size",
            type=BatchSizeType(),
            default=_DEFAULTS.max_batch_size,
            show_default=True,
            help="Most sequences the engine runs in one step (a request with n > this is "
            "refused); below it, free KV blocks limit the running set. 'auto': the count in "
            "1..128 that admits the most full-length sequences.",
        ),
        click.option(
            "--max-prefill-tokens",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_batch_tokens,
            show_default=True,
            help="Token budget of one engine step (prompt chunks plus decodes); longer prompts "
            "are prefilled in chunks.",
        ),
        click.option(
            "--num-kv-blocks",
            type=click.IntRange(min=1),
            default=None,
            help="KV pool size in blocks (it must fit the budget). Default: what the budget "
            "leaves after weights and reserve, up to what the batch slots can use at full length.",
        ),
        click.option(
            "--kv-cache-memory-gib",
            type=click.FloatRange(0.0, min_open=True),
            default=None,
            help="Most GiB the KV pool takes (never less than one full-length sequence). "
            "Default: 4 on the CPU (pages become resident only as the cache fills); on CUDA, "
            "no cap: whatever the memory budget leaves.",
        ),
        click.option(
            "--dtype",
            type=click.Choice(["auto", *DTYPE_NAMES]),
            default="auto",
            show_default=True,
            help="Activation and weight dtype. auto: the checkpoint's own where the device "
            "computes it natively (bf16 on a CPU only with AVX512-BF16 or AMX), else float32 "
            "on the CPU; bfloat16 on CUDA for a checkpoint that names none (GGUF).",
        ),
        click.option(
            "--quantization",
            "-q",
            type=click.Choice(QUANTIZATION_CHOICES),
            default=_DEFAULTS.quantization,
            show_default=True,
            help="Weight format of the projections, embeddings and head. auto keeps the "
            "checkpoint's own: a Q4_1 GGUF's blocks as q4 (with the native cpu kernels), any "
            "other checkpoint as none (its weights in --dtype). int8 (lossy, asked for only): "
            "int8 weights per output row (a quarter of float32's bytes) times activations in two "
            "int8 digits, about 2x faster decode on a CPU with AVX2 or better. q4: the layers' "
            "projections in 4-bit blocks of 32 (GGUF's Q4_1, 5 bits a weight), embeddings and "
            "head int8. fp8 (vLLM's, lossy): the projections float8 e4m3 per output channel "
            "(an fp8 checkpoint's kept), activations fp8 per token, torch._scaled_mm; on a CPU "
            "half bf16's memory but slow.",
        ),
        click.option(
            "--kv-cache-dtype",
            type=click.Choice(KV_CACHE_DTYPE_CHOICES),
            default=_DEFAULTS.kv_cache_dtype,
            show_default=True,
            help="How K/V attention layers store their cache. auto: the serve dtype. int8, fp8 "
            "(= fp8_e4m3), fp8_e5m2 (lossy, asked for only): one byte a value and a float16 "
            "scale per token and kv head, so the same budget holds ~2x the tokens of bfloat16 "
            "(~3.9x those of float32). Not for MLA latent caches (GLM-5.3).",
        ),
        click.option(
            "--sliding-window-cache",
            type=click.Choice(SLIDING_WINDOW_CACHE_CHOICES),
            default=_DEFAULTS.sliding_window_cache,
            show_default=True,
            help="Where sliding-window layers keep their K/V. ring: each sequence holds only its "
            "window (and one step's tokens) in a ring of its own, so the KV pool prices those "
            "layers at nothing and holds several times the tokens (every family with sliding "
            "windows: gemma2, gemma3, gpt-oss, mistral, mixtral, qwen2, qwen3, qwen3_moe, "
            "qwen2_5_vl, phi3, smollm3; prefill is chunked to fit the ring, prefix caching is "
            "off). full: every token in the KV pool, as full attention.",
        ),
        click.option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            default=_DEFAULTS.enable_prefix_caching,
            show_default=True,
            help="Reuse the KV blocks of prompt prefixes computed before (usage reports them as "
            "prompt_tokens_details.cached_tokens).",
        ),
        click.option(
            "--enforce-eager",
            is_flag=True,
            default=_DEFAULTS.enforce_eager,
            help="Never compile the layer steps with torch.compile (by default a dense "
            "llama-family model on the CPU compiles them in the background while eager steps "
            "serve).",
        ),
        click.option(
            "--kernel-backend",
            type=click.Choice(KERNEL_BACKEND_CHOICES),
            default=_DEFAULTS.kernel_backend,
            show_default=True,
            help="What runs attention, norms, rotary and the other ops: torch (the reference), "
            "cpu (native C++ kernels for int8/q4 matmuls and attention, built on this machine; "
            "needs a C++ compiler), cupy (CUDA kernels; needs a CUDA device and CuPy), auto "
            "(cupy on CUDA where CuPy can run, cpu on a CPU with a compiler).",
        ),
        click.option(
            "--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto."
        ),
        click.option(
            "--task",
            type=click.Choice(TASK_CHOICES),
            default=_DEFAULTS.task,
            show_default=True,
            help="What the model serves: generate (completions, chat, messages, responses), "
            "embed (/v1/embeddings; the model is loaded without its head), score (/v1/score "
            "and /v1/rerank, from a yes/no reranker such as Qwen3-Reranker); auto: embed for a "
            "sentence-transformers model (modules.json with a Pooling module), else generate.",
        ),
        click.option(
            "--speculative-config",
            default=None,
            callback=_speculative_config,
            help='Speculative decoding, as vLLM spells it: JSON such as \'{"method": "ngram", '
            '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\' (n-gram prompt lookup) or '
            '\'{"method": "draft_model", "model": "PATH", "num_speculative_tokens": 4}\' (a '
            "smaller model with the same tokenizer drafts; its weights and KV pool are "
            'planned) or \'{"method": "mtp", "num_speculative_tokens": 1}\' (the model\'s own '
            "multi-token-prediction layer drafts: glm4_moe, DeepSeek-V3, GLM-5.3, Qwen3-Next); off "
            "by default.",
        ),
        click.option(
            "--tensor-parallel-size",
            "-tp",
            type=click.IntRange(min=1),
            default=_DEFAULTS.tensor_parallel_size,
            show_default=True,
            help="Ranks the model is split over (attention heads, MLP rows, vocabulary, MoE "
            "experts); the plan is one rank's. `met serve` starts the other ranks on this host "
            "(gloo on the CPU, NCCL on CUDA), or, under torchrun, joins the ranks it started "
            "(default then: WORLD_SIZE).",
        ),
        click.option(
            "--limit-mm-per-prompt",
            default=None,
            callback=_limit_mm_per_prompt,
            help="Most images one request may carry, as vLLM spells it: '{\"image\": 4}'. "
            f"Default: {_DEFAULTS.images_per_prompt} for a model with a vision tower the server "
            "serves (GLM-5.3); '{\"image\": 0}' serves text only and leaves the tower "
            "unloaded and unplanned.",
        ),
        click.option(
            "--encoder-cache-tokens",
            type=click.IntRange(min=1),
            default=None,
            help="Image tokens of vision-tower output kept so a repeated image (a multi-turn "
            "chat) is not encoded again; allocated at start and planned. Default: the larger "
            "of the step's token budget and one image's most tokens.",
        ),
    ]

    @functools.wraps(command)
    def with_plan(*args: Any, **kwargs: Any) -> Any:
        plan = PlanOptions(**{name: kwargs.pop(name) for name in _PLAN_FIELDS})
        return command(*args, plan=plan, **kwargs)

    for option in reversed(options):
        with_plan = option(with_plan)
    return with_plan  # type: ignore[return-value]
