"""``ModelConfig``: every field the architectures and the memory math read, parsed at the edge.

Value types only: the parsers live in ``metrale_config.hf`` and ``metrale_config.gguf``
(``model_config_from_hf_file``, ``model_config_from_gguf``...), above this module, which
imports neither.
"""

from __future__ import annotations

import enum

import attrs

from metrale_config.fp8_quantization import Fp8Quantization
from metrale_config.int4_quantization import Int4Quantization

# The old constants, re-exported for ``from metrale_config.model_config import SLIDING_ATTENTION``.
from metrale_config.layer_types import FULL_ATTENTION as FULL_ATTENTION
from metrale_config.layer_types import LINEAR_ATTENTION as LINEAR_ATTENTION
from metrale_config.layer_types import SLIDING_ATTENTION as SLIDING_ATTENTION
from metrale_config.layer_types import SPARSE_ATTENTION as SPARSE_ATTENTION
from metrale_config.layer_types import LayerType, to_layer_types
from metrale_config.rope import RopeScaling
from metrale_config.siglip_vision import SiglipVisionConfig


class NormLayout(enum.StrEnum):
    """Where a decoder layer's RMSNorms sit around attention and the MLP.

    ``pre``: before each (llama); ``post``: after each, before its residual add (olmo2);
    ``sandwich``: both (gemma2, gemma3).
    """

    PRE = "pre"
    POST = "post"
    SANDWICH = "sandwich"


@attrs.frozen(kw_only=True)
class MoeConfig:
    """Mixture-of-experts fields (qwen3_moe, mixtral, glm4_moe, glm5_next, deepseek_v2/v3)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # One entry per layer: "dense" or "sparse".
    mlp_layer_types: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class MlaConfig:
    """Multi-head latent attention: the cache holds ``kv_lora_rank + qk_rope_head_dim`` a token.

    ``rope_interleave``: the RoPE dims rotate in adjacent pairs ``(x0, x1), (x2, x3)...``
    (DeepSeek's layout), not as two halves. ``is_rotary`` false: those dims are cached and
    scored unrotated (Kimi Linear's NoPE MLA), and no RoPE table is kept.
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True
    is_rotary: bool = True


@attrs.frozen(kw_only=True)
class DsaConfig:
    """DeepSeek sparse attention indexer fields (``index_*``)."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int
    index_kpool: int = 1
    index_kpool_always_select_tail: bool = True
    # One entry per layer: "full" (own indexer) or "shared".
    indexer_types: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class LinearAttentionConfig:
    """Linear attention (KDA / GatedDeltaNet) fields: per-sequence recurrent + conv state.

    ``num_heads`` value heads (the state's), each with a ``(head_dim, value_head_dim)`` state;
    q and k have ``num_key_heads`` heads of ``head_dim``, each shared by ``num_heads //
    num_key_heads`` value heads (Gated DeltaNet; KDA: both default to the value side's).
    """

    num_heads: int
    head_dim: int
    conv_kernel_dim: int
    lower_bound: float | None = None
    num_key_heads: int = attrs.field(
        default=attrs.Factory(lambda self: self.num_heads, takes_self=True)
    )
    value_head_dim: int = attrs.field(
        default=attrs.Factory(lambda self: self.head_dim, takes_self=True)
    )


@attrs.frozen(kw_only=True)
class MtpConfig:
    """Multi-token-prediction (draft) layers stored beside the main stack."""

    num_layers: int
    layer_types: tuple[LayerType, ...] = attrs.field(default=(), converter=to_layer_types)
    # One entry per MTP layer, "dense" or "sparse", where the family says (glm4_moe); else ().
    mlp_layer_types: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class VisionConfig:
    """A vision tower beside the text stack (glm5_next's or qwen2_5_vl's ``vision_config``) and
    the prompt tokens that place its output: each ``image_token_id`` of a prompt takes one merged
    patch.

    A patch is ``temporal_patch_size`` frames of ``patch_size`` squared pixels; each
    ``spatial_merge_size`` squared patches merge into one ``out_hidden_size`` embedding, which
    replaces one image token of the text stack's input. qwen2_5_vl's blocks attend within
    windows of ``window_size`` pixels a side, but those in ``fullatt_block_indexes``
    (``window_size`` ``None``: every block attends to the whole frame); its prompts wrap each
    image in ``vision_start_token_id`` / ``vision_end_token_id``.
    """

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    projection_intermediate_size: int
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    hidden_act: str = "silu"
    attention_bias: bool = True
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    swiglu_limit: float | None = None
    image_token_id: int
    video_token_id: int | None = None
    video_start_token_id: int | None = None
    video_end_token_id: int | None = None
    window_size: int | None = None
    fullatt_block_indexes: tuple[int, ...] = ()
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch row of ``pixel_values``: channels x frames x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@attrs.frozen(kw_only=True)
class MhcConfig:
    """Manifold-constrained hyper-connections (glm5_next): ``num_streams`` residual vectors."""

    num_streams: int
    eps: float = 1e-6
    num_sinkhorn_iters: int = 20


@attrs.frozen(kw_only=True)
class ModelConfig:
    """A model's architecture, as read from ``config.json`` or GGUF metadata.

    Build one with ``model_config_from_hf_file(path)``, ``model_config_from_hf_dict(d,
    source=...)`` or ``model_config_from_gguf(path)``; derive variants with ``attrs.evolve``.
    Parsed configs are validated: ``layer_types`` (and ``moe.mlp_layer_types``,
    ``dsa.indexer_types``) have ``num_hidden_layers`` entries, sizes are positive, heads divide
    by kv heads.

    ``source`` says where the config came from (``config.json at /x/config.json``, ``GGUF file
    at /x/m.gguf``) and starts every error message. ``rope_scaling`` is ``None`` for plain RoPE.
    For MLA models (glm5_next) ``head_dim`` is the query/key head dim
    ``qk_nope_head_dim + qk_rope_head_dim``; ``mla`` holds the rest.
    """

    source: str
    model_type: str
    architectures: tuple[str, ...] = ()
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    layer_types: tuple[LayerType, ...] = attrs.field(default=(), converter=to_layer_types)
    moe: MoeConfig | None = None
    mla: MlaConfig | None = None
    dsa: DsaConfig | None = None
    linear_attention: LinearAttentionConfig | None = None
    mtp: MtpConfig | None = None
    quantization_method: str | None = None
    # An AWQ or GPTQ 4-bit checkpoint's quantization_config (the projections' layout).
    int4_quantization: Int4Quantization | None = None
    # An FP8 e4m3 checkpoint's quantization_config (dequantized at load).
    fp8_quantization: Fp8Quantization | None = None
    # A GGUF's ggml types of its layers' projection weights (attn_q ... ffn_down), sorted.
    gguf_projection_types: tuple[str, ...] = ()
    mhc: MhcConfig | None = None
    # The vision tower a multimodal checkpoint carries (glm5_next, qwen2_5_vl), else None.
    vision: VisionConfig | None = None
    # Gemma 3's SigLIP tower and projector (gemma3), else None.
    siglip_vision: SiglipVisionConfig | None = None
    # Multimodal RoPE (qwen2_5_vl): how many of a head's rotary frequencies turn by the
    # temporal, height and width position, in that order; () for plain RoPE.
    mrope_section: tuple[int, ...] = ()
    # Clamp of the SwiGLU gate/up activations (glm5_next, gpt_oss); None means unclamped.
    swiglu_limit: float | None = None
    # gpt_oss's SwiGLU: ``(up + 1) * gate * sigmoid(alpha * gate)``; None means plain SiLU.
    swiglu_alpha: float | None = None
    # The dense families' departures from llama (olmo2, granite, smollm3, phi3, gemma2/3).
    norm_layout: NormLayout = NormLayout.PRE
    # Gemma's RMSNorm scales by ``1 + weight``.
    norm_weight_offset: float = 0.0
    # q/k norms over each head (qwen3, gemma3) or over the whole projection (olmo2).
    qk_norm_per_head: bool = True
    # Embeddings times this, in the model dtype (granite's multiplier, gemma's sqrt(hidden)).
    embedding_multiplier: float = 1.0
    # The softmax scale; None means head_dim ** -0.5.
    attention_scale: float | None = None
    # Each sublayer's output times this before its residual add (granite).
    residual_multiplier: float = 1.0
    # Logits divided by this (granite's logits_scaling).
    logits_scaling: float = 1.0
    # ``cap * tanh(x / cap)`` on attention scores and on logits (gemma2); None: no cap.
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # The leading fraction of each head's dims that rotary turns (phi3's partial rotary).
    partial_rotary_factor: float = 1.0
    # Layers that skip rotary (smollm3's NoPE layers).
    nope_layers: tuple[int, ...] = ()
    # Sliding-window layers' own plain RoPE base (gemma3's rope_local_base_freq); None: shared.
    local_rope_theta: float | None = None

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def num_layers_of_type(self, layer_type: LayerType | str) -> int:
        """How many layers have ``layer_type`` (e.g. ``LayerType.FULL_ATTENTION``)."""
        return sum(1 for kind in self.layer_types if kind == layer_type)
