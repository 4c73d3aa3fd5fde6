"""Per-layer cache specs: what each decoder layer keeps between steps, and what it costs.

A spec names the layer's tensors, never allocates them. Paged tensors live in the KV pool, one
``(num_blocks, block_size, *token_shape)`` tensor per role; per-sequence state lives in a pool
of slots, one ``(num_slots, *shape)`` tensor per role. The memory plan prices these specs and
the allocators (:mod:`metrale_model_arch.kv_cache`) allocate them, so the two agree by
construction.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from metrale_config import LINEAR_ATTENTION, SLIDING_ATTENTION, SPARSE_ATTENTION, ModelConfig
from metrale_kernels.reference.kv_quantization import SCALE_BYTES
from metrale_model_arch.owners import LINEAR_STATE_POOL, PER_SEQUENCE_STATE, SLIDING_WINDOW_KV

# "model": the serve dtype; "compute": what the ops reduce in, float32 (float64 at a float64
# serve: :func:`metrale_kernels.compute_dtype`); the others are fixed whatever the serve dtype
# (the one-byte floats and int8 hold quantized K/V rows, :mod:`metrale_model_arch.kv_cache_dtype`).
TensorDtype = Literal[
    "model", "compute", "float32", "uint8", "int8", "float8_e4m3fn", "float8_e5m2"
]
FIXED_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
# A quantized K/V row's float16 scale, stored after its values.
KV_SCALE_BYTES = SCALE_BYTES
FLOAT32_BYTES = 4


def dtype_bytes_of(dtype: TensorDtype, model_dtype_bytes: int) -> int:
    if dtype == "model":
        return model_dtype_bytes
    if dtype == "compute":
        return max(FLOAT32_BYTES, model_dtype_bytes)
    return FIXED_DTYPE_BYTES[dtype]


@attrs.frozen(kw_only=True)
class PagedTensors:
    """Tensors of one layer stored per token in the KV pool, one per role, all alike.

    Layers whose ``PagedTensors`` are equal share one allocation.
    """

    roles: tuple[str, ...]
    token_shape: tuple[int, ...]
    dtype: TensorDtype

    def bytes_per_token(self, model_dtype_bytes: int) -> int:
        itemsize = dtype_bytes_of(self.dtype, model_dtype_bytes)
        return len(self.roles) * math.prod(self.token_shape) * itemsize


@attrs.frozen(kw_only=True)
class StateTensor:
    """One per-sequence tensor of a layer: ``shape`` per slot, in pool ``owner``."""

    role: str
    shape: tuple[int, ...]
    dtype: TensorDtype
    owner: str
    # Slots the pool holds beyond the sequences' own (padded rows write to a dummy slot).
    num_dummy_slots: int = 0

    def bytes_per_slot(self, model_dtype_bytes: int) -> int:
        return math.prod(self.shape) * dtype_bytes_of(self.dtype, model_dtype_bytes)


@attrs.frozen(kw_only=True)
class LayerCacheSpec:
    """What one decoder layer caches: nothing, unless a subclass says so."""

    def paged(self) -> tuple[PagedTensors, ...]:
        return ()

    def state(self, max_seq_len: int) -> tuple[StateTensor, ...]:
        """Per-sequence tensors at a ``max_seq_len`` context."""
        del max_seq_len
        return ()

    def paged_bytes_per_token(self, model_dtype_bytes: int) -> int:
        return sum(tensors.bytes_per_token(model_dtype_bytes) for tensors in self.paged())

    def state_bytes_per_slot(self, owner: str, max_seq_len: int, model_dtype_bytes: int) -> int:
        return sum(
            tensor.bytes_per_slot(model_dtype_bytes)
            for tensor in self.state(max_seq_len)
            if tensor.owner == owner
        )


@attrs.frozen(kw_only=True)
class FullAttentionSpec(LayerCacheSpec):
    """K and V of every token: ``(kv_heads, head_dim)`` each, at the serve dtype; or, quantized
    (``kv_dtype`` one byte), ``(kv_heads, head_dim + KV_SCALE_BYTES)``."""

    num_kv_heads: int
    head_dim: int
    kv_dtype: TensorDtype = "model"

    def paged(self) -> tuple[PagedTensors, ...]:
        row = self.head_dim if self.kv_dtype == "model" else self.head_dim + KV_SCALE_BYTES
        shape = (self.num_kv_heads, row)
        return (PagedTensors(roles=("k", "v"), token_shape=shape, dtype=self.kv_dtype),)


@attrs.frozen(kw_only=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Stored like full attention; attention reads only the last ``sliding_window`` tokens."""

    sliding_window: int


@attrs.frozen(kw_only=True)
class SlidingWindowRingSpec(LayerCacheSpec):
    """A sliding-window layer whose K/V live in a ring per sequence, not in the KV pool: per
    slot, ``ring_blocks`` blocks of ``block_size`` tokens (``attention``'s row each), position
    ``p`` at row ``p mod ring_tokens``. ``step_tokens`` is the most tokens one sequence may
    run in a step: the ring holds ``sliding_window - 1 + step_tokens`` and more, so no row a
    query reads is overwritten in its step (:mod:`metrale_model_arch.sliding_window_ring`)."""

    attention: SlidingWindowSpec
    ring_blocks: int
    block_size: int
    step_tokens: int

    @property
    def sliding_window(self) -> int:
        return self.attention.sliding_window

    @property
    def ring_tokens(self) -> int:
        return self.ring_blocks * self.block_size

    def state(self, max_seq_len: int) -> tuple[StateTensor, ...]:
        del max_seq_len
        (paged,) = self.attention.paged()
        return tuple(
            StateTensor(
                role=role,
                shape=(self.ring_tokens, *paged.token_shape),
                dtype=paged.dtype,
                owner=SLIDING_WINDOW_KV,
            )
            for role in paged.roles
        )


@attrs.frozen(kw_only=True)
class MlaLatentSpec(LayerCacheSpec):
    """MLA: the compressed latent and the decoupled RoPE key, once per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def paged(self) -> tuple[PagedTensors, ...]:
        return (PagedTensors(roles=("latent",), token_shape=(self.latent_dim,), dtype="model"),)


@attrs.frozen(kw_only=True)
class PagedIndexerSpec(LayerCacheSpec):
    """The DSA indexer's float32 (compute dtype) key of every token, in the KV pool."""

    index_head_dim: int

    def paged(self) -> tuple[PagedTensors, ...]:
        shape = (self.index_head_dim,)
        return (PagedTensors(roles=("index_keys",), token_shape=shape, dtype="compute"),)


@attrs.frozen(kw_only=True)
class FlatIndexerSpec(LayerCacheSpec):
    """The DSA indexer held per sequence: a float32 key and a one-byte scale/flag for each of
    :func:`dsa_capacity` tokens."""

    index_head_dim: int
    index_kpool: int

    def state(self, max_seq_len: int) -> tuple[StateTensor, ...]:
        capacity = dsa_capacity(max_seq_len, self.index_kpool)
        return (
            StateTensor(
                role="index_keys",
                shape=(capacity, self.index_head_dim),
                dtype="compute",
                owner=PER_SEQUENCE_STATE,
            ),
            StateTensor(
                role="index_flags", shape=(capacity,), dtype="uint8", owner=PER_SEQUENCE_STATE
            ),
        )


@attrs.frozen(kw_only=True)
class SparseAttentionSpec(LayerCacheSpec):
    """A DSA layer: the MLA latent, paged, and the indexer keys, paged or per sequence."""

    latent: MlaLatentSpec
    indexer: PagedIndexerSpec | FlatIndexerSpec

    def paged(self) -> tuple[PagedTensors, ...]:
        return self.latent.paged() + self.indexer.paged()

    def state(self, max_seq_len: int) -> tuple[StateTensor, ...]:
        return self.indexer.state(max_seq_len)


@attrs.frozen(kw_only=True)
class LinearAttentionSpec(LayerCacheSpec):
    """Linear attention (KDA, Gated DeltaNet): nothing per token; per sequence a float32
    (compute dtype) recurrent state ``(heads, head_dim, value_head_dim)`` and the last
    ``conv_kernel_dim - 1`` inputs of the short convolution over q, k (``num_key_heads`` heads
    of ``head_dim`` each) and v (``num_heads`` of ``value_head_dim``). The pool holds one dummy
    slot for padded rows."""

    num_heads: int
    head_dim: int
    conv_kernel_dim: int
    num_key_heads: int = attrs.field(
        default=attrs.Factory(lambda self: self.num_heads, takes_self=True)
    )
    value_head_dim: int = attrs.field(
        default=attrs.Factory(lambda self: self.head_dim, takes_self=True)
    )

    def state(self, max_seq_len: int) -> tuple[StateTensor, ...]:
        del max_seq_len
        channels = 2 * self.num_key_heads * self.head_dim + self.num_heads * self.value_head_dim
        return (
            StateTensor(
                role="recurrent",
                shape=(self.num_heads, self.head_dim, self.value_head_dim),
                dtype="compute",
                owner=LINEAR_STATE_POOL,
                num_dummy_slots=1,
            ),
            StateTensor(
                role="conv",
                shape=(channels, self.conv_kernel_dim - 1),
                dtype="compute",
                owner=LINEAR_STATE_POOL,
                num_dummy_slots=1,
            ),
        )


def dsa_capacity(max_seq_len: int, index_kpool: int) -> int:
    """Tokens a flat indexer cache holds for a ``max_seq_len`` context: keys are pooled
    ``index_kpool`` tokens at a time, so whole pools only."""
    pool = max(index_kpool, 1)
    return (max_seq_len // pool) * pool


def layer_sliding_window(config: ModelConfig, layer_index: int) -> int | None:
    """The window of layer ``layer_index``: every layer's when ``layer_types`` is empty."""
    if config.sliding_window is None:
        return None
    if config.layer_types and config.layer_types[layer_index] != SLIDING_ATTENTION:
        return None
    return config.sliding_window


def attention_cache_specs(
    config: ModelConfig, *, indexer_paged: bool
) -> tuple[LayerCacheSpec, ...]:
    """One spec per layer, read from ``layer_types`` and the MLA / DSA / linear sections.

    Every attention layer of an MLA model caches the latent; a sparse-attention layer adds its
    indexer keys (in the KV pool with ``indexer_paged``, else per sequence).
    """
    layer_types = config.layer_types or ("full_attention",) * config.num_hidden_layers
    specs: list[LayerCacheSpec] = []
    for index, kind in enumerate(layer_types):
        if kind == LINEAR_ATTENTION:
            linear = config.linear_attention
            if linear is None:
                raise ValueError(
                    f"{config.source}: layer {index} is linear attention without its fields"
                )
            specs.append(
                LinearAttentionSpec(
                    num_heads=linear.num_heads,
                    head_dim=linear.head_dim,
                    conv_kernel_dim=linear.conv_kernel_dim,
                    num_key_heads=linear.num_key_heads,
                    value_head_dim=linear.value_head_dim,
                )
            )
        elif config.mla is not None:
            latent = MlaLatentSpec(
                kv_lora_rank=config.mla.kv_lora_rank, qk_rope_head_dim=config.mla.qk_rope_head_dim
            )
            if kind == SPARSE_ATTENTION and config.dsa is not None:
                indexer: PagedIndexerSpec | FlatIndexerSpec = (
                    PagedIndexerSpec(index_head_dim=config.dsa.index_head_dim)
                    if indexer_paged
                    else FlatIndexerSpec(
                        index_head_dim=config.dsa.index_head_dim,
                        index_kpool=config.dsa.index_kpool,
                    )
                )
                specs.append(SparseAttentionSpec(latent=latent, indexer=indexer))
            else:
                specs.append(latent)
        elif (window := layer_sliding_window(config, index)) is not None:
            specs.append(
                SlidingWindowSpec(
                    num_kv_heads=config.num_key_value_heads,
                    head_dim=config.head_dim,
                    sliding_window=window,
                )
            )
        else:
            specs.append(
                FullAttentionSpec(num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim)
            )
    return tuple(specs)
