"""Test-only helpers shared by every metrale test tree (the pytest plugin is ``.plugin``).

Installed into the shared test environment only; no package under ``packages/`` imports it
(``tests/test_layering.py`` checks). Everything heavy is imported inside the helpers, so the
plugin loads in every test session, metrale-config's included, without torch being imported.
"""

from __future__ import annotations

from metrale_testing.chains import (
    chain_patterns,
    save_byte_tokenizer,
    successor_cycles,
    two_sample_p_value,
)
from metrale_testing.checkpoints import (
    randomize_weights,
    save_random_model,
    save_tiny_deepseek_v3,
    save_tiny_glm4_moe,
    save_tiny_llama,
)
from metrale_testing.glm5_mtp import add_glm5_mtp_layer
from metrale_testing.greedy import paged_greedy, transformers_greedy
from metrale_testing.servers import free_port, serve_app_in_thread, serve_http_handler, served
from metrale_testing.session import build_native_ops_first, stay_eager

__all__ = [
    "add_glm5_mtp_layer",
    "build_native_ops_first",
    "chain_patterns",
    "free_port",
    "paged_greedy",
    "randomize_weights",
    "save_byte_tokenizer",
    "save_random_model",
    "save_tiny_deepseek_v3",
    "save_tiny_glm4_moe",
    "save_tiny_llama",
    "serve_app_in_thread",
    "serve_http_handler",
    "served",
    "stay_eager",
    "successor_cycles",
    "transformers_greedy",
    "two_sample_p_value",
]
