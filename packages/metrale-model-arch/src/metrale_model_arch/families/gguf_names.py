"""llama.cpp tensor names -> checkpoint (Hugging Face) names, and which llama.cpp stored permuted.

Each architecture record carries a :class:`GgufNames`; the GGUF loader translates every tensor
name through it, then through the family's checkpoint mapping like a safetensors name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import attrs

# Tensors with no Hugging Face counterpart. ``rope_freqs`` holds llama3 rope factors that the
# config already describes (``metrale_config`` marks such files so a family can refuse them).
SKIPPED_GGUF_TENSORS = frozenset({"rope_freqs.weight"})

TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # Routed experts (qwen3moe, Mixtral): the router, and each projection stacked over experts.
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}

_BLOCK_TENSOR = re.compile(r"blk\.(?P<layer>\d+)\.(?P<part>[a-z_]+)\.(?P<kind>weight|bias)")


class UnknownGgufTensorError(KeyError):
    """A GGUF tensor name with no checkpoint counterpart known here."""

    def __str__(self) -> str:
        return str(self.args[0])


@attrs.frozen(kw_only=True)
class GgufNames:
    """One family's llama.cpp names: ``blk.N.<part>.<weight|bias>`` -> ``model.layers.N.<name>``.

    ``rotary_permuted``: llama.cpp's converter permuted the Q/K projection rows for its rotary
    layout (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``: llama, llama-layout Mixtral);
    qwen2/qwen3 are stored unpermuted.
    """

    block_names: Mapping[str, str] = attrs.field(factory=lambda: dict(BLOCK_NAMES))
    top_level_names: Mapping[str, str] = attrs.field(factory=lambda: dict(TOP_LEVEL_NAMES))
    rotary_permuted: bool = False

    def checkpoint_name(self, gguf_name: str) -> str | None:
        """The checkpoint name of ``gguf_name``; ``None`` for tensors that are skipped.

        Raises ``UnknownGgufTensorError`` for a name this table does not know.
        """
        if gguf_name in SKIPPED_GGUF_TENSORS:
            return None
        if gguf_name in self.top_level_names:
            return self.top_level_names[gguf_name]
        match = _BLOCK_TENSOR.fullmatch(gguf_name)
        if match is None or match["part"] not in self.block_names:
            raise UnknownGgufTensorError(f"GGUF tensor {gguf_name!r} has no Hugging Face name")
        return f"model.layers.{match['layer']}.{self.block_names[match['part']]}.{match['kind']}"

    def permuted_projection(self, gguf_name: str) -> Literal["q", "k"] | None:
        """``"q"`` or ``"k"`` when ``gguf_name`` is a projection stored with its rows permuted
        (the caller unpermutes with the query or key/value head count), else ``None``."""
        if not self.rotary_permuted:
            return None
        match = _BLOCK_TENSOR.fullmatch(gguf_name)
        if match is None:
            return None
        part = match["part"]
        if part == "attn_q":
            return "q"
        if part == "attn_k":
            return "k"
        return None


LLAMA_GGUF_NAMES = GgufNames(rotary_permuted=True)
QWEN_GGUF_NAMES = GgufNames()
