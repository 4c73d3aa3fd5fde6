"""The one place a model's layer executor is chosen and installed (``LayerExecutor``: native
where the cpu backend's native ops run, else compiled unless ``--enforce-eager``, else eager),
compiling on a background thread while the engine serves eagerly.

A cold compile takes tens of seconds on a small CPU (inductor builds C++); a warm one, from
inductor's on-disk cache, a few. Either way the server is ready at once: the engine runs the
eager executor until the compiled one is installed (one attribute, read at the start of each
forward). A compile that fails leaves the eager steps in place and says why in the log.

The same thread first prepares the kernel backend (the cpu backend builds its native ops
there on a first start; a cached build was loaded with the model); ``prepared`` is set once
that is over, and ``met serve`` waits for it before it says ready: the reference q4 ops the
model would serve with meanwhile are tens of times slower than the native ones. Where the
native one-call layer segments can run (a dense int8 llama-family model on the cpu backend)
they are swapped in and nothing is compiled: they beat the compiled graphs (measured at batch
1, 30 layers: 7.8 ms against 17-18 ms a step for the compiled ones with attention and
head). Under ``--enforce-eager`` the thread only prepares the backend (and swaps in native
segments).
"""

from __future__ import annotations

import logging
import threading
import time

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.compiled_steps import can_compile, compile_executor
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_model_arch.families.native_steps import native_executor

logger = logging.getLogger("metrale.engine")


class LayerCompiler:
    """One background compile of ``model``'s layer steps; ``done`` is set when it ends,
    ``prepared`` once the backend's kernels are built (or failed to build) and any native
    segments swapped in; ``builds_kernels``: whether the backend had kernels to build."""

    def __init__(self, model: CausalLM, *, compile_steps: bool = True) -> None:
        self.model = model
        self.compile_steps = compile_steps
        self.builds_kernels = model.backend.needs_prepare()
        self.prepared = threading.Event()
        self.done = threading.Event()
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metrale-compile", daemon=True)

    @classmethod
    def start_if_useful(cls, model: CausalLM, *, enforce_eager: bool) -> LayerCompiler | None:
        """Start preparing the backend and compiling the steps (unless ``enforce_eager`` or
        ``model`` has no compilable steps); ``None`` when there is nothing to do (the native
        executor, its ops built already, is installed at once; or there is nothing to build)."""
        if install_native_executor(model):
            return None
        compile_steps = not enforce_eager and can_compile(model)
        if not compile_steps and not model.backend.needs_prepare():
            return None
        compiler = cls(model, compile_steps=compile_steps)
        if compile_steps:
            logger.info(
                "compiling the layer steps in the background (torch.compile, inductor); "
                "eager steps serve until they are ready (--enforce-eager: never compile)"
            )
        compiler._thread.start()
        return compiler

    @staticmethod
    def state(compiler: LayerCompiler | None, model: CausalLM) -> str:
        """``native`` (the native one-call segments), ``compiled``, ``compiling`` (a compile or
        a native build is running) or ``eager`` (never compiled, or the compile failed)."""
        if compiler is not None and not compiler.done.is_set():
            return "compiling"
        return model.executor_name

    @property
    def compiled(self) -> bool:
        """Whether faster steps than the eager ones serve: compiled or native."""
        if not self.done.is_set() or self.error is not None:
            return False
        return self.model.executor_name != "eager"

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the compile ends; ``True`` if compiled or native steps are in use."""
        self.done.wait(timeout)
        return self.compiled

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            if self.model.backend.needs_prepare():
                self.model.backend.prepare()
                logger.info("kernels: %s", self.model.backend.describe())
            if install_native_executor(self.model):
                self.seconds = time.perf_counter() - started
                logger.info("layer steps: native segments ready in %.1f s", self.seconds)
                return
            self.prepared.set()
            if not self.compile_steps:
                return
            assert isinstance(self.model, LlamaForCausalLM)  # what can_compile said
            self.model.install_executor(compile_executor(self.model))
            self.seconds = time.perf_counter() - started
        except Exception as error:
            self.error = error
            logger.warning("compiling the layer steps failed; staying eager: %r", error)
        finally:
            self.prepared.set()
            self.done.set()


def install_native_executor(model: CausalLM) -> bool:
    """Install the native executor where it runs (its ops built); whether it did."""
    executor = native_executor(model)
    if executor is None:
        return False
    assert isinstance(model, LlamaForCausalLM)  # the family native executors run
    model.install_executor(executor)
    return True
