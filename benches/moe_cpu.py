"""MoE models on the CPU: the engine's prefill and decode tok/s against HF transformers on the
same random weights, in the same run.

    python benches/moe_cpu.py [--family qwen3_moe] [--layers 8] [--hidden 768] [--experts N]
        [--top-k K] [--expert-width W] [--prompt-len 256] [--decode-tokens 64]
        [--kernel-backend auto] [--model-dir DIR] [--cpu-time]

A checkpoint of the family's shape but small (by default 8 layers, hidden 768, 8 query heads of
64 over 2 KV heads) with random weights, saved with safetensors and the bundled model's tokenizer
(SmolLM2's vocabulary). The families and their defaults (experts, top-k, expert width):

* ``qwen3_moe``: 64 experts top-8, 256 wide, every layer sparse, top-k renormalized.
* ``mixtral``: 8 experts top-2, 1024 wide.
* ``gpt_oss``: 32 experts top-4, 768 wide, sliding and full layers alternating with a 128-token
  window, learned sinks, the clamped SwiGLU of alpha 1.702 and limit 7.0.

Then:

* prefill: 8 prompts of ``--prompt-len`` tokens, one output token each; prompt tokens / s.
* decode, 1 stream and 8 streams: ``--decode-tokens`` output tokens per stream after a 16-token
  prompt, greedy, ``ignore_eos``; output tokens / s (the short prefill included on both sides).

Ours: ``LLM(model=..., dtype="float32", quantization="none", enable_prefix_caching=False)`` (the
timed runs repeat the warm-up's prompts) with ``--kernel-backend``. HF:
the family's ``*ForCausalLM`` float32, ``generate`` (greedy, the batch as one static batch).
Each side is warmed up once with the same load, then timed; the best of ``--repeats`` runs is
printed with the ratio ours / HF. On a shared machine, compare the ratios rather than the
absolute rates, or time with ``--cpu-time``: the process's CPU seconds (``time.process_time``)
instead of the wall clock, which other processes' load does not stretch (run it with one thread,
``OMP_NUM_THREADS=1``, so that CPU seconds are the wall time the run would take alone).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from bench_host import cpu_line

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model
from metrale_server import LLM, SamplingParams

NUM_PREFILL_PROMPTS = 8
DECODE_PROMPT_LEN = 16
STREAMS = (1, 8)
NUM_HEADS = 8
NUM_KV_HEADS = 2
HEAD_DIM = 64


class Family(NamedTuple):
    model_class: str
    experts: int
    top_k: int
    expert_width: int
    config: Callable[[argparse.Namespace, Tokenizer], Any]


def _common(args: argparse.Namespace, tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_experts_per_tok": args.top_k,
        "max_position_embeddings": 4096,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": 0,
    }


def qwen3_moe_config(args: argparse.Namespace, tokenizer: Tokenizer) -> Any:
    import transformers

    return transformers.Qwen3MoeConfig(
        **_common(args, tokenizer),
        intermediate_size=args.expert_width,
        moe_intermediate_size=args.expert_width,
        num_experts=args.experts,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def mixtral_config(args: argparse.Namespace, tokenizer: Tokenizer) -> Any:
    import transformers

    return transformers.MixtralConfig(
        **_common(args, tokenizer),
        intermediate_size=args.expert_width,
        num_local_experts=args.experts,
    )


def gpt_oss_config(args: argparse.Namespace, tokenizer: Tokenizer) -> Any:
    import transformers

    return transformers.GptOssConfig(
        **_common(args, tokenizer),
        intermediate_size=args.expert_width,
        num_local_experts=args.experts,
        sliding_window=128,
        swiglu_limit=7.0,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    )


FAMILIES = {
    "qwen3_moe": Family("Qwen3MoeForCausalLM", 64, 8, 256, qwen3_moe_config),
    "mixtral": Family("MixtralForCausalLM", 8, 2, 1024, mixtral_config),
    "gpt_oss": Family("GptOssForCausalLM", 32, 4, 768, gpt_oss_config),
}


def hf_model_class(family: Family) -> Any:
    import transformers

    return getattr(transformers, family.model_class)


def save_checkpoint(path: Path, family: Family, args: argparse.Namespace) -> Path:
    """The family's random checkpoint, with the bundled model's tokenizer."""
    tokenizer = Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)
    model: Any = hf_model_class(family)(family.config(args, tokenizer))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = torch.randn(tensor.shape, generator=generator)
            if "norm" in name:
                tensor.copy_(1.0 + 0.1 * noise)
            elif name.endswith("sinks"):
                tensor.copy_(noise)
            else:
                tensor.copy_(noise * tensor.shape[-1] ** -0.5)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)
    return path


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(1000, 40000, (length,), generator=generator).tolist() for _ in range(count)
    ]


Clock = Callable[[], float]


def time_ours(llm: LLM, batch: list[list[int]], max_tokens: int, clock: Clock) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = clock()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params)
    elapsed = clock() - start
    for output in outputs:
        assert output.error is None, output.error
        assert len(output.outputs[0].token_ids) == max_tokens
    return elapsed


def time_hf(model: Any, batch: list[list[int]], max_tokens: int, clock: Clock) -> float:
    input_ids = torch.tensor(batch)
    start = clock()
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    elapsed = clock() - start
    assert out.shape[1] == input_ids.shape[1] + max_tokens
    return elapsed


def best_rate(
    run: Callable[[list[list[int]], int], float],
    batch: list[list[int]],
    max_tokens: int,
    tokens: int,
    repeats: int,
) -> float:
    run(batch, max_tokens)  # warm-up
    return max(tokens / run(batch, max_tokens) for _ in range(repeats))


def parse_args(default_family: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default=default_family)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--experts", type=int, help="the family's default when not given")
    parser.add_argument("--top-k", type=int, help="the family's default when not given")
    parser.add_argument("--expert-width", type=int, help="the family's default when not given")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kernel-backend", default="auto", help="LLM(kernel_backend=...)")
    parser.add_argument("--model-dir", type=Path, help="reuse (or write) the checkpoint here")
    parser.add_argument("--no-baseline", action="store_true", help="skip HF transformers")
    parser.add_argument("--cpu-time", action="store_true", help="CPU seconds, not wall time")
    args = parser.parse_args()
    family = FAMILIES[args.family]
    args.experts = args.experts or family.experts
    args.top_k = args.top_k or family.top_k
    args.expert_width = args.expert_width or family.expert_width
    return args


def main(default_family: str = "qwen3_moe") -> None:
    args = parse_args(default_family)
    family = FAMILIES[args.family]
    clock: Clock = time.process_time if args.cpu_time else time.perf_counter

    print(cpu_line())
    print(f"threads: {torch.get_num_threads()}, clock: {clock.__name__}")
    with tempfile.TemporaryDirectory() as scratch:
        path = args.model_dir or Path(scratch)
        if not (path / "config.json").exists():
            path.mkdir(parents=True, exist_ok=True)
            save_checkpoint(path, family, args)
        print(
            f"{args.family}: {args.layers} layers, hidden {args.hidden}, {args.experts} experts "
            f"top-{args.top_k}, {args.expert_width} wide, float32"
        )
        loads = {
            "prefill": (prompts(NUM_PREFILL_PROMPTS, args.prompt_len, 1), 1),
            **{
                f"decode x{n}": (prompts(n, DECODE_PROMPT_LEN, 2), args.decode_tokens)
                for n in STREAMS
            },
        }

        def tokens(name: str) -> int:
            batch, max_tokens = loads[name]
            return len(batch) * (len(batch[0]) if name == "prefill" else max_tokens)

        llm = LLM(
            str(path),
            dtype="float32",
            quantization="none",
            kernel_backend=args.kernel_backend,
            enable_prefix_caching=False,
        )
        print(llm.engine.loaded.model.backend.describe())
        ours = {
            name: best_rate(
                lambda b, m: time_ours(llm, b, m, clock),
                batch,
                max_tokens,
                tokens(name),
                args.repeats,
            )
            for name, (batch, max_tokens) in loads.items()
        }
        llm.close()
        if args.no_baseline:
            for name, rate in ours.items():
                print(f"{name}: metrale {rate:.1f} tok/s")
            return
        hf_model: Any = hf_model_class(family).from_pretrained(path, dtype=torch.float32)
        hf_model.eval()
        for name, (batch, max_tokens) in loads.items():
            theirs = best_rate(
                lambda b, m: time_hf(hf_model, b, m, clock),
                batch,
                max_tokens,
                tokens(name),
                args.repeats,
            )
            print(
                f"{name}: metrale {ours[name]:.1f} tok/s, HF generate {theirs:.1f} tok/s, "
                f"ratio {ours[name] / theirs:.2f}x"
            )


if __name__ == "__main__":
    main()
