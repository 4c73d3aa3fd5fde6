"""Offline throughput at tensor-parallel size 2 against 1, on this machine's CPU (gloo).

    python benches/tp_throughput.py [--num-requests 16] [--layers 8]

A random Llama (hidden 512, 8 heads, 4 KV heads, SmolLM2's 49,152-token vocabulary), float32,
saved to a temporary directory; the same greedy requests (``ignore_eos``) through ``LLM()``
with ``tensor_parallel_size`` 1 and 2, both eager. Throughput = output tokens / wall time of
``generate``, after a warm-up request. With two ranks on one host each step also pays a
broadcast of its inputs, two all-reduces per layer and a gather of the logits, while the
ranks share the machine's cores: on a 2-core machine expect no gain (the figure is for the
record). Rank 0 runs with torch's thread count (``OMP_NUM_THREADS``), each worker with the
cores over the ranks. Prints one line per size, then the ratio.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers
from bench_host import cpu_line

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model
from metrale_server import LLM, SamplingParams


def save_model(path: Path, num_layers: int) -> None:
    tokenizer = Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=num_layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)


def tokens_per_s(model: Path, world_size: int, prompts: list[list[int]], max_tokens: int) -> float:
    with LLM(
        str(model),
        dtype="float32",
        quantization="none",
        max_seq_len=512,
        num_kv_blocks=512,
        tensor_parallel_size=world_size,
        enforce_eager=True,  # as a split model always runs: no background compile meanwhile
    ) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        llm.generate({"prompt_token_ids": prompts[0]}, params)
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    print(cpu_line())
    rng = random.Random(0)
    prompts = [
        [rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)]
        for _ in range(args.num_requests)
    ]
    with tempfile.TemporaryDirectory(prefix="metrale-tp-bench-") as directory:
        model = Path(directory)
        save_model(model, args.layers)
        rates = {size: tokens_per_s(model, size, prompts, args.max_tokens) for size in (1, 2)}
    for size, rate in rates.items():
        print(f"tensor-parallel size {size}: {rate:.1f} output tok/s")
    print(
        f"TP=2 / TP=1: {rates[2] / rates[1]:.2f} ({torch.get_num_threads()} torch threads on "
        f"rank 0; {args.num_requests} requests x {args.max_tokens} tokens)"
    )


if __name__ == "__main__":
    main()
