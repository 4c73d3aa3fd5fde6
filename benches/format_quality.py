"""Quality of each CPU weight format of the bundled default model: perplexity and greedy agreement.

    python benches/format_quality.py [--formats fp32,bf16,int8,q4,kv-int8,kv-fp8,awq,gptq]
        [--json PATH]
        [--llama-perplexity PATH/TO/llama-perplexity]

The bundled default model (SmolLM2-135M-Instruct, a Q4_1 GGUF) is loaded in each format:
``fp32`` (the Q4_1 weights dequantized to float32), ``bf16`` (dequantized to bfloat16),
``int8`` (float32 model, ``quantization="int8"``: int8 weights with per-channel scales,
activations in two int8 digits) and ``q4`` (``quantization="q4"``: the projections' Q4_1 blocks
kept, embeddings and head int8, activations in two int8 digits). Asked for by name (not in the
default set: each adds a quantization and a perplexity run), ``awq`` and ``gptq`` are the
fp32 weights quantized by our own round-to-nearest writer
(:mod:`metrale_model_arch.int4_quantize`, through ``met quantize``'s
:func:`~metrale_model_arch.quantize.quantize_checkpoint`; no calibration) into AWQ's GEMM
layout and GPTQ's symmetric v1 layout, groups of 64 (SmolLM2's 576 features are not whole
groups of 128; ``awq-g32`` and ``gptq-g32``: groups of 32), saved to a temporary directory
and served as q4 (the projections repacked, embeddings and head int8). NOTE: the fp32 weights
are the GGUF's Q4_1 values, on a grid ``m + d q`` per block of 32 (a float min ``m``) that AWQ's
and GPTQ's grids ``(q - z) s`` (an integer zero ``z``) cannot follow: measured over the
projections, the relative RMS error of round to nearest is 0 on Q4_1's own grid (float min,
groups of 32), 8.0% with a float min in groups of 64, 8.2% for awq-g32, 9.4% awq, 9.9%
gptq-g32, 10.7% gptq (every block of 32 spans 0: the integer zero is the whole loss at 32). So
these measure int4 of already-4-bit weights, not of the bf16 weights issue 31's goals assume.
``-cal`` (``fp8-cal``, ``awq-cal``, ``gptq-cal``, ``awq-g32-cal``, ``gptq-g32-cal``) is GPTQ's
error-compensating rounding (``met quantize --calibration``, which offers it for fp8, and for gptq
with ``--act-order``):
sequential calibration (:mod:`metrale_model_arch.sequential_calibration`), the model rounded a
layer at a time over the first 2048 tokens of ``benches/data/calibration_text.txt`` (original
prose, not the evaluation text), each projection's Hessian from its inputs through the layers
and projections rounded before it. Measured (2 shared Xeon cores, ``--formats
fp32,fp8-cal,gptq,gptq-cal,awq-g32,gptq-g32 --max-tokens 4``), perplexity, all tokens: fp32
22.144; fp8-cal 22.912 (+3.47%; llama.cpp-style +3.09%; the all-at-once Hessians of before:
+2.86%); gptq 34.419 (+55.4%), gptq-cal 47.257 (+113.4%); awq-g32 30.620 (+38.3%; awq-g32-cal
33.521, +51.4%, in a run of its own); gptq-g32 34.732 (+56.8%); llama.cpp's Q4_1 22.504
llama.cpp-style (+0.44% against fp32's 22.406). Calibrated int4 is worse than round to nearest
though each layer's error on the text it saw falls 2.5-7x; calibrated on the evaluation text
itself gptq measured 30.402 (+37%): 2048 tokens of one text overfit. ``-act-cal``
(``gptq-act-cal``, ``gptq-g32-act-cal``): GPTQ's act-order too (``desc_act``, ``met quantize
--act-order``), each projection's columns rounded by decreasing Hessian diagonal, the groups in
that order. Measured (``--formats fp32,gptq,gptq-cal,gptq-act-cal --max-tokens 4``, the same
machine): gptq-act-cal 39.984 (+80.6%; llama.cpp-style +60.8%) against gptq-cal 47.257 (+113.4%,
the same figure as before GPTQ ran once a projection: the same bytes) and gptq 34.419 (+55.4%).
``llama-perplexity``: llama.cpp's, given by ``--llama-perplexity`` or found where
``/work/shared/tools/build-llama-server.sh`` builds it
(``~/.cache/metrale-peers/llama.cpp/build/bin``).
``fp8`` (asked for by name too) is the fp32 weights quantized by our own writer
(:mod:`metrale_model_arch.fp8_quantize`, as ``met quantize`` does) into DeepSeek-V3's block-wise
FP8 layout (e4m3, a float32 scale per 128x128 block of each projection, the rest float32),
served dequantized to float32 at load. Measured (2 shared EPYC cores): perplexity 23.312 against
fp32's 22.144 (+5.3%; llama.cpp-style +6.2%), 0 of 20 prompts token-identical: e4m3's three
mantissa bits leave each weight off by 2.6% RMS (int8 per channel: 0.85%) on this small model.
Each format is loaded once, as ``LLM(model=..., dtype=..., quantization=...)``, and both
measurements run on that engine's model.

Perplexity: ``benches/data/perplexity_text.txt`` (public-domain English prose: the Declaration
of Independence and chapter 1 of Pride and Prejudice, ~2,850 tokens) is tokenized with the
model's own tokenizer and split into non-overlapping ``--ctx``-token chunks (512), each run as a
fresh sequence: one prefill of the whole chunk through the model's forward over a paged KV
cache, logits at every position, teacher forcing. Two figures:

* all tokens: every token after the first of its chunk is scored (the last, shorter chunk too);
* llama.cpp-style: like ``llama-perplexity -c 512``, full chunks only, and only the second half
  of each chunk is scored (tokens ``ctx/2 + 1 .. ctx - 1``, each seeing at least ``ctx/2``
  tokens of context; the first token of a chunk becomes BOS when the tokenizer adds one).

Greedy agreement: 20 fixed prompts (10 plain continuations, 10 chat turns through the model's
chat template), 64 new tokens each, temperature 0, ``ignore_eos``, all in one ``generate``
call. Each format is compared with fp32: how many of the 20 are token-identical, and the mean
index of the first differing token (identical ones count as 64).

``--llama-perplexity PATH`` also runs llama.cpp's ``llama-perplexity`` on the same GGUF and text
(``-m GGUF -f TEXT -c CTX -t 2``) and prints its final estimate beside our llama.cpp-style
figure. llama.cpp runs the Q4_1 weights natively (its dot products quantize activations to
8 bits), so the closest of ours is fp32 (the same Q4_1 weights, dequantized).

fp32 always runs (it is the reference). A format whose loader keyword (``quantization``) this
checkout lacks is left out of the default set and refused when asked for.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from bench_host import cpu_line, host_fields

from metrale_kernels import build_attention_metadata
from metrale_model_arch import KvCacheDtype, LoadedModel, allocate_kv_cache
from metrale_model_arch.calibration import Calibration
from metrale_server import LLM, EngineArgs, SamplingParams

TEXT_PATH = Path(__file__).parent / "data" / "perplexity_text.txt"
# NOTE: not the evaluation text: GPTQ calibrated on the text it is scored on would flatter it.
CALIBRATION_PATH = Path(__file__).parent / "data" / "calibration_text.txt"
BLOCK_SIZE = 16
# Where /work/shared/tools/build-llama-server.sh (and benches/peer_llamacpp.py) build llama.cpp.
DEFAULT_LLAMA_PERPLEXITY = (
    Path.home() / ".cache" / "metrale-peers" / "llama.cpp" / "build" / "bin" / "llama-perplexity"
)


@dataclass(frozen=True)
class Format:
    name: str
    dtype: str  # EngineArgs.dtype
    quantization: str  # EngineArgs.quantization / load_model(quantization=...)
    # An int4 checkpoint written from the fp32 weights: (method, group size, symmetric).
    int4: tuple[str, int, bool] | None = None
    # An FP8 e4m3 checkpoint written from the fp32 weights: its (rows, columns) blocks.
    fp8_block: tuple[int, int] | None = None
    # EngineArgs.kv_cache_dtype: how the KV cache stores K and V.
    kv_cache_dtype: str = "auto"
    # GPTQ-rounded with Hessians from CALIBRATION_PATH (int4 and fp8 checkpoints).
    is_calibrated: bool = False
    # GPTQ's act-order (desc_act): the columns by decreasing Hessian diagonal (calibrated gptq).
    is_act_order: bool = False


FORMATS = {
    "fp32": Format("fp32", "float32", "none"),
    "bf16": Format("bf16", "bfloat16", "none"),
    "int8": Format("int8", "float32", "int8"),
    "q4": Format("q4", "float32", "q4"),
    "awq": Format("awq", "float32", "q4", int4=("awq", 64, False)),
    "gptq": Format("gptq", "float32", "q4", int4=("gptq", 64, True)),
    "awq-g32": Format("awq-g32", "float32", "q4", int4=("awq", 32, False)),
    "gptq-g32": Format("gptq-g32", "float32", "q4", int4=("gptq", 32, True)),
    "awq-cal": Format("awq-cal", "float32", "q4", int4=("awq", 64, False), is_calibrated=True),
    "gptq-cal": Format("gptq-cal", "float32", "q4", int4=("gptq", 64, True), is_calibrated=True),
    "awq-g32-cal": Format(
        "awq-g32-cal", "float32", "q4", int4=("awq", 32, False), is_calibrated=True
    ),
    "gptq-g32-cal": Format(
        "gptq-g32-cal", "float32", "q4", int4=("gptq", 32, True), is_calibrated=True
    ),
    "gptq-act-cal": Format(
        "gptq-act-cal",
        "float32",
        "q4",
        int4=("gptq", 64, True),
        is_calibrated=True,
        is_act_order=True,
    ),
    "gptq-g32-act-cal": Format(
        "gptq-g32-act-cal",
        "float32",
        "q4",
        int4=("gptq", 32, True),
        is_calibrated=True,
        is_act_order=True,
    ),
    "fp8": Format("fp8", "float32", "none", fp8_block=(128, 128)),
    "fp8-cal": Format("fp8-cal", "float32", "none", fp8_block=(128, 128), is_calibrated=True),
    "fp8-online": Format("fp8-online", "float32", "fp8"),
    "kv-int8": Format("kv-int8", "float32", "none", kv_cache_dtype="int8"),
    "kv-fp8": Format("kv-fp8", "float32", "none", kv_cache_dtype="fp8_e4m3"),
    "kv-fp8-e5m2": Format("kv-fp8-e5m2", "float32", "none", kv_cache_dtype="fp8_e5m2"),
}
DEFAULT_FORMATS = ("fp32", "bf16", "int8", "q4", "kv-int8", "kv-fp8")

COMPLETION_PROMPTS = [
    "The history of the printing press begins",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The mitochondria is the part of the cell that",
    "In 1969, astronauts landed on the Moon and",
    "The best way to learn a new language is",
    "def fibonacci(n):\n    ",
    "Water boils at 100 degrees Celsius because",
    "The city of Paris is known for",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain photosynthesis to a ten-year-old.",
    "Give me three tips for sleeping better.",
    "What is the difference between a virus and a bacterium?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Suggest a name for a friendly pet turtle.",
    "What are the main causes of climate change?",
]


@dataclass(frozen=True)
class Perplexity:
    ppl: float  # all tokens after the first of each chunk
    scored_tokens: int
    llama_style_ppl: float  # second half of each full chunk, as llama-perplexity
    llama_style_scored_tokens: int
    seconds: float


@dataclass(frozen=True)
class Agreement:
    identical: int
    num_prompts: int
    mean_first_divergence: float  # identical prompts count as max_tokens
    first_divergences: list[int]  # of the prompts that differ, in prompt order
    per_prompt: list[int | None]  # first divergence of every prompt, None where identical


@dataclass(frozen=True)
class LlamaCppPerplexity:
    ppl: float
    error: float | None
    num_chunks: int | None


def accepts_keyword(target: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(target).parameters


def quantization_kwargs(quantization: str) -> dict[str, str]:
    """``{"quantization": ...}`` for ``LLM``; ``{}`` for "none" where the keyword is missing."""
    if accepts_keyword(EngineArgs, "quantization"):
        return {"quantization": quantization}
    if quantization == "none":
        return {}
    raise SystemExit(
        f"quantization={quantization!r}: EngineArgs has no 'quantization' field in this checkout"
    )


def available_formats() -> list[str]:
    has_keyword = accepts_keyword(EngineArgs, "quantization")
    return [name for name, fmt in FORMATS.items() if has_keyword or fmt.quantization == "none"]


def make_llm(fmt: Format, scratch: Path) -> LLM:
    if fmt.kv_cache_dtype != "auto":
        return LLM(
            model=None,
            dtype=fmt.dtype,
            kv_cache_dtype=fmt.kv_cache_dtype,
            quantization=fmt.quantization,
        )
    if fmt.fp8_block is not None:
        return LLM(model=str(write_fp8(fmt, scratch)), dtype=fmt.dtype)
    if fmt.quantization == "fp8":
        return fp8_online_llm(fmt, scratch)
    if fmt.int4 is None:
        return LLM(model=None, dtype=fmt.dtype, **quantization_kwargs(fmt.quantization))
    return LLM(model=str(write_int4(fmt, scratch)), dtype=fmt.dtype, quantization=fmt.quantization)


def write_fp8(fmt: Format, scratch: Path) -> Path:
    """The default model's fp32 weights as a block-wise FP8 checkpoint (the rest fp32), with its
    tokenizer (``met quantize --method fp8`` writes the rest bfloat16)."""
    from metrale_model_arch import resolve_model
    from metrale_model_arch.fp8_quantize import Fp8Layout
    from metrale_model_arch.quantize import QuantizeMethod, QuantizeSpec, quantize_checkpoint

    assert fmt.fp8_block is not None
    layout = Fp8Layout(method="fp8", granularity="block", block=fmt.fp8_block)
    spec = QuantizeSpec(
        method=QuantizeMethod.FP8, fp8_layout=layout, calibration=calibration_for(fmt)
    )
    return quantize_checkpoint(resolve_model(None), scratch / fmt.name, spec).out


def fp8_online_llm(fmt: Format, scratch: Path) -> LLM:
    """``--quantization fp8`` (W8A8: fp8 weights per channel, activations fp8 per token) of the
    fp32 weights, written as a float32 safetensors directory first: fp8 refuses the Q4_1 GGUF."""
    from fp8_speed import write_float_checkpoint

    model = write_float_checkpoint(scratch / fmt.name, torch.float32)
    return LLM(model=str(model), dtype=fmt.dtype, quantization=fmt.quantization)


def write_int4(fmt: Format, scratch: Path) -> Path:
    """The default model's fp32 weights as ``fmt``'s int4 checkpoint, with its tokenizer (as
    ``met quantize`` writes it)."""
    from metrale_model_arch import resolve_model
    from metrale_model_arch.quantize import QuantizeMethod, QuantizeSpec, quantize_checkpoint

    assert fmt.int4 is not None
    method, group_size, is_symmetric = fmt.int4
    spec = QuantizeSpec(
        method=QuantizeMethod(method),
        group_size=group_size,
        is_symmetric=is_symmetric,
        calibration=calibration_for(fmt),
        is_act_order=fmt.is_act_order,
    )
    return quantize_checkpoint(resolve_model(None), scratch / fmt.name, spec).out


def calibration_for(fmt: Format) -> Calibration | None:
    """``met quantize --calibration``'s: the first 2048 tokens of ``CALIBRATION_PATH``."""
    return Calibration(text_path=CALIBRATION_PATH) if fmt.is_calibrated else None


def split_chunks(tokens: Sequence[int], ctx: int, *, full_only: bool) -> list[list[int]]:
    """Non-overlapping ``ctx``-token chunks; the shorter tail too unless ``full_only``."""
    chunks = [list(tokens[start : start + ctx]) for start in range(0, len(tokens), ctx)]
    return [c for c in chunks if len(c) == ctx or (not full_only and len(c) > 1)]


def chunk_nll(
    loaded: LoadedModel, chunk: Sequence[int], kv_cache_dtype: KvCacheDtype
) -> torch.Tensor:
    """``(len(chunk) - 1,)`` float64: NLL of token ``i + 1`` given tokens ``0..i``.

    One sequence, a prefill of the whole chunk into a fresh paged KV cache of
    ``kv_cache_dtype`` (its attention reads the cache it wrote, quantized or not).
    """
    num_blocks = -(-len(chunk) // BLOCK_SIZE)
    kv_caches = allocate_kv_cache(
        loaded.config,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        dtype=loaded.dtype,
        device=loaded.device,
        kv_cache_dtype=kv_cache_dtype,
    )
    metadata = build_attention_metadata(
        block_tables=[list(range(num_blocks))],
        seq_lens=[len(chunk)],
        query_lens=[len(chunk)],
        block_size=BLOCK_SIZE,
        device=loaded.device,
    )
    input_ids = torch.tensor(chunk, dtype=torch.int64, device=loaded.device)
    positions = torch.arange(len(chunk), dtype=torch.int64, device=loaded.device)
    with torch.inference_mode():
        hidden = loaded.model(input_ids, positions, kv_caches, metadata)
        logits = loaded.model.compute_logits(hidden[:-1]).double()
        log_probs = torch.log_softmax(logits, dim=-1)
        return -log_probs.gather(1, input_ids[1:, None]).squeeze(1).cpu()


def perplexity(
    loaded: LoadedModel, tokens: Sequence[int], ctx: int, kv_cache_dtype: KvCacheDtype
) -> Perplexity:
    start = time.perf_counter()
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def nll(chunk: list[int]) -> torch.Tensor:
        key = tuple(chunk)
        if key not in cache:
            cache[key] = chunk_nll(loaded, chunk, kv_cache_dtype)
        return cache[key]

    every = [nll(chunk) for chunk in split_chunks(tokens, ctx, full_only=False)]
    bos = loaded.tokenizer.bos_token_id if loaded.tokenizer.add_bos_token else None
    halves = []
    for chunk in split_chunks(tokens, ctx, full_only=True):
        if bos is not None:
            chunk[0] = bos
        halves.append(nll(chunk)[ctx // 2 :])
    all_nll, half_nll = torch.cat(every), torch.cat(halves)
    return Perplexity(
        ppl=math.exp(all_nll.mean().item()),
        scored_tokens=all_nll.numel(),
        llama_style_ppl=math.exp(half_nll.mean().item()),
        llama_style_scored_tokens=half_nll.numel(),
        seconds=time.perf_counter() - start,
    )


def prompts_for(loaded: LoadedModel) -> list[str]:
    chats = [loaded.render_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    return COMPLETION_PROMPTS + chats


def greedy_tokens(llm: LLM, prompts: Sequence[str], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt": p} for p in prompts], params)
    for output in outputs:
        assert output.error is None, output.error
        assert len(output.outputs[0].token_ids) == max_tokens
    return [list(output.outputs[0].token_ids) for output in outputs]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def agreement(
    reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]], max_tokens: int
) -> Agreement:
    divergences = [first_divergence(r, c) for r, c in zip(reference, candidate, strict=True)]
    differing = [d for d in divergences if d is not None]
    counted = [max_tokens if d is None else d for d in divergences]
    return Agreement(
        identical=len(divergences) - len(differing),
        num_prompts=len(divergences),
        mean_first_divergence=sum(counted) / len(counted),
        first_divergences=differing,
        per_prompt=divergences,
    )


def run_llama_perplexity(
    binary: Path, gguf: Path, text: Path, ctx: int, threads: int
) -> LlamaCppPerplexity:
    command = [str(binary), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "-t", str(threads)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode < 0:
        # A GGML_NATIVE build's AMX path can die from a signal in a VM that does not grant AMX
        # tile state: its weights kept in the GGUF's layout run everywhere.
        print(f"llama-perplexity died from signal {-result.returncode}: again with --no-repack")
        command.append("--no-repack")
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    log = result.stdout + result.stderr
    final = re.search(r"Final estimate: PPL = ([0-9.]+)(?: \+/- ([0-9.]+))?", log)
    if result.returncode != 0 or final is None:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{log[-2000:]}")
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    return LlamaCppPerplexity(
        ppl=float(final.group(1)),
        error=float(final.group(2)) if final.group(2) else None,
        num_chunks=int(chunks.group(1)) if chunks else None,
    )


def print_perplexity_table(
    results: dict[str, Perplexity], ctx: int, llama_cpp: LlamaCppPerplexity | None
) -> None:
    reference = results["fp32"]
    print(
        f"| format | PPL, all tokens ({ctx}-token chunks) | vs fp32 "
        f"| PPL, llama.cpp-style (2nd half of each chunk) | vs fp32 | seconds |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r.ppl:.3f} | {r.ppl / reference.ppl - 1:+.2%} "
            f"| {r.llama_style_ppl:.3f} "
            f"| {r.llama_style_ppl / reference.llama_style_ppl - 1:+.2%} | {r.seconds:.1f} |"
        )
    if llama_cpp is not None:
        error = f" ± {llama_cpp.error:.3f}" if llama_cpp.error is not None else ""
        print(
            f"| llama.cpp `llama-perplexity` (Q4_1 native) | — | — "
            f"| {llama_cpp.ppl:.3f}{error} "
            f"| {llama_cpp.ppl / reference.llama_style_ppl - 1:+.2%} | — |"
        )


def print_agreement_table(results: dict[str, Agreement], max_tokens: int) -> None:
    print(
        f"| format | token-identical to fp32 | mean first divergence (of {max_tokens}) "
        f"| first divergence of the others |"
    )
    print("|---|---:|---:|---|")
    for name, r in results.items():
        others = ", ".join(str(d) for d in r.first_divergences) or "—"
        print(
            f"| {name} | {r.identical}/{r.num_prompts} | {r.mean_first_divergence:.1f} | {others} |"
        )


def parse_formats(spec: str | None) -> list[str]:
    available = available_formats()
    default = [name for name in available if name in DEFAULT_FORMATS]
    names = default if spec is None else [n.strip() for n in spec.split(",") if n.strip()]
    for name in names:
        if name not in FORMATS:
            raise SystemExit(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
        if name not in available:
            raise SystemExit(f"format {name!r} needs a 'quantization' keyword this checkout lacks")
    return ["fp32", *(n for n in names if n != "fp32")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--formats",
        help=f"comma-separated, of {','.join(FORMATS)} (default: {','.join(DEFAULT_FORMATS)})",
    )
    parser.add_argument("--text", type=Path, default=TEXT_PATH)
    parser.add_argument("--ctx", type=int, default=512, help="perplexity chunk length")
    parser.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument(
        "--llama-perplexity",
        type=Path,
        help=f"llama.cpp's llama-perplexity (default: {DEFAULT_LLAMA_PERPLEXITY} where built)",
    )
    parser.add_argument("--llama-threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    print(cpu_line())
    formats = parse_formats(args.formats)
    text = args.text.read_text(encoding="utf-8")

    ppl: dict[str, Perplexity] = {}
    greedy: dict[str, list[list[int]]] = {}
    gguf: Path | None = None
    num_tokens = 0
    scratch = Path(tempfile.mkdtemp(prefix="format-quality-"))
    for name in formats:
        start = time.perf_counter()
        llm = make_llm(FORMATS[name], scratch)
        loaded = llm.engine.loaded
        quantization = getattr(loaded, "quantization", "none")
        print(
            f"{name}: loaded in {time.perf_counter() - start:.1f} s "
            f"({loaded.dtype}, quantization {quantization})"
        )
        if loaded.source.kind == "gguf":
            gguf = loaded.source.path
        tokens = loaded.tokenizer.encode(text, add_special_tokens=True)
        num_tokens = len(tokens)
        ppl[name] = perplexity(loaded, tokens, args.ctx, llm.engine.plan.inputs.kv_cache_dtype)
        start = time.perf_counter()
        greedy[name] = greedy_tokens(llm, prompts_for(loaded), args.max_tokens)
        print(
            f"{name}: perplexity {ppl[name].seconds:.1f} s, "
            f"greedy {time.perf_counter() - start:.1f} s"
        )
        del llm, loaded

    agree = {
        name: agreement(greedy["fp32"], greedy[name], args.max_tokens)
        for name in formats
        if name != "fp32"
    }
    llama_cpp = None
    binary = args.llama_perplexity
    if binary is None and DEFAULT_LLAMA_PERPLEXITY.is_file():
        binary = DEFAULT_LLAMA_PERPLEXITY
    if binary is None:
        print(
            "llama.cpp's Q4_1 not measured: no --llama-perplexity given, none at "
            f"{DEFAULT_LLAMA_PERPLEXITY}"
        )
    elif gguf is not None:
        try:
            llama_cpp = run_llama_perplexity(binary, gguf, args.text, args.ctx, args.llama_threads)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"llama-perplexity did not give a figure: {error}")

    print(f"\nmodel: {gguf}\ntext: {args.text} ({num_tokens} tokens)\n")
    print_perplexity_table(ppl, args.ctx, llama_cpp)
    if llama_cpp is not None:
        print(
            "\nllama.cpp scores only the second half of each full chunk (and drops the tail), so "
            "compare it with the llama.cpp-style column, not the all-tokens one. It runs the "
            "Q4_1 weights natively with 8-bit activations in its dot products; ours dequantize "
            "them, so fp32 is the closest match. Chunks scored: llama.cpp "
            f"{llama_cpp.num_chunks}, ours {num_tokens // args.ctx}."
        )
    print()
    print_agreement_table(agree, args.max_tokens)
    if args.json is not None:
        figures = {
            "model": str(gguf),
            "host": host_fields(),
            "text": str(args.text),
            "num_tokens": num_tokens,
            "ctx": args.ctx,
            "max_tokens": args.max_tokens,
            "perplexity": {name: asdict(r) for name, r in ppl.items()},
            "greedy_agreement": {name: asdict(r) for name, r in agree.items()},
            "llama_cpp": asdict(llama_cpp) if llama_cpp is not None else None,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
