"""Prompt scoring and embedding throughput of the engine against HF transformers, same run.

    python benches/prompt_reads.py [--quick] [--num-prompts 64] [--tasks both|loglikelihood|embed]
        [--hf-batch-size 16] [--seed 0]

Two reads of a prompt that generate nothing, on the bundled default model (SmolLM2-135M-Instruct,
a Q4_1 GGUF), CPU. The workload: 64 prompts (``--quick``: 16) of random token ids, lengths
drawn from 64..512 (seeded), the shape of lm-eval's loglikelihood requests (context plus
continuation).

loglikelihood: every prompt token's log-probability given the tokens before it (lm-eval's
loglikelihood request). The engine: ``SamplingParams(temperature=0, max_tokens=1,
prompt_logprobs=1)``, the logprobs computed in the prefill. The baseline: what lm-eval's HF
backend does, requests sorted by length (longest first), batches of 16 right-padded with token
0 and no attention mask (causal: the padding follows every real token), each fed without its
last token, the model's forward, ``log_softmax`` over the whole batch's logits, then each
request's next-token logprobs gathered (and the argmax compared, lm-eval's ``is_greedy``).
Throughput = prompt tokens scored (every token but each prompt's first) / wall seconds.

embed: each prompt's normalized last-token final hidden state (after the final norm). The
engine: ``LLM(task="embed")`` (the model loaded without its head; this model's head is its
tied embeddings anyway), ``SamplingParams(pooling=PoolingParams(method="last",
normalize=True))``. The baseline: HF ``model.model(input_ids, attention_mask)`` (the base
model, as sentence-transformers calls it), length-sorted batches of 16 right-padded, each
sequence's last real token's ``last_hidden_state``, L2 normalized. Throughput = prompt tokens /
wall seconds.

Each task runs the engine with its defaults (``quantization="auto"``: the GGUF's Q4_1 blocks
stay q4 where the native cpu kernels run them, else float32), then in float32
(``quantization="none"``, ``dtype="float32"``: the same dequantized weights HF runs, as
``offline_throughput.py --compare both`` does; skipped when the defaults are float32 already),
then HF transformers in float32 (it cannot run q4: it dequantizes the GGUF). Warm-up, every
side: the engine's layer steps compiled and native kernels built first, then one untimed run of
4 other prompts (another seed, so no timed prompt is in the engine's prefix cache) before the
timed run; HF: one untimed batch of the same 4.

Correctness, same run: the float32 engine's logprobs must equal HF's within 1e-3 at every
position and its embeddings within 1e-4 in every component (the max abs diffs are printed; the
q4 engine's too, for information: other weights). A failed check prints ``FAIL`` and exits 1.

Printed: the CPU (model, flags), each run, then a table: task, side, weight format, tokens/s,
ratio engine / HF, max abs diff against HF.

Caveats: a 2-core machine shared with other work drifts between runs, and each side is timed
once; compare ratios, not absolute rates, across machines (the CPU line says which kernels ran).
The q4 rows compare different weight formats (q4 against HF's float32), said in the table. The
HF loglikelihood baseline computes ``log_softmax`` over the padded positions too (lm-eval does);
length sorting keeps the padding small. The engine's loglikelihood run also samples one token per
request (``max_tokens`` is at least 1), from the last row its prefill computes anyway. Run time
on 2 AVX2 cores without int8 dot products: ``--quick`` under 3 minutes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch
from bench_host import cpu_line
from offline_throughput import checkpoint_weights, engine_format, make_requests, start_engine

from metrale_server import LLM, SamplingParams
from metrale_server.engine.layer_compiler import LayerCompiler
from metrale_server.pooling import PoolingParams

PROMPT_RANGE = (64, 512)
NUM_WARMUP = 4
TOLERANCES = {"loglikelihood": 1e-3, "embed": 1e-4}
FLOAT32: dict[str, Any] = {"quantization": "none", "dtype": "float32"}

# (model or LLM, prompts) -> (seconds, the results in prompt order, flat for the logprobs)
EngineRun = Callable[[LLM, list[list[int]]], tuple[float, torch.Tensor]]
HFRun = Callable[[Any, list[list[int]], int], tuple[float, torch.Tensor]]


def make_prompts(num_prompts: int, seed: int) -> list[list[int]]:
    """Random token ids (1000..39999), lengths drawn from :data:`PROMPT_RANGE`."""
    return [ids for ids, _ in make_requests(num_prompts, PROMPT_RANGE, (1, 1), seed)]


def short_format(llm: LLM) -> str:
    """``q4``, ``int8``, or the dtype of a float engine (``float32``)."""
    loaded = llm.engine.loaded
    if loaded.quantization in ("q4", "int8"):
        return str(loaded.quantization)
    return str(loaded.dtype).removeprefix("torch.")


# --- the engine ---


def engine_loglikelihood(llm: LLM, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    """Seconds, and the logprobs of every prompt's tokens ``1..n-1``, one prompt after
    another in one flat tensor."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    elapsed = time.perf_counter() - start
    values: list[float] = []
    for output, ids in zip(outputs, prompts, strict=True):
        assert output.error is None, output.error
        entries = output.prompt_logprobs
        assert entries is not None
        assert len(entries) == len(ids)
        assert entries[0] is None
        for entry, token_id in zip(entries[1:], ids[1:], strict=True):
            assert entry is not None
            assert entry.token_id == token_id
            values.append(entry.logprob)
    return elapsed, torch.tensor(values, dtype=torch.float64)


def engine_embed(llm: LLM, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    """Seconds, and the prompts' normalized last-token states, one row each."""
    params = SamplingParams(pooling=PoolingParams(method="last", normalize=True))
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    elapsed = time.perf_counter() - start
    vectors = []
    for output in outputs:
        assert output.error is None, output.error
        assert output.pooled is not None
        vectors.append(output.pooled)
    return elapsed, torch.tensor(vectors, dtype=torch.float64)


# --- HF transformers ---


def load_hf() -> Any:
    """The bundled GGUF in transformers, every tensor dequantized to float32 (as
    ``offline_throughput.py`` loads it)."""
    import transformers

    from metrale_model_arch import resolve_model

    gguf = resolve_model(None).path
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    return model.eval()


def longest_first(prompts: list[list[int]]) -> list[int]:
    """The prompts' indices, longest first (lm-eval's order: batches of like lengths)."""
    return sorted(range(len(prompts)), key=lambda index: -len(prompts[index]))


def hf_loglikelihood(
    model: Any, prompts: list[list[int]], batch_size: int
) -> tuple[float, torch.Tensor]:
    """lm-eval's HF loglikelihood loop: longest first, batches right-padded with 0 and no
    attention mask, each prompt fed without its last token, ``log_softmax`` over the batch's
    logits, each prompt's next tokens gathered (and lm-eval's greedy check)."""
    results: list[list[float]] = [[] for _ in prompts]
    order = longest_first(prompts)
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            width = len(prompts[batch[0]]) - 1
            inputs = torch.zeros((len(batch), width), dtype=torch.int64)
            for row, index in enumerate(batch):
                ids = prompts[index]
                inputs[row, : len(ids) - 1] = torch.tensor(ids[:-1])
            logprobs = torch.log_softmax(model(inputs).logits, dim=-1)
            for row, index in enumerate(batch):
                ids = prompts[index]
                rows = logprobs[row, : len(ids) - 1]
                target = torch.tensor(ids[1:])
                results[index] = rows.gather(1, target[:, None])[:, 0].tolist()
                bool((rows.argmax(dim=-1) == target).all())  # lm-eval's is_greedy
    elapsed = time.perf_counter() - start
    return elapsed, torch.tensor([value for values in results for value in values]).double()


def hf_embed(model: Any, prompts: list[list[int]], batch_size: int) -> tuple[float, torch.Tensor]:
    """Longest first, right-padded batches with their attention mask, the base model's
    ``last_hidden_state`` at each sequence's last real token, L2 normalized."""
    vectors = torch.empty((len(prompts), model.config.hidden_size), dtype=torch.float64)
    order = longest_first(prompts)
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            width = len(prompts[batch[0]])
            inputs = torch.zeros((len(batch), width), dtype=torch.int64)
            mask = torch.zeros((len(batch), width), dtype=torch.int64)
            for row, index in enumerate(batch):
                ids = prompts[index]
                inputs[row, : len(ids)] = torch.tensor(ids)
                mask[row, : len(ids)] = 1
            hidden = model.model(input_ids=inputs, attention_mask=mask).last_hidden_state
            last = hidden[torch.arange(len(batch)), mask.sum(dim=1) - 1]
            vectors[batch] = torch.nn.functional.normalize(last, p=2.0, dim=-1).double()
    return time.perf_counter() - start, vectors


# --- the comparison ---


@attrs.frozen(kw_only=True)
class Row:
    """One line of the table; ``diff`` is ``None`` for the baseline."""

    task: str
    side: str
    weights: str
    rate: float
    diff: float | None
    same_weights: bool


def run_task(
    task: str,
    prompts: list[list[int]],
    warmup: list[list[int]],
    num_tokens: int,
    hf_model: Any,
    hf_batch_size: int,
) -> tuple[list[Row], str]:
    """The engine's defaults, the engine in float32 (unless the defaults are float32), HF;
    the rows and what the checkpoint stores."""
    embed = task == "embed"
    run_engine: EngineRun = engine_embed if embed else engine_loglikelihood
    run_hf: HFRun = hf_embed if embed else hf_loglikelihood
    task_args: dict[str, Any] = {"task": "embed"} if embed else {}
    engine_runs: list[tuple[str, str, float, torch.Tensor, bool]] = []
    stored = ""
    for side, overrides in (("metrale defaults", {}), ("metrale float32", FLOAT32)):
        if overrides and engine_runs and engine_runs[0][4]:
            continue  # the defaults are float32 already
        arguments = {**task_args, **overrides}
        llm = start_engine(arguments)
        loaded = llm.engine.loaded
        is_float32 = loaded.quantization == "none" and loaded.dtype == torch.float32
        steps = LayerCompiler.state(llm.engine.core.compiler, loaded.model)
        stored = checkpoint_weights(llm)
        run_engine(llm, warmup)
        elapsed, values = run_engine(llm, prompts)
        rate = num_tokens / elapsed
        call = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
        print(
            f"{task}: metrale LLM({call}), {engine_format(llm)}, {steps} layer steps: "
            f"{rate:.1f} tok/s ({elapsed:.1f} s)"
        )
        engine_runs.append((side, short_format(llm), rate, values, is_float32))
        llm.close()
        del llm, loaded
        gc.collect()

    run_hf(hf_model, warmup, hf_batch_size)
    hf_elapsed, hf_values = run_hf(hf_model, prompts, hf_batch_size)
    hf_rate = num_tokens / hf_elapsed
    what = "model.model, last token, normalized" if embed else "forward, log_softmax, gather"
    print(
        f"{task}: HF transformers ({what}), float32 ({stored} dequantized), length-sorted "
        f"batches of {hf_batch_size}: {hf_rate:.1f} tok/s ({hf_elapsed:.1f} s)"
    )
    rows = [
        Row(
            task=task,
            side=side,
            weights=weights,
            rate=rate,
            diff=float((values - hf_values).abs().max()),
            same_weights=is_float32,
        )
        for side, weights, rate, values, is_float32 in engine_runs
    ]
    rows.append(
        Row(
            task=task,
            side="HF transformers",
            weights="float32",
            rate=hf_rate,
            diff=None,
            same_weights=True,
        )
    )
    return rows, stored


def print_table(rows: list[Row]) -> None:
    baselines = {row.task: row.rate for row in rows if row.diff is None}
    lines = [("task", "side", "weights", "tok/s", "engine/HF", "max |diff| vs HF")]
    for row in rows:
        if row.diff is None:
            ratio, diff = "baseline", "-"
        else:
            ratio = f"{row.rate / baselines[row.task]:.2f}x"
            if row.same_weights:
                verdict = "ok" if row.diff < TOLERANCES[row.task] else "FAIL"
                diff = f"{row.diff:.1e} ({verdict}, < {TOLERANCES[row.task]:g})"
            else:
                diff = f"{row.diff:.1e} (other weights)"
        lines.append((row.task, row.side, row.weights, f"{row.rate:.1f}", ratio, diff))
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    for line in lines:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        print("  ".join(cells).rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 prompts")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--tasks", choices=("both", "loglikelihood", "embed"), default="both")
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(cpu_line())
    prompts = make_prompts(16 if args.quick else args.num_prompts, args.seed)
    warmup = make_prompts(NUM_WARMUP, args.seed + 1)  # another seed: no prefix-cache hits
    num_prompt = sum(len(ids) for ids in prompts)
    print(
        f"threads: {torch.get_num_threads()}  prompts: {len(prompts)} (lengths "
        f"{PROMPT_RANGE[0]}..{PROMPT_RANGE[1]})  prompt tokens: {num_prompt}"
    )
    print(
        f"warm-up, every side: one untimed run of {NUM_WARMUP} other prompts before each timed "
        "run (the engine's layer steps compiled and native kernels built first)"
    )
    hf_model = load_hf()
    tasks = ("loglikelihood", "embed") if args.tasks == "both" else (args.tasks,)
    rows: list[Row] = []
    stored = ""
    for task in tasks:
        # loglikelihood scores every token but each prompt's first; embed reads them all
        num_tokens = num_prompt - len(prompts) if task == "loglikelihood" else num_prompt
        task_rows, stored = run_task(
            task, prompts, warmup, num_tokens, hf_model, args.hf_batch_size
        )
        rows += task_rows

    print(
        f"\ntokens/s: loglikelihood counts the tokens scored ({num_prompt - len(prompts)}: all "
        f"but each prompt's first), embed the prompt tokens ({num_prompt}); checkpoint: {stored}"
    )
    print_table(rows)
    failed = [
        row
        for row in rows
        if row.same_weights and row.diff is not None and not row.diff < TOLERANCES[row.task]
    ]
    if failed:
        print(f"FAIL: the float32 engine differs from HF beyond the tolerance: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
