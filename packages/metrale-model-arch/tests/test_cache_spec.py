"""Per-layer cache specs for each family, and what each costs."""

from __future__ import annotations

import attrs

from metrale_config import SLIDING_ATTENTION, ModelConfig
from metrale_model_arch.cache_spec import (
    FlatIndexerSpec,
    FullAttentionSpec,
    LinearAttentionSpec,
    MlaLatentSpec,
    PagedIndexerSpec,
    SlidingWindowSpec,
    SparseAttentionSpec,
)
from metrale_model_arch.owners import LINEAR_STATE_POOL, PER_SEQUENCE_STATE
from metrale_model_arch.registry import cache_specs


def test_llama_caches_k_and_v_in_every_layer(tiny_config: ModelConfig) -> None:
    specs = cache_specs(tiny_config, indexer_paged=True)
    assert specs == (FullAttentionSpec(num_kv_heads=2, head_dim=8),) * 2
    # K + V x 2 kv heads x head_dim 8 x 2 bytes
    assert specs[0].paged_bytes_per_token(2) == 64
    assert specs[0].state(4096) == ()


def test_mistral_window_applies_to_every_layer_without_layer_types(
    tiny_config: ModelConfig,
) -> None:
    mistral = attrs.evolve(tiny_config, model_type="mistral", sliding_window=32)
    specs = cache_specs(mistral, indexer_paged=True)
    assert specs == (SlidingWindowSpec(num_kv_heads=2, head_dim=8, sliding_window=32),) * 2
    # Same storage as full attention.
    assert specs[0].paged() == FullAttentionSpec(num_kv_heads=2, head_dim=8).paged()


def test_layer_types_choose_which_layers_slide(tiny_config: ModelConfig) -> None:
    mixed = attrs.evolve(
        tiny_config,
        model_type="qwen2",
        sliding_window=16,
        layer_types=("full_attention", SLIDING_ATTENTION),
    )
    full, sliding = cache_specs(mixed, indexer_paged=True)
    assert type(full) is FullAttentionSpec
    assert sliding == SlidingWindowSpec(num_kv_heads=2, head_dim=8, sliding_window=16)


def test_glm5_next_has_kda_state_and_dsa_latent_plus_indexer(tiny_glm5_next: ModelConfig) -> None:
    kda, dsa, _, _ = cache_specs(tiny_glm5_next, indexer_paged=True)
    assert kda == LinearAttentionSpec(num_heads=2, head_dim=8, conv_kernel_dim=4)
    latent = MlaLatentSpec(kv_lora_rank=16, qk_rope_head_dim=0)
    assert dsa == SparseAttentionSpec(latent=latent, indexer=PagedIndexerSpec(index_head_dim=8))
    assert kda.paged_bytes_per_token(2) == 0
    # recurrent 2 heads x 8 x 8 + conv 3 x 16 channels x 3 taps, float32
    assert kda.state_bytes_per_slot(LINEAR_STATE_POOL, 256, 2) == (128 + 144) * 4
    # latent 16 x 2 bytes + indexer key 8 x 4 bytes (float32)
    assert dsa.paged_bytes_per_token(2) == 32 + 32
    assert dsa.state(256) == ()


def test_flat_indexer_is_per_sequence_state_not_paged(tiny_glm5_next: ModelConfig) -> None:
    _, dsa, _, _ = cache_specs(tiny_glm5_next, indexer_paged=False)
    assert isinstance(dsa, SparseAttentionSpec)
    assert dsa.indexer == FlatIndexerSpec(index_head_dim=8, index_kpool=4)
    assert dsa.paged_bytes_per_token(2) == 32
    # capacity rounds 255 down to whole pools of 4: 252 tokens x (8 x 4 + 1) bytes
    assert dsa.state_bytes_per_slot(PER_SEQUENCE_STATE, 255, 2) == 252 * 33
    assert dsa.state_bytes_per_slot(LINEAR_STATE_POOL, 255, 2) == 0
