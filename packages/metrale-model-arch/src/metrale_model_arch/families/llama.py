"""Llama and its close relatives (Mistral, Qwen2, Qwen3) over a paged KV cache.

The variants differ only by config: q/k/v and o biases (Qwen2), a per-head RMSNorm on q and k
before rotary (Qwen3), an explicit ``head_dim``, sliding-window layers, tied embeddings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import cast

import attrs
import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend, TorchBackend
from metrale_model_arch.cache_spec import layer_sliding_window
from metrale_model_arch.families.base import CausalLM, LayerCache, LayerState
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, TensorTarget
from metrale_model_arch.families.int8_layers import Int8Linear
from metrale_model_arch.families.rotary import rope_cos_sin_table
from metrale_model_arch.families.row_invariant_layers import head_logits

SUPPORTED_HIDDEN_ACTS = ("silu",)
UNSUPPORTED_FEATURES = ("moe", "mla", "dsa", "linear_attention", "mhc", "swiglu_limit")
# The dense variants' switches (:mod:`~metrale_model_arch.families.dense_variants`), at the
# values that mean plain llama.
LLAMA_LAYER_DEFAULTS: dict[str, object] = {
    "norm_layout": "pre",
    "norm_weight_offset": 0.0,
    "qk_norm_per_head": True,
    "embedding_multiplier": 1.0,
    "attention_scale": None,
    "residual_multiplier": 1.0,
    "logits_scaling": 1.0,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "partial_rotary_factor": 1.0,
    "nope_layers": (),
    "local_rope_theta": None,
}

_QKV = re.compile(r"(?P<prefix>.+)\.(?P<part>[qkv])_proj\.(?P<kind>weight|bias)")
_GATE_UP = re.compile(r"(?P<prefix>.+)\.(?P<part>gate|up)_proj\.(?P<kind>weight|bias)")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, backend: KernelBackend) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, sliding_window: int | None, backend: KernelBackend
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.sliding_window = sliding_window
        self.backend = backend
        q_size, kv_size = qkv_sizes(config)
        self.qkv_split = (q_size, kv_size, kv_size)
        # q, k and v rows stacked: one matmul reads the normed input once.
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, backend)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, backend)

    def project_qkv(
        self, hidden: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed ``hidden (tokens, hidden)`` -> q, k (rotated) and v, ``(tokens, heads, dim)``."""
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.qkv_split, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.backend.apply_rotary(q, k, positions, cos_sin)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Write k, v into the paged cache and attend; ``(tokens, heads, head_dim)`` out. A
        sliding-window layer addresses its cache by its window's view of the step (its ring's,
        where it keeps one)."""
        metadata = metadata.for_window(self.sliding_window)
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        return self.backend.paged_attention(
            q, k_cache, v_cache, metadata, self.scale, self.sliding_window
        )


class LlamaMLP(nn.Module):
    def __init__(
        self, config: ModelConfig, backend: KernelBackend, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        intermediate = config.intermediate_size if intermediate_size is None else intermediate_size
        # gate rows, then up rows: one matmul, and silu_and_mul reads the halves in place.
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        out: torch.Tensor = self.down_proj(self.backend.silu_and_mul(gate_up))
        return out


# (config, layer index, backend) -> the layer's MLP: ``(tokens, hidden)`` -> ``(tokens, hidden)``.
MlpFactory = Callable[[ModelConfig, int, KernelBackend], nn.Module]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        sliding_window: int | None,
        backend: KernelBackend,
        mlp: nn.Module,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, sliding_window, backend)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = layer_qkv(self, hidden, positions, cos_sin)
        attended = self.self_attn.attend(q, k, v, kv_cache, metadata)
        return layer_output(self, hidden, attended)


QkvStep = Callable[
    ["LlamaDecoderLayer", torch.Tensor, torch.Tensor, torch.Tensor],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]
OutputStep = Callable[["LlamaDecoderLayer", torch.Tensor, torch.Tensor], torch.Tensor]
# (layer, hidden, positions, cos_sin, kv_cache, metadata) -> hidden: a decode-only step's layer.
DecodeLayerStep = Callable[
    ["LlamaDecoderLayer", torch.Tensor, torch.Tensor, torch.Tensor, LayerCache, AttentionMetadata],
    torch.Tensor,
]


# A layer's step around its paged attention, in two segments of plain tensor ops (the part
# ``torch.compile`` can fuse): before it, the normed input's rotated q/k and v; after it, the
# output projection, residuals and MLP. Module-level functions, so one compiled graph serves
# every layer (the weights are its inputs).
def layer_qkv(
    layer: LlamaDecoderLayer, hidden: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer.self_attn.project_qkv(layer.input_layernorm(hidden), positions, cos_sin)


def layer_output(
    layer: LlamaDecoderLayer, hidden: torch.Tensor, attended: torch.Tensor
) -> torch.Tensor:
    norm = layer.post_attention_layernorm
    # The residual add and the norm after it in one op: ``hidden + o_proj(...)``, normed.
    normed, hidden = norm.backend.add_rms_norm(
        layer.self_attn.o_proj(attended.reshape(hidden.shape[0], -1)), hidden, norm.weight, norm.eps
    )
    out: torch.Tensor = hidden + layer.mlp(normed)
    return out


@attrs.frozen(eq=False)
class LayerExecutor:
    """How a llama-family model runs its layers' steps: ``name`` (``eager``, ``compiled``,
    ``native``), the two segments around each layer's paged attention, and, for a decode-only
    step, optionally the whole layer in one call.

    A model holds one (``LlamaForCausalLM.executor``), replaced whole by ``install_executor``
    and read once per forward: a forward that runs while another thread installs one runs
    either the old executor or the new, never a mix of the two.
    """

    name: str
    qkv: QkvStep
    output: OutputStep
    decode_layer: DecodeLayerStep | None = None


# The plain ops of ``layer_qkv`` and ``layer_output``: what every llama-family model starts with.
EAGER_EXECUTOR = LayerExecutor("eager", layer_qkv, layer_output)


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        max_seq_len: int,
        backend: KernelBackend,
        mlp_factory: MlpFactory,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                config, layer_sliding_window(config, i), backend, mlp_factory(config, i, backend)
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        # (max_seq_len, head_dim) float32; derived from the config, never part of a checkpoint.
        self.cos_sin_cache: torch.Tensor
        self.register_buffer(
            "cos_sin_cache", rope_cos_sin_table(config, max_seq_len), persistent=False
        )


class LlamaForCausalLM(CausalLM):
    """Model types ``llama``, ``mistral``, ``qwen2`` and ``qwen3`` (see :class:`CausalLM`).

    A subclass with another MLP per layer (an MoE block) overrides ``check_config`` and
    ``build_mlp``; attention, norms, embeddings and head stay the same. Every subclass computes
    ``layer_qkv`` / ``layer_output``, which the compiled and native executors run: a family
    whose layers differ (:mod:`~metrale_model_arch.families.dense_variants`) is no subclass.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__()
        self.check_config(config)
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.backend = backend if backend is not None else TorchBackend()
        self.model = LlamaModel(config, self.max_seq_len, self.backend, self.build_mlp)
        # int8 weights swap in an ``Int8Linear`` (``build_model``).
        self.lm_head: nn.Linear | Int8Linear = nn.Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # How each layer's step runs (see ``LayerExecutor``); the engine installs a faster one.
        self.executor = EAGER_EXECUTOR

    @property
    def executor_name(self) -> str:
        return self.executor.name

    def install_executor(self, executor: LayerExecutor) -> None:
        """Run the layers' steps with ``executor`` from the next forward on (one attribute
        written: safe while another thread runs a forward)."""
        self.executor = executor

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_supported(config)

    @staticmethod
    def build_mlp(config: ModelConfig, layer_index: int, backend: KernelBackend) -> nn.Module:
        del layer_index
        return LlamaMLP(config, backend)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
    ) -> torch.Tensor:
        del states  # no per-sequence state
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(self.model.layers)} layers")
        cos_sin = self.model.cos_sin_cache
        hidden = self.model.embed_tokens(input_ids)
        executor = self.executor
        qkv_step, output_step = executor.qkv, executor.output
        layers = cast("Sequence[LlamaDecoderLayer]", self.model.layers)
        decode_layer = executor.decode_layer
        if decode_layer is not None and metadata.is_decode_only:
            for layer, kv_cache in zip(layers, kv_caches, strict=True):
                hidden = decode_layer(layer, hidden, positions, cos_sin, kv_cache, metadata)
            return self.model.norm(hidden)  # type: ignore[no-any-return]
        for layer, kv_cache in zip(layers, kv_caches, strict=True):
            q, k, v = qkv_step(layer, hidden, positions, cos_sin)
            attended = layer.self_attn.attend(q, k, v, kv_cache, metadata)
            hidden = output_step(layer, hidden, attended)
        out: torch.Tensor = self.model.norm(hidden)
        return out

    @property
    def has_dense_layers(self) -> bool:
        """Every layer's MLP is the dense SwiGLU one (what a compiled ``layer_output`` traces)."""
        return all(type(layer.mlp) is LlamaMLP for layer in self.model.layers)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(self.lm_head, Int8Linear):
            quantized: torch.Tensor = self.lm_head(hidden, out=out)
            return quantized
        return head_logits(self.lm_head, hidden, out)


_CAUSAL_LM_PREFIXES = ("model.", "lm_head.")


def llama_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    """Checkpoint names -> parameters: ``q/k/v_proj`` into row ranges of ``qkv_proj``,
    ``gate/up_proj`` into the halves of ``gate_up_proj`` (weights and biases); every other
    tensor to the parameter of its own name. A base model's names (``AutoModel``'s save of an
    embedding model: ``layers.0...``, no ``model.`` prefix) are read as the causal LM's."""
    q_size, kv_size = qkv_sizes(config)
    qkv_rows = {
        "q": slice(0, q_size),
        "k": slice(q_size, q_size + kv_size),
        "v": slice(q_size + kv_size, q_size + 2 * kv_size),
    }

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget:
        if not name.startswith(_CAUSAL_LM_PREFIXES):
            name = "model." + name
        if match := _QKV.fullmatch(name):
            fused = f"{match['prefix']}.qkv_proj.{match['kind']}"
            return TensorTarget(fused, (qkv_rows[match["part"]],))
        if match := _GATE_UP.fullmatch(name):
            rows = shape[0]
            half = slice(0, rows) if match["part"] == "gate" else slice(rows, 2 * rows)
            return TensorTarget(f"{match['prefix']}.gate_up_proj.{match['kind']}", (half,))
        return TensorTarget(name)

    return target


def qkv_sizes(config: ModelConfig) -> tuple[int, int]:
    """Rows of the q projection and of each of k and v."""
    return (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )


def check_supported(
    config: ModelConfig,
    unsupported: tuple[str, ...] = UNSUPPORTED_FEATURES,
    *,
    hidden_acts: tuple[str, ...] = SUPPORTED_HIDDEN_ACTS,
    layer_variants: bool = False,
) -> None:
    """Raise ``ValueError`` naming the first config feature this family cannot run (with
    ``layer_variants``, the dense variants' switches and LongRoPE are not refused)."""
    if config.hidden_act not in hidden_acts:
        raise ValueError(
            f"unsupported hidden_act {config.hidden_act!r} for {config.model_type}; "
            f"supported: {', '.join(hidden_acts)}"
        )
    for feature in unsupported:
        if getattr(config, feature, None) is not None:
            raise ValueError(f"{config.model_type}: the llama family does not support {feature}")
    if not layer_variants:
        for field, plain in LLAMA_LAYER_DEFAULTS.items():
            if getattr(config, field) != plain:
                raise ValueError(f"{config.model_type}: the llama family does not support {field}")
        if config.rope_scaling is not None and config.rope_scaling.rope_type == "longrope":
            raise ValueError(f"{config.model_type}: the llama family does not support longrope")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({config.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({config.num_key_value_heads})"
        )
