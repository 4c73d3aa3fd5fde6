"""Default model load time: GGUF read + dequantize + build, against transformers' GGUF loader.

    python benches/load_time.py [--repeats 5] [--baseline]

Prints the median of ``--repeats`` loads and each stage's share; with ``--baseline`` also times
``AutoModelForCausalLM.from_pretrained(..., gguf_file=...)`` on the same file and prints the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from metrale_config import ModelConfig, read_gguf_header
from metrale_model_arch import ChatTemplate, Tokenizer, load_gguf_model, load_model, resolve_model


def time_stages(path: str) -> dict[str, float]:
    times: dict[str, float] = {}
    start = time.perf_counter()
    header = read_gguf_header(path)
    ModelConfig.from_gguf_header(header)
    times["header + config"] = time.perf_counter() - start
    start = time.perf_counter()
    load_gguf_model(header, dtype=torch.float32, device="cpu")
    times["dequantize + build"] = time.perf_counter() - start
    start = time.perf_counter()
    tokenizer = Tokenizer.from_gguf_fields(header.fields)
    ChatTemplate.from_gguf_fields(header.fields, special_tokens=tokenizer.special_tokens_map)
    times["tokenizer + template"] = time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", action="store_true", help="also time transformers")
    args = parser.parse_args()

    path = str(resolve_model(None).path)
    totals = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        load_model(None, dtype=torch.float32, device="cpu")
        totals.append(time.perf_counter() - start)
    ours = statistics.median(totals)
    print(f"model: {path}")
    print(f"metrale load_model (median of {args.repeats}): {ours:.2f} s  (goal <= 3 s)")
    for stage, seconds in time_stages(path).items():
        print(f"  {stage:<22} {seconds:.2f} s")

    if args.baseline:
        from pathlib import Path

        import transformers

        gguf = Path(path)
        start = time.perf_counter()
        transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        baseline = time.perf_counter() - start
        print(f"transformers from_pretrained(gguf_file=...): {baseline:.2f} s")
        print(f"ratio transformers / metrale: {baseline / ours:.1f}x")


if __name__ == "__main__":
    main()
