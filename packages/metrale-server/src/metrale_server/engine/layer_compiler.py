"""Compiling the model's layer steps on a background thread while the engine serves eagerly.

A cold compile takes tens of seconds on a small CPU (inductor builds C++); a warm one, from
inductor's on-disk cache, a few. Either way the server is ready at once: the engine runs the
eager steps until the compiled ones are swapped in (one attribute, read at the start of each
forward). A compile that fails leaves the eager steps in place and says why in the log.

The same thread first prepares the kernel backend (the CPU backend builds its native ops
there on a first start; a cached build was loaded with the model), so the compiled steps trace
the kernels that will run. Under ``--enforce-eager`` it only prepares the backend.
"""

from __future__ import annotations

import logging
import threading

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.compiled_steps import can_compile, compile_layer_steps

logger = logging.getLogger("metrale.engine")


class LayerCompiler:
    """One background compile of ``model``'s layer steps; ``done`` is set when it ends."""

    def __init__(self, model: CausalLM, *, compile_steps: bool = True) -> None:
        self.model = model
        self.compile_steps = compile_steps
        self.done = threading.Event()
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metrale-compile", daemon=True)

    @classmethod
    def start_if_useful(cls, model: CausalLM, *, enforce_eager: bool) -> LayerCompiler | None:
        """Start preparing the backend and compiling the steps (unless ``enforce_eager`` or
        ``model`` has no compilable steps); ``None`` when there is nothing to do."""
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
    def state(compiler: LayerCompiler | None) -> str:
        """``eager`` (never compiled, or the compile failed), ``compiling`` or ``compiled``."""
        if compiler is None or not compiler.compile_steps:
            return "eager"
        if compiler.done.is_set() and compiler.error is not None:
            return "eager"
        return "compiled" if compiler.done.is_set() else "compiling"

    @property
    def compiled(self) -> bool:
        return self.compile_steps and self.done.is_set() and self.error is None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the compile ends; ``True`` if the compiled steps are in use."""
        self.done.wait(timeout)
        return self.compiled

    def _run(self) -> None:
        try:
            if self.model.backend.needs_prepare():
                self.model.backend.prepare()
                logger.info("kernels: %s", self.model.backend.describe())
            if not self.compile_steps:
                return
            self.seconds = compile_layer_steps(self.model)  # type: ignore[arg-type]
        except Exception as error:
            self.error = error
            logger.warning("compiling the layer steps failed; staying eager: %r", error)
        finally:
            self.done.set()
