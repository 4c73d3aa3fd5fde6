"""Compiling the model's layer steps on a background thread while the engine serves eagerly.

A cold compile takes tens of seconds on a small CPU (inductor builds C++); a warm one, from
inductor's on-disk cache, a few. Either way the server is ready at once: the engine runs the
eager steps until the compiled ones are swapped in (one attribute, read at the start of each
forward). A compile that fails leaves the eager steps in place and says why in the log.
"""

from __future__ import annotations

import logging
import threading

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.compiled_steps import can_compile, compile_layer_steps

logger = logging.getLogger("metrale.engine")


class LayerCompiler:
    """One background compile of ``model``'s layer steps; ``done`` is set when it ends."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.done = threading.Event()
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metrale-compile", daemon=True)

    @classmethod
    def start_if_useful(cls, model: CausalLM, *, enforce_eager: bool) -> LayerCompiler | None:
        """Start compiling unless ``enforce_eager`` or ``model`` has no compilable steps."""
        if enforce_eager or not can_compile(model):
            return None
        compiler = cls(model)
        logger.info(
            "compiling the layer steps in the background (torch.compile, inductor); "
            "eager steps serve until they are ready (--enforce-eager: never compile)"
        )
        compiler._thread.start()
        return compiler

    @staticmethod
    def state(compiler: LayerCompiler | None) -> str:
        """``eager`` (never compiled, or the compile failed), ``compiling`` or ``compiled``."""
        if compiler is None or (compiler.done.is_set() and compiler.error is not None):
            return "eager"
        return "compiled" if compiler.done.is_set() else "compiling"

    @property
    def compiled(self) -> bool:
        return self.done.is_set() and self.error is None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the compile ends; ``True`` if the compiled steps are in use."""
        self.done.wait(timeout)
        return self.compiled

    def _run(self) -> None:
        try:
            self.seconds = compile_layer_steps(self.model)  # type: ignore[arg-type]
        except Exception as error:
            self.error = error
            logger.warning("compiling the layer steps failed; staying eager: %r", error)
        finally:
            self.done.set()
