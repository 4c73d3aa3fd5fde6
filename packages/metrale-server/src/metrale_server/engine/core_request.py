"""``EngineCoreRequest``: a request the engine core checked once, ready to queue."""

from __future__ import annotations

import attrs

from metrale_model_arch import PromptPositions
from metrale_server.engine.prompt_image import PromptImage
from metrale_server.sampling.params import SamplingParams
from metrale_server.structured import CompiledGrammar


@attrs.frozen(kw_only=True, eq=False)
class EngineCoreRequest:
    """What :meth:`EngineCore.make_request` found runnable: the prompt fits with its output,
    ``params.max_tokens`` is filled in, the constraint is compiled (``grammar``). Made on the
    caller's thread, queued on the engine's (:meth:`EngineCore.add_request` checks nothing
    but the id)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    grammar: CompiledGrammar | None
    arrival_time: float
    # Where the prompt's images stand (its image tokens already expanded).
    images: tuple[PromptImage, ...] = ()
    # The prompt's M-RoPE positions, for a model whose positions follow its images.
    rope_positions: PromptPositions | None = None
