"""llama.cpp tensor names -> Hugging Face names, and which tensors llama.cpp stored permuted."""

from __future__ import annotations

import re

# Tensors with no Hugging Face counterpart. ``rope_freqs`` holds llama3 rope factors that the
# config already describes (``metrale_config`` marks such files so a family can refuse them).
SKIPPED_GGUF_TENSORS = frozenset({"rope_freqs.weight"})

# Architectures whose Q/K projection rows llama.cpp's converter permuted for its rotary layout
# (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``); qwen2/qwen3 are stored unpermuted.
ROTARY_PERMUTED_ARCHITECTURES = frozenset({"llama"})

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_BLOCK_NAMES = {
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
}

_BLOCK_TENSOR = re.compile(r"blk\.(?P<layer>\d+)\.(?P<part>[a-z_]+)\.(?P<kind>weight|bias)")


class UnknownGgufTensorError(KeyError):
    """A GGUF tensor name with no Hugging Face counterpart known here."""

    def __str__(self) -> str:
        return str(self.args[0])


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of ``gguf_name``; ``None`` for tensors that are skipped.

    Raises ``UnknownGgufTensorError`` for a name this mapping does not know.
    """
    if gguf_name in SKIPPED_GGUF_TENSORS:
        return None
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    if match is None or match["part"] not in _BLOCK_NAMES:
        raise UnknownGgufTensorError(f"GGUF tensor {gguf_name!r} has no Hugging Face name")
    return f"model.layers.{match['layer']}.{_BLOCK_NAMES[match['part']]}.{match['kind']}"


def rotary_permuted_heads(gguf_name: str, architecture: str) -> str | None:
    """``"q"`` or ``"k"`` when ``gguf_name`` is a projection llama.cpp stored with its rows
    permuted (the caller unpermutes with the query or key/value head count), else ``None``."""
    if architecture not in ROTARY_PERMUTED_ARCHITECTURES:
        return None
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    if match is None:
        return None
    return {"attn_q": "q", "attn_k": "k"}.get(match["part"])
