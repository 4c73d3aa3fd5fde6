"""Speed and memory of ``--quantization fp8`` (W8A8, ``torch._scaled_mm``) on the CPU, against
``none`` and ``int8``, on the bundled default model's weights.

    python benches/fp8_speed.py [--formats fp8-bf16,none-bf16,fp8-fp32,none-fp32,int8-fp32]
        [--prompt-tokens 256] [--decode-tokens 32] [--json PATH]

The bundled model is a Q4_1 GGUF, which ``--quantization fp8`` refuses (4-bit blocks requantized
to 8 bits would be twice the bytes and no better); its weights dequantized to bfloat16 are
written once to a temporary safetensors directory (a bf16 checkpoint, as vLLM's online fp8
quantizes) and every format is served from it, in one process, one after another: ``LLM(dir,
dtype=..., quantization=...)`` with ``enforce_eager`` (the same eager layer steps for every
format; compiled or native steps would favour the formats that have them). Each format:

* prefill: one request of ``--prompt-tokens`` random tokens, 1 output token; tokens/s of the
  best of 3 runs;
* decode: one stream, ``--decode-tokens`` tokens after an 8-token prompt; tokens/s of the best
  of 3 runs (the prompt's prefill included, at 8 tokens negligible);
* weight bytes from the plan (equal to the ledger's, which the tests check).

The machine may be shared: compare formats within one run only.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from bench_host import cpu_line
from safetensors.torch import save_file

from metrale_server import LLM, SamplingParams

FORMATS = {
    "fp8-bf16": ("bfloat16", "fp8"),
    "none-bf16": ("bfloat16", "none"),
    "fp8-fp32": ("float32", "fp8"),
    "none-fp32": ("float32", "none"),
    "int8-fp32": ("float32", "int8"),
}
NUM_RUNS = 3


@dataclass(frozen=True)
class Speed:
    name: str
    dtype: str
    quantization: str
    weight_bytes: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float


def write_float_checkpoint(out: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """The bundled model's weights (its Q4_1 blocks dequantized) as a ``dtype`` safetensors
    directory with its config and tokenizer."""
    from metrale_config import read_gguf_header
    from metrale_model_arch import Tokenizer, resolve_model
    from metrale_model_arch.quantize import read_float_checkpoint

    source = resolve_model(None)
    checkpoint = read_float_checkpoint(source)
    tensors = {
        name: tensor.to(dtype).contiguous()
        for name, tensor in checkpoint.weights
        if not (checkpoint.config.tie_word_embeddings and name == "lm_head.weight")
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    dtype_name = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps({**checkpoint.hf, "torch_dtype": dtype_name}))
    Tokenizer.from_gguf_fields(read_gguf_header(source.path).fields).save(out)
    return out


def best_tokens_per_s(llm: LLM, prompt: list[int], max_tokens: int, counted: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt}], params)  # warm
    best = 0.0
    for _ in range(NUM_RUNS):
        started = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params)
        best = max(best, counted / (time.perf_counter() - started))
    return best


def measure(name: str, model: Path, prompt_tokens: int, decode_tokens: int) -> Speed:
    dtype, quantization = FORMATS[name]
    llm = LLM(
        str(model),
        dtype=dtype,
        quantization=quantization,
        enforce_eager=True,
        max_seq_len=1024,
        max_batch_size=4,
    )
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 40000) for _ in range(prompt_tokens)]
    prefill = best_tokens_per_s(llm, prompt, 1, prompt_tokens)
    decode = best_tokens_per_s(llm, prompt[:8], decode_tokens, decode_tokens)
    weights = llm.engine.plan.weights.total()
    return Speed(name, dtype, quantization, weights, prefill, decode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = args.formats.split(",")
    unknown = [name for name in names if name not in FORMATS]
    if unknown:
        parser.error(f"--formats: unknown {unknown}; choose from {', '.join(FORMATS)}")
    print(cpu_line(), f"torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as scratch:
        model = write_float_checkpoint(Path(scratch) / "bf16")
        results = [measure(name, model, args.prompt_tokens, args.decode_tokens) for name in names]
    print(f"{'format':<10} {'weights MiB':>12} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for speed in results:
        print(
            f"{speed.name:<10} {speed.weight_bytes / 2**20:>12.1f} "
            f"{speed.prefill_tokens_per_s:>14.1f} {speed.decode_tokens_per_s:>13.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(speed) for speed in results], indent=2))


if __name__ == "__main__":
    main()
