"""``SpeculativeConfig``: ``--speculative-config`` as vLLM spells it (a JSON object)."""

from __future__ import annotations

import json
from typing import Any

import attrs

from metrale_server.arg_choices import QUANTIZATION_CHOICES

METHODS = ("ngram", "draft_model", "mtp")
# vLLM's older names for method mtp, accepted as it accepts them.
MTP_ALIASES = ("deepseek_mtp", "glm4_moe_mtp", "qwen3_next_mtp")
NOT_BUILT_METHODS = ("eagle", "eagle3", "medusa")
KEYS = (
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "quantization",
)
INTEGER_KEYS = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
MAX_SPECULATIVE_TOKENS = 16


def _canonical_method(method: str) -> str:
    return "mtp" if method in MTP_ALIASES else method


@attrs.frozen(kw_only=True)
class SpeculativeConfig:
    """Each decode step proposes up to ``num_speculative_tokens`` tokens and one forward pass
    of the target checks them all.

    ``ngram`` (prompt lookup) drafts the tokens that followed the most recent earlier
    occurrence of the sequence's last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens;
    ``draft_model`` drafts greedily with the smaller model at ``model`` (a directory or GGUF
    file, as ``--model`` takes it), which must share the target's tokenizer, its weights in
    ``quantization`` (as ``--quantization`` takes it; ``None``: the target's ``--quantization``);
    ``mtp`` (vLLM's aliases ``deepseek_mtp`` and ``glm4_moe_mtp`` read as it) drafts greedily
    with the model's own first multi-token-prediction layer, applied once per draft.
    """

    method: str = attrs.field(default="ngram", converter=_canonical_method)
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None
    quantization: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.method in NOT_BUILT_METHODS:
            raise ValueError(
                f"method {self.method!r} is not built yet; this server has {', '.join(METHODS)}"
            )
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, "
                f"got {self.num_speculative_tokens}"
            )
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )
        if self.method == "draft_model" and not self.model:
            raise ValueError("method draft_model needs model: the draft model's path")
        if self.method != "draft_model" and (self.model, self.quantization) != (None, None):
            raise ValueError(
                f"model and quantization are for method draft_model, not {self.method}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, "
                f"got {self.quantization!r}"
            )

    @property
    def is_mtp(self) -> bool:
        return self.method == "mtp"

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parse the flag's JSON; ``ValueError`` names what is wrong."""
        try:
            value: Any = json.loads(text)
        except ValueError as error:
            raise ValueError(f"not valid JSON: {error}") from error
        if not isinstance(value, dict):
            raise ValueError("expected a JSON object")
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise ValueError(f"unknown keys {', '.join(unknown)}; known: {', '.join(KEYS)}")
        for key in INTEGER_KEYS:
            if key in value and (not isinstance(value[key], int) or isinstance(value[key], bool)):
                raise ValueError(f"{key} must be an integer")
        if "model" in value and not isinstance(value["model"], str):
            raise ValueError("model must be a string (a path)")
        if "quantization" in value and not isinstance(value["quantization"], str):
            raise ValueError("quantization must be a string")
        if "method" not in value:
            raise ValueError("method is required")
        num_tokens: int = value.get("num_speculative_tokens", 4)
        return cls(
            method=value["method"],
            num_speculative_tokens=num_tokens,
            prompt_lookup_min=value.get("prompt_lookup_min", 1),
            prompt_lookup_max=value.get("prompt_lookup_max", num_tokens),
            model=value.get("model"),
            quantization=value.get("quantization"),
        )
