"""``LLM``: offline batched generation, the Python API (vLLM's shape)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metrale_server.args import EngineArgs
from metrale_server.engine.core import RequestError
from metrale_server.engine.engine import Engine
from metrale_server.output.outputs import RequestOutput
from metrale_server.output.processor import RequestOutputKind
from metrale_server.sampling.params import SamplingParams

PromptInput = str | Mapping[str, Any]


class LLM:
    """Load a model once, then generate for many prompts with continuous batching.

    ``LLM(model=None, **engine_args)``: ``model`` as ``met generate --model`` takes it (``None``
    is the bundled default); ``engine_args`` are ``EngineArgs`` fields.
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = Engine(EngineArgs(model=model, **engine_args))
        self.engine.wait_for_native_kernels()

    def close(self) -> None:
        """Stop the workers of a ``tensor_parallel_size`` above 1 (they also end with this
        process)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        """Wrap an engine built elsewhere (e.g. several engines sharing one loaded model)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One finished output per prompt, in order.

        A prompt is a string, ``{"prompt": str}`` or ``{"prompt_token_ids": [...]}``. A prompt
        the engine refuses (e.g. it could never fit) gets an output with ``error`` set; the
        others still run.
        """
        batch = [prompts] if isinstance(prompts, (str, Mapping)) else list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(batch)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(batch):
                raise ValueError(f"{len(params_list)} sampling_params for {len(batch)} prompts")
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        for index, (prompt, params) in enumerate(zip(batch, params_list, strict=True)):
            request_id = f"llm-{index}"
            order.append(request_id)
            text, token_ids = self._tokenize(prompt)
            try:
                self.engine.add_request(
                    request_id, token_ids, params, prompt=text, kind=RequestOutputKind.FINAL_ONLY
                )
            except RequestError as error:
                results[request_id] = RequestOutput(
                    request_id=request_id,
                    prompt=text,
                    prompt_token_ids=tuple(token_ids),
                    outputs=(),
                    finished=True,
                    error=str(error),
                )
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    results[output.request_id] = output
        return [results[request_id] for request_id in order]

    def _tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.engine.loaded.tokenizer.encode(prompt, add_special_tokens=True)
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        if "prompt" in prompt:
            text = str(prompt["prompt"])
            return text, self.engine.loaded.tokenizer.encode(text, add_special_tokens=True)
        raise ValueError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [...]}")
