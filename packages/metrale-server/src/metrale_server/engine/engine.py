"""``Engine``: the engine core and an output processor stepped together on one thread."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from metrale_model_arch import LoadedModel
from metrale_model_arch.memory import MemoryPlan
from metrale_server.args import EngineArgs
from metrale_server.engine.block_manager import BlockManager
from metrale_server.engine.core import EngineCore
from metrale_server.engine.prompt_image import PromptImage
from metrale_server.engine.scheduler import Scheduler
from metrale_server.engine.stats import EngineStats
from metrale_server.memory.ledger import MemoryLedger
from metrale_server.output.outputs import RequestOutput
from metrale_server.output.processor import OutputProcessor, RequestOutputKind
from metrale_server.pooling.model_task import ModelTask
from metrale_server.sampling.params import SamplingParams

logger = logging.getLogger("metrale.engine")


class Engine:
    """Offline driving of an ``EngineCore``: ``step`` runs the core, then turns its token ids
    into ``RequestOutput``s and aborts the outputs a stop string ended.

    Contract: ``add_request`` validates and queues (or raises ``RequestError``, changing
    nothing); ``step`` returns an output for every request that produced tokens or finished
    (cumulative by default; see ``RequestOutputKind``); ``abort`` frees everything a request
    holds. Not thread-safe (``AsyncEngine`` runs the core on its own thread instead).
    """

    def __init__(self, core: EngineCore) -> None:
        """Drive ``core`` (built by :func:`~metrale_server.engine.bootstrap.build_engine`)."""
        self.core = core
        self.processor = OutputProcessor(core.loaded.tokenizer, core.eos_token_ids)

    def wait_for_native_kernels(self) -> bool:
        """On a first start on a CPU, wait for the native kernels' build (the reference ops
        would serve meanwhile, tens of times slower on q4 weights); whether there was one."""
        compiler = self.core.compiler
        if compiler is None or not compiler.builds_kernels:
            return False
        logger.info(
            "building the native CPU kernels for this CPU (first start; cached after), "
            "ready once they are built"
        )
        compiler.prepared.wait()
        return True

    @property
    def loaded(self) -> LoadedModel:
        return self.core.loaded

    @property
    def task(self) -> ModelTask:
        """What the model serves (``args.task`` resolved against the model's files)."""
        return self.core.task

    @property
    def args(self) -> EngineArgs:
        return self.core.args

    @property
    def plan(self) -> MemoryPlan:
        return self.core.plan

    @property
    def ledger(self) -> MemoryLedger:
        return self.core.ledger

    @property
    def stats(self) -> EngineStats:
        return self.core.stats

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.core.eos_token_ids

    @property
    def max_seq_len(self) -> int:
        return self.core.max_seq_len

    @property
    def max_batch_size(self) -> int:
        return self.core.max_batch_size

    @property
    def num_kv_blocks(self) -> int:
        return self.core.num_kv_blocks

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def block_manager(self) -> BlockManager:
        return self.core.block_manager

    def check_request(self, prompt: tuple[int, ...], params: SamplingParams) -> SamplingParams:
        return self.core.check_request(prompt, params)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any; the engine cannot step afterwards."""
        self.core.close()

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        arrival_time: float | None = None,
        kind: RequestOutputKind = RequestOutputKind.CUMULATIVE,
        images: Sequence[PromptImage] = (),
    ) -> None:
        """Queue a request; ``prompt`` is its text, if it came as text (reported back only);
        ``images`` stand on its image tokens."""
        request = self.core.make_request(
            request_id, prompt_token_ids, params, arrival_time=arrival_time, images=images
        )
        self.core.add_request(request)
        self.processor.add_request(
            request_id, prompt, request.prompt_token_ids, request.params, kind
        )

    def abort(self, request_id: str) -> RequestOutput | None:
        self.core.abort(request_id)
        return self.processor.abort(request_id)

    def step(self) -> list[RequestOutput]:
        return self.processor.apply_core_outputs(self.core.step(), self.core.abort)
