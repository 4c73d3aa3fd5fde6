"""``LLM``: offline batched generation, the Python API (vLLM's shape)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from metrale_model_arch import ImageEncoder, PreparedImage
from metrale_server.args import EngineArgs
from metrale_server.engine.bootstrap import build_engine
from metrale_server.engine.core import RequestError
from metrale_server.engine.engine import Engine
from metrale_server.engine.prompt_image import PromptImage, images_in_prompt
from metrale_server.output.outputs import RequestOutput
from metrale_server.output.processor import RequestOutputKind
from metrale_server.pooling.model_task import TaskName
from metrale_server.pooling.params import PoolingParams
from metrale_server.pooling.score_prompt import DEFAULT_INSTRUCTION, score_prompt
from metrale_server.sampling.params import SamplingParams

PromptInput = str | Mapping[str, Any]


class LLM:
    """Load a model once, then generate for many prompts with continuous batching.

    ``LLM(model=None, **engine_args)``: ``model`` as ``met generate --model`` takes it (``None``
    is the bundled default); ``engine_args`` are ``EngineArgs`` fields.
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = build_engine(EngineArgs(model=model, **engine_args))
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

        A prompt is a string, ``{"prompt": str}`` or ``{"prompt_token_ids": [...]}``; as vLLM's,
        ``{"prompt": str, "multi_modal_data": {"image": image or [images]}}`` carries PIL
        images, one for each image placeholder the text holds as the model's chat template
        writes it. A prompt the engine refuses (e.g. it could never fit) gets an output with
        ``error`` set; the others still run.
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
            text, token_ids, images = self._tokenize(prompt)
            try:
                self.engine.add_request(
                    request_id,
                    token_ids,
                    params,
                    prompt=text,
                    kind=RequestOutputKind.FINAL_ONLY,
                    images=images,
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

    def embed(
        self, prompts: PromptInput | Sequence[PromptInput], *, dimensions: int | None = None
    ) -> list[tuple[float, ...]]:
        """Each prompt's embedding, in order, pooled as the model's files say (an ``embed``
        task); ``dimensions`` keeps the first that many components before normalizing."""
        pooling = attrs.evolve(self._task_pooling("embed"), dimensions=dimensions)
        return _vectors(self.generate(prompts, SamplingParams(pooling=pooling)))

    def score(
        self, query: str, documents: Sequence[str], *, instruction: str = DEFAULT_INSTRUCTION
    ) -> list[float]:
        """A yes/no reranker's relevance of each document to ``query`` (a ``score`` task), in
        the documents' order: what ``/v1/score`` answers, in Qwen3-Reranker's prompt."""
        params = SamplingParams(pooling=self._task_pooling("score"))
        tokenizer = self.engine.loaded.tokenizer
        prompts = [
            {"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}
            for text in (score_prompt(query, document, instruction) for document in documents)
        ]
        return [vector[0] for vector in _vectors(self.generate(prompts, params))]

    def _task_pooling(self, task: TaskName) -> PoolingParams:
        served = self.engine.task
        if served.name != task or served.pooling is None:
            raise ValueError(
                f"this model serves task {served.name!r}; build it with LLM(..., task={task!r})"
            )
        return served.pooling

    def _tokenize(
        self, prompt: PromptInput
    ) -> tuple[str | None, Sequence[int], tuple[PromptImage, ...]]:
        def tokenize(text: str) -> list[int]:
            return self.engine.loaded.tokenizer.encode(text, add_special_tokens=True)

        if isinstance(prompt, str):
            return prompt, tokenize(prompt), ()
        if "multi_modal_data" in prompt:
            if "prompt" not in prompt:
                raise ValueError("multi_modal_data goes with a prompt text holding its images")
            text = str(prompt["prompt"])
            token_ids, placed = images_in_prompt(
                self._image_encoder(), tokenize, text, self._prepared_images(prompt)
            )
            return text, token_ids, placed
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]], ()
        if "prompt" in prompt:
            text = str(prompt["prompt"])
            return text, tokenize(text), ()
        raise ValueError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [...]}")

    def _image_encoder(self) -> ImageEncoder:
        step = self.engine.core.runner.image_step
        if step is None:
            raise ValueError(
                "multi_modal_data: this model takes no images (no vision tower the engine "
                "serves, or images_per_prompt=0)"
            )
        return step.encoder

    def _prepared_images(self, prompt: Mapping[str, Any]) -> list[PreparedImage]:
        data = prompt["multi_modal_data"]
        if not isinstance(data, Mapping) or set(data) != {"image"}:
            raise ValueError('multi_modal_data: only {"image": image or [images]} is taken')
        images = data["image"]
        images = list(images) if isinstance(images, Sequence) else [images]
        encoder = self._image_encoder()
        return [encoder.prepare(image) for image in images]


def _vectors(outputs: list[RequestOutput]) -> list[tuple[float, ...]]:
    """Each output's pooled vector; a refused prompt raises ``RequestError`` saying why."""
    vectors = []
    for output in outputs:
        if output.error is not None or output.pooled is None:
            raise RequestError(f"prompt {output.request_id}: {output.error}")
        vectors.append(output.pooled)
    return vectors
