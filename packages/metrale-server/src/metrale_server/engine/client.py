"""``EngineClient``: the one door from the HTTP API into an engine.

The API reads the model's text side (tokenizer, chat template), what the engine was built
with (``EngineInfo``), its published stats and memory books, and sends requests in and aborts
out; it never reaches into the core, the scheduler or the loaded model. ``AsyncEngine`` is
the implementation the server runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import attrs
import torch

from metrale_config import ModelConfig
from metrale_model_arch import ChatTemplate, ImageEncoder, ModelSource, Tokenizer
from metrale_server.engine.prompt_image import PromptImage
from metrale_server.engine.stats import EngineStats
from metrale_server.output.outputs import RequestOutput
from metrale_server.pooling.model_task import ModelTask
from metrale_server.sampling.params import SamplingParams
from metrale_server.structured import CompiledGrammar, GrammarCompiler


@attrs.frozen(kw_only=True)
class EngineInfo:
    """What an engine was built with; fixed once it is built."""

    source: ModelSource
    config: ModelConfig
    task: ModelTask
    dtype: torch.dtype
    quantization: str
    kernels: str
    device: torch.device
    max_seq_len: int
    max_batch_size: int
    max_batch_tokens: int
    num_kv_blocks: int
    block_size: int
    kv_block_bytes: int
    budget_bytes: int
    is_prefix_caching: bool
    # The most images one request may carry (0: the engine takes none).
    images_per_prompt: int = 0


class EngineClient(Protocol):
    """What the API sees of an engine (``AsyncEngine`` implements it).

    ``add_request`` raises ``RequestError`` at once for a request that can never run, and
    otherwise returns its outputs as they come (``RequestOutputKind.DELTA``; the last one
    ``finished``); ``abort`` ends a request. ``stats`` is the snapshot the engine published
    last; any thread may read every member.
    """

    @property
    def info(self) -> EngineInfo: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def chat_template(self) -> ChatTemplate: ...

    @property
    def image_encoder(self) -> ImageEncoder | None:
        """The model's image path (``prepare`` runs on any thread), or ``None``: no images."""
        ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str: ...

    @property
    def grammar_compiler(self) -> GrammarCompiler: ...

    @property
    def is_running(self) -> bool: ...

    @property
    def stats(self) -> EngineStats: ...

    def layer_steps(self) -> str:
        """How the layer steps run now (eager, compiled, native; a compile may end later)."""
        ...

    def memory_document(self) -> dict[str, Any]:
        """``GET /memory``'s body: the plan, the allocation ledger, host readings and, under
        tensor parallelism, every rank's books."""
        ...

    def live_bytes_by_owner(self) -> dict[str, int]: ...

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        grammar: CompiledGrammar | None = None,
        images: Sequence[PromptImage] = (),
    ) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...
