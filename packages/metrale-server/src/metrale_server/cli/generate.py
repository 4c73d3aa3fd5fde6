"""``met generate``: load a model, run one prompt through the engine, stream the text to a file."""

from __future__ import annotations

from typing import TextIO

from metrale_server.engine.args import EngineArgs
from metrale_server.engine.core import RequestError
from metrale_server.engine.engine import Engine
from metrale_server.sampling.params import SamplingParams


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
    """Errors reach the user as ``ValueError`` (``RequestError`` included) or ``OSError``."""
    engine = Engine(EngineArgs(model=model, dtype=dtype, device=device, max_batch_size=1))
    loaded = engine.loaded
    if chat:
        text = loaded.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        prompt_ids = loaded.tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = loaded.tokenizer.encode(prompt, add_special_tokens=True)
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
    engine.add_request("generate", prompt_ids, params, prompt=prompt)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.error is not None:
                raise RequestError(output.error)
            out.write(output.outputs[0].delta_text)
            out.flush()
    out.write("\n")
    out.flush()
