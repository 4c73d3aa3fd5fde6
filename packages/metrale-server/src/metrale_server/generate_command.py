"""``met generate``: load a model, run one prompt, stream the text to a file."""

from __future__ import annotations

from typing import TextIO

from metrale_model_arch import load_model
from metrale_server.detokenizer import IncrementalDetokenizer
from metrale_server.devices import resolve_device, resolve_dtype
from metrale_server.single_sequence import generate_token_ids


def run_generate(
    prompt: str,
    *,
    model: str | None,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    dtype: str,
    device: str,
    out: TextIO,
) -> None:
    torch_device = resolve_device(device)
    loaded = load_model(model, dtype=resolve_dtype(dtype, torch_device), device=torch_device)
    tokenizer = loaded.tokenizer
    if chat:
        text = loaded.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
    detokenizer = IncrementalDetokenizer(tokenizer)
    stop_ids = frozenset(loaded.eos_token_ids)
    for token_id in generate_token_ids(
        loaded,
        prompt_ids,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        stop_token_ids=stop_ids,
    ):
        if token_id in stop_ids:
            break
        out.write(detokenizer.push(token_id))
        out.flush()
    out.write(detokenizer.flush() + "\n")
    out.flush()
