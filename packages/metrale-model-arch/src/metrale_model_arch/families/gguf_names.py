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

_BLOCK_TENSOR = re.compile(
    r"blk\.(?P<layer>\d+)\.(?P<part>[a-z][a-z0-9_.]*)\.(?P<kind>weight|bias)"
)
# A block tensor named without ``.weight`` / ``.bias`` (Qwen3-Next's ``ssm_a``).
_BARE_BLOCK_TENSOR = re.compile(r"blk\.(?P<layer>\d+)\.(?P<part>[a-z][a-z0-9_]*)")


# A part of a checkpoint tensor that llama.cpp's converter split in two: MLA's ``kv_b_proj``
# (``k_b``, ``v_b``), gpt-oss's interleaved expert ``gate_up_proj`` (``gate``, ``up``),
# Qwen3-Next's ``in_proj_qkvz`` (``qkv``, ``z``).
SplitRole = Literal["k_b", "v_b", "gate", "up", "qkv", "z"]


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
    (gemma's ``1 + w`` norms: ``+ 1``); the loader subtracts it. ``split_block_names``: the
    halves of one checkpoint tensor, ``<part>.<weight|bias>`` -> ``(whole name, role)``, that
    the loader joins back (DeepSeek's ``attn_k_b`` / ``attn_v_b`` -> ``kv_b_proj``, gpt-oss's
    ``ffn_gate_exps`` / ``ffn_up_exps`` -> ``gate_up_proj``).
    ``transposed_block_names``: the ``<part>.weight`` stored with their last two axes swapped
    relative to the checkpoint (gpt-oss's experts, which transformers multiplies from the left).
    ``unshifted_norms``: the ``<part>`` norms that ``norm_weight_shift`` spares (Qwen3-Next's
    gated ``ssm_norm``). ``negated_exp_block_names``: the tensors stored as ``-exp(x)`` of the
    checkpoint's ``x`` (Qwen3-Next's and Kimi Linear's ``ssm_a`` from ``A_log``).
    ``squeezed_block_names``: depthwise conv1d weights stored with their unit axes dropped or
    moved (Qwen3-Next's ``(channels, kernel)``, Kimi Linear's ``(1, channels, 1, kernel)``).
    Block tensors named without ``.weight`` / ``.bias`` are looked up by ``<part>`` alone in
    ``whole_block_names`` and these sets.
    """

    block_names: Mapping[str, str] = attrs.field(factory=lambda: dict(BLOCK_NAMES))
    # ``<part>.<weight|bias>`` -> a whole checkpoint name (no ``.weight`` / ``.bias`` added).
    whole_block_names: Mapping[str, str] = attrs.field(factory=dict)
    top_level_names: Mapping[str, str] = attrs.field(factory=lambda: dict(TOP_LEVEL_NAMES))
    split_block_names: Mapping[str, tuple[str, SplitRole]] = attrs.field(factory=dict)
    transposed_block_names: frozenset[str] = frozenset()
    unshifted_norms: frozenset[str] = frozenset()
    negated_exp_block_names: frozenset[str] = frozenset()
    squeezed_block_names: frozenset[str] = frozenset()
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
        match = _BLOCK_TENSOR.fullmatch(gguf_name) or _BARE_BLOCK_TENSOR.fullmatch(gguf_name)
        if match is None:
            raise UnknownGgufTensorError(f"GGUF tensor {gguf_name!r} has no Hugging Face name")
        prefix, part = f"model.layers.{match['layer']}", match["part"]
        kind: str | None = match.groupdict().get("kind")
        key = part if kind is None else f"{part}.{kind}"
        if (whole := self.whole_block_names.get(key)) is not None:
            return f"{prefix}.{whole}"
        if (split := self.split_block_names.get(key)) is not None:
            return f"{prefix}.{split[0]}"
        if kind is None or part not in self.block_names:
            raise UnknownGgufTensorError(f"GGUF tensor {gguf_name!r} has no Hugging Face name")
        return f"{prefix}.{self.block_names[part]}.{kind}"

    def split_role(self, gguf_name: str) -> SplitRole | None:
        """Which part of its checkpoint tensor ``gguf_name`` holds; ``None``: all of it."""
        split = self.split_block_names.get(_block_key(gguf_name) or "")
        return None if split is None else split[1]

    def is_transposed(self, gguf_name: str) -> bool:
        """Whether ``gguf_name`` holds its checkpoint tensor with the last two axes swapped."""
        return _block_key(gguf_name) in self.transposed_block_names

    def is_negated_exp(self, gguf_name: str) -> bool:
        """Whether ``gguf_name`` holds ``-exp(x)`` of its checkpoint tensor ``x``."""
        return _block_key(gguf_name) in self.negated_exp_block_names

    def is_squeezed(self, gguf_name: str) -> bool:
        """Whether ``gguf_name`` holds a conv1d weight with its unit axes dropped or moved."""
        return _block_key(gguf_name) in self.squeezed_block_names

    def stored_shift(self, gguf_name: str) -> float:
        """What the converter added to ``gguf_name``'s values (0.0: stored as they are)."""
        if not gguf_name.endswith("norm.weight"):
            return 0.0
        match = _BLOCK_TENSOR.fullmatch(gguf_name)
        if match is not None and match["part"] in self.unshifted_norms:
            return 0.0
        return self.norm_weight_shift

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


def _block_key(gguf_name: str) -> str | None:
    """``<part>.<weight|bias>`` of a block tensor, ``<part>`` of a bare one, else ``None``."""
    if match := _BLOCK_TENSOR.fullmatch(gguf_name):
        return f"{match['part']}.{match['kind']}"
    if match := _BARE_BLOCK_TENSOR.fullmatch(gguf_name):
        return match["part"]
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
_SHARED_EXPERT_NAMES = {
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
# GLM-4.5: shared experts, the routing correction bias, and the MTP layers' own tensors
# (``blk.{num_hidden_layers + k}.nextn.*``; their embedding and head are copies).
GLM4_MOE_GGUF_NAMES = GgufNames(
    block_names={
        **BLOCK_NAMES,
        "post_attention_norm": "post_attention_layernorm",
        **_SHARED_EXPERT_NAMES,
        "nextn.eh_proj": "eh_proj",
        "nextn.enorm": "enorm",
        "nextn.hnorm": "hnorm",
        "nextn.embed_tokens": "embed_tokens",
        "nextn.shared_head_head": "shared_head.head",
        "nextn.shared_head_norm": "shared_head.norm",
    },
    whole_block_names={"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
)
# DeepSeek-V2 / V3: MLA's projections and norms. Files converted since llama.cpp's MLA change
# hold ``kv_b_proj`` as ``attn_k_b`` (each head's key rows transposed) and ``attn_v_b``; older
# ones whole, as ``attn_kv_b``. V3's MTP layers are not converted.
DEEPSEEK2_GGUF_NAMES = GgufNames(
    block_names={
        **BLOCK_NAMES,
        **_SHARED_EXPERT_NAMES,
        "attn_q_a": "self_attn.q_a_proj",
        "attn_q_a_norm": "self_attn.q_a_layernorm",
        "attn_q_b": "self_attn.q_b_proj",
        "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm": "self_attn.kv_a_layernorm",
        "attn_kv_b": "self_attn.kv_b_proj",
    },
    whole_block_names={"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
    split_block_names={
        "attn_k_b.weight": ("self_attn.kv_b_proj.weight", "k_b"),
        "attn_v_b.weight": ("self_attn.kv_b_proj.weight", "v_b"),
    },
)
# gpt-oss: the sinks, the biased router, and the experts (stacked, transposed; gate and up
# split out of transformers' interleaved gate_up_proj, weights and biases).
_GPT_OSS_EXPERTS: Mapping[str, tuple[str, SplitRole]] = {
    "ffn_gate_exps.weight": ("mlp.experts.gate_up_proj", "gate"),
    "ffn_up_exps.weight": ("mlp.experts.gate_up_proj", "up"),
    "ffn_gate_exps.bias": ("mlp.experts.gate_up_proj_bias", "gate"),
    "ffn_up_exps.bias": ("mlp.experts.gate_up_proj_bias", "up"),
}
GPT_OSS_GGUF_NAMES = GgufNames(
    block_names={
        name: hf_name for name, hf_name in BLOCK_NAMES.items() if not name.startswith("ffn_")
    },
    whole_block_names={
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "attn_sinks.weight": "self_attn.sinks",
        "ffn_gate_inp.weight": "mlp.router.weight",
        "ffn_gate_inp.bias": "mlp.router.bias",
        "ffn_down_exps.weight": "mlp.experts.down_proj",
        "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
    },
    split_block_names=_GPT_OSS_EXPERTS,
    transposed_block_names=frozenset(
        {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}
    ),
)
# Qwen3-Next: the gated attention's q projection (query and gate rows) as it is, the Gated
# DeltaNet's tensors (``in_proj_qkvz`` regrouped into ``attn_qkv`` and ``attn_gate``, or whole
# as ``ssm_in`` in the first converted files), the shared expert and its gate; every norm but
# ``ssm_norm`` stored ``+ 1``. The converter drops the MTP layers.
QWEN3NEXT_GGUF_NAMES = GgufNames(
    block_names={
        **BLOCK_NAMES,
        "post_attention_norm": "post_attention_layernorm",
        "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
        "ffn_up_shexp": "mlp.shared_expert.up_proj",
        "ffn_down_shexp": "mlp.shared_expert.down_proj",
        "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
        "ssm_in": "linear_attn.in_proj_qkvz",
        "ssm_ba": "linear_attn.in_proj_ba",
        "ssm_conv1d": "linear_attn.conv1d",
        "ssm_norm": "linear_attn.norm",
        "ssm_out": "linear_attn.out_proj",
    },
    whole_block_names={"ssm_dt.bias": "linear_attn.dt_bias", "ssm_a": "linear_attn.A_log"},
    split_block_names={
        "attn_qkv.weight": ("linear_attn.in_proj_qkvz.weight", "qkv"),
        "attn_gate.weight": ("linear_attn.in_proj_qkvz.weight", "z"),
    },
    unshifted_norms=frozenset({"ssm_norm"}),
    negated_exp_block_names=frozenset({"ssm_a"}),
    squeezed_block_names=frozenset({"ssm_conv1d.weight"}),
    norm_weight_shift=1.0,
)
# Kimi Linear: KDA's projections, forget and output gates, its q/k/v conv1d kernels (stored
# ``(1, channels, 1, kernel)``) and ``-exp(A_log)``; DeepSeek's MLA names with ``kv_b_proj``
# split (or whole); the shared experts and the routing correction bias. Nothing is shifted.
KIMI_LINEAR_GGUF_NAMES = GgufNames(
    block_names={
        **DEEPSEEK2_GGUF_NAMES.block_names,
        "ssm_conv1d_q": "self_attn.q_conv1d",
        "ssm_conv1d_k": "self_attn.k_conv1d",
        "ssm_conv1d_v": "self_attn.v_conv1d",
        "ssm_f_a": "self_attn.f_a_proj",
        "ssm_f_b": "self_attn.f_b_proj",
        "ssm_beta": "self_attn.b_proj",
        "ssm_g_a": "self_attn.g_a_proj",
        "ssm_g_b": "self_attn.g_b_proj",
        "ssm_norm": "self_attn.o_norm",
    },
    whole_block_names={
        **DEEPSEEK2_GGUF_NAMES.whole_block_names,
        "ssm_a": "self_attn.A_log",
        "ssm_dt.bias": "self_attn.dt_bias",
    },
    split_block_names=DEEPSEEK2_GGUF_NAMES.split_block_names,
    negated_exp_block_names=frozenset({"ssm_a"}),
    squeezed_block_names=frozenset(
        {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"}
    ),
)
