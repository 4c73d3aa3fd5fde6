"""Batch-1 decode with speculative decoding ÷ without, on the bundled default model.

    python benches/spec_decode.py [--num-speculative-tokens 4] [--repeats 3] [--eager]
    python benches/spec_decode.py --method draft_model [--draft-model PATH]
        [--quantization none] [--draft-quantization int8]
    python benches/spec_decode.py --method mtp --model PATH

Two workloads, each request run alone (batch 1) through ``metrale_server.LLM`` with its
defaults (weights in the checkpoint's format, ``--quantization auto``: the bundled Q4_1 GGUF
as q4 where the native cpu kernels run it, else float32; native or compiled layer steps, timed
once ready; the target's weight format and dtype are printed first):
an input-grounded one (chat prompts asking to repeat, edit or summarize a passage given in the
prompt, where the output copies from the input) and random prompts of token ids. Each runs with
``--speculative-config``'s proposer and without, greedy, 128 output tokens; decode tokens/s =
output tokens / time, the best of ``--repeats`` interleaved runs. Prints the speed-up (goal for
ngram: >= 1.8x on the grounded workload, at most 5% slower on random prompts), the drafts'
acceptance rate, and checks the outputs are identical token for token.

``--method draft_model`` drafts with ``--draft-model`` (default: the bundled model itself) in
``--draft-quantization``; with no smaller model of SmolLM2's tokenizer on this machine, the
default pairing is the model in ``--quantization none`` (float32) drafted by itself in int8.

``--method mtp`` drafts with the MTP layer of ``--model`` (a checkpoint that carries one, e.g.
a tiny random glm4_moe: with no trained MTP head here, its acceptance says nothing, and the
number to read is the step cost: the time of a speculative step (the MTP layer's drafts and
the target's verify forward over them) over a plain decode step's).
"""

from __future__ import annotations

import argparse
import random
import time

from bench_host import cpu_line

from metrale_model_arch import resolve_model
from metrale_server import LLM, SamplingParams
from metrale_server.speculative_config import SpeculativeConfig

PASSAGE = (
    "The lighthouse stood on a rock at the mouth of the harbour. Every evening the keeper "
    "climbed the ninety steps, trimmed the wick, wound the clockwork that turned the lens, and "
    "wrote the weather in a leather book. Ships coming home in the dark looked for its beam "
    "before anything else, and the fishermen said that as long as the light turned, the town "
    "would not forget them."
)
GROUNDED = [
    f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
    f"Rewrite this passage, replacing 'keeper' with 'guardian' and changing nothing else:"
    f"\n\n{PASSAGE}",
    f"Copy the passage below, then stop.\n\n{PASSAGE}",
    f"Quote the first three sentences of this text exactly:\n\n{PASSAGE}",
]


def run(llm: LLM, prompts: list[object], max_tokens: int) -> tuple[float, list[tuple[int, ...]]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = [llm.generate([prompt], params)[0] for prompt in prompts]  # type: ignore[list-item]
    elapsed = time.perf_counter() - start
    return elapsed, [output.outputs[0].token_ids for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="no compiled layer steps")
    parser.add_argument("--method", choices=("ngram", "draft_model", "mtp"), default="ngram")
    parser.add_argument("--model", default=None, help="the target; default: the bundled model")
    parser.add_argument("--draft-model", default=None, help="default: the bundled model")
    parser.add_argument("--quantization", default="auto", help="the target's --quantization")
    parser.add_argument("--draft-quantization", default="int8")
    args = parser.parse_args()
    print(cpu_line())
    if args.method == "ngram":
        config = SpeculativeConfig(
            num_speculative_tokens=args.num_speculative_tokens,
            prompt_lookup_max=args.num_speculative_tokens,
        )
    elif args.method == "mtp":
        config = SpeculativeConfig(method="mtp", num_speculative_tokens=args.num_speculative_tokens)
    else:
        config = SpeculativeConfig(
            method="draft_model",
            num_speculative_tokens=args.num_speculative_tokens,
            model=args.draft_model or str(resolve_model(None).path),
            quantization=args.draft_quantization,
        )
    common = {"max_batch_size": 1, "enforce_eager": args.eager, "quantization": args.quantization}
    plain = LLM(args.model, **common)
    speculative = LLM(args.model, speculative_config=config, **common)
    for llm in (plain, speculative):
        if llm.engine.core.compiler is not None:
            llm.engine.core.compiler.wait()
    loaded = plain.engine.loaded
    draft = f"; draft in {args.draft_quantization}" if args.method == "draft_model" else ""
    print(
        f"target weights: {loaded.quantization}, {str(loaded.dtype).removeprefix('torch.')} "
        f"(both runs){draft}"
    )
    tokenizer = plain.engine.loaded.tokenizer
    grounded = [
        {
            "prompt_token_ids": tokenizer.encode(
                plain.engine.loaded.render_chat([m]), add_special_tokens=False
            )
        }
        for m in ({"role": "user", "content": text} for text in GROUNDED)
    ]
    rng = random.Random(0)
    random_prompts = [
        {"prompt_token_ids": [rng.randrange(1000, 40000) for _ in range(64)]} for _ in range(4)
    ]
    num_output = len(GROUNDED) * args.max_tokens
    for name, prompts in (("input-grounded", grounded), ("random prompts", random_prompts)):
        before = speculative.engine.stats
        times: dict[str, list[float]] = {"plain": [], args.method: []}
        outputs: dict[str, list[tuple[int, ...]]] = {}
        for _ in range(args.repeats):
            for label, llm in (("plain", plain), (args.method, speculative)):
                seconds, outputs[label] = run(llm, prompts, args.max_tokens)
                times[label].append(seconds)
        after = speculative.engine.stats
        drafted = after.num_draft_tokens - before.num_draft_tokens
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
        plain_rate = num_output / min(times["plain"])
        spec_rate = num_output / min(times[args.method])
        same = sum(a == b for a, b in zip(outputs["plain"], outputs[args.method], strict=True))
        # Each step emits its kept drafts and one more token: fewer steps than tokens.
        num_steps = num_output - accepted / args.repeats
        step_cost = (min(times[args.method]) / num_steps) / (min(times["plain"]) / num_output)
        print(
            f"{name:15s} plain {plain_rate:6.1f} tok/s  {args.method} {spec_rate:6.1f} tok/s  "
            f"speed-up {spec_rate / plain_rate:.2f}x  acceptance {accepted}/{drafted} "
            f"({accepted / max(drafted, 1):.0%})  step cost {step_cost:.2f}x a plain step  "
            f"identical outputs {same}/{len(prompts)}"
        )


if __name__ == "__main__":
    main()
