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
# config already describes (``metrale_config`` marks such files so a family can refuse them);
# Phi-3's ``rope_factors_*`` are its LongRoPE factors, which ``metrale_config`` reads.
SKIPPED_GGUF_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)

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

_BLOCK_TENSOR = re.compile(r"blk\.(?P<layer>\d+)\.(?P<part>[a-z_.]+)\.(?P<kind>weight|bias)")


class UnknownGgufTensorError(KeyError):
    """A GGUF tensor name with no checkpoint counterpart known here."""

    def __str__(self) -> str:
        return str(self.args[0])


@attrs.frozen(kw_only=True)
class GgufNames:
    """One family's llama.cpp names: ``blk.N.<part>.<weight|bias>`` -> ``model.layers.N.<name>``.

    ``rotary_permuted``: llama.cpp's converter permuted the Q/K projection rows (weights and
    biases) for its rotary layout (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``: llama,
    llama-layout Mixtral, and its subclasses granite and smollm3); the others are stored
    unpermuted. ``norm_weight_shift``: the converter stored every RMSNorm weight plus this
    (gemma's ``1 + w`` norms: ``+ 1``); the loader subtracts it.
    """

    block_names: Mapping[str, str] = attrs.field(factory=lambda: dict(BLOCK_NAMES))
    # ``<part>.<weight|bias>`` -> a whole checkpoint name (no ``.weight`` / ``.bias`` added).
    whole_block_names: Mapping[str, str] = attrs.field(factory=dict)
    top_level_names: Mapping[str, str] = attrs.field(factory=lambda: dict(TOP_LEVEL_NAMES))
    rotary_permuted: bool = False
    norm_weight_shift: float = 0.0

    def checkpoint_name(self, gguf_name: str) -> str | None:
        """The checkpoint name of ``gguf_name``; ``None`` for tensors that are skipped.

        Raises ``UnknownGgufTensorError`` for a name this table does not know.
        """
        if gguf_name in SKIPPED_GGUF_TENSORS:
            return None
        if gguf_name in self.top_level_names:
            return self.top_level_names[gguf_name]
        match = _BLOCK_TENSOR.fullmatch(gguf_name)
        if match is None:
            raise UnknownGgufTensorError(f"GGUF tensor {gguf_name!r} has no Hugging Face name")
        prefix, part, kind = f"model.layers.{match['layer']}", match["part"], match["kind"]
        if (whole := self.whole_block_names.get(f"{part}.{kind}")) is not None:
            return f"{prefix}.{whole}"
        if part not in self.block_names:
            raise UnknownGgufTensorError(f"GGUF tensor {gguf_name!r} has no Hugging Face name")
        return f"{prefix}.{self.block_names[part]}.{kind}"

    def stored_shift(self, gguf_name: str) -> float:
        """What the converter added to ``gguf_name``'s values (0.0: stored as they are)."""
        return self.norm_weight_shift if gguf_name.endswith("norm.weight") else 0.0

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
# The norms after attention and the MLP (olmo2's two, gemma's four with the ones before).
_POST_NORM_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GEMMA_GGUF_NAMES = GgufNames(
    block_names={**BLOCK_NAMES, **_POST_NORM_NAMES, "ffn_norm": "pre_feedforward_layernorm"},
    norm_weight_shift=1.0,
)
OLMO2_GGUF_NAMES = GgufNames(
    block_names={
        name: hf_name
        for name, hf_name in {**BLOCK_NAMES, **_POST_NORM_NAMES}.items()
        if name not in ("attn_norm", "ffn_norm")
    }
)
# Phi-3's checkpoints hold the fused projections, stored as they are.
PHI3_GGUF_NAMES = GgufNames(
    block_names={
        **{name: hf_name for name, hf_name in BLOCK_NAMES.items() if not name.startswith("ffn_")},
        "attn_qkv": "self_attn.qkv_proj",
        "ffn_up": "mlp.gate_up_proj",
        "ffn_down": "mlp.down_proj",
        "ffn_norm": "post_attention_layernorm",
    }
)
# GLM-4.5: shared experts, the routing correction bias, and the MTP layers' own tensors
# (``blk.{num_hidden_layers + k}.nextn.*``; their embedding and head are copies).
GLM4_MOE_GGUF_NAMES = GgufNames(
    block_names={
        **BLOCK_NAMES,
        "post_attention_norm": "post_attention_layernorm",
        "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
        "ffn_up_shexp": "mlp.shared_experts.up_proj",
        "ffn_down_shexp": "mlp.shared_experts.down_proj",
        "nextn.eh_proj": "eh_proj",
        "nextn.enorm": "enorm",
        "nextn.hnorm": "hnorm",
        "nextn.embed_tokens": "embed_tokens",
        "nextn.shared_head_head": "shared_head.head",
        "nextn.shared_head_norm": "shared_head.norm",
    },
    whole_block_names={"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
)
