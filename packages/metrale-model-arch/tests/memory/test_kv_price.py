"""KV price per token, linear-state pool, arena, RoPE table and headroom, by hand."""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.memory import (
    buffer_arena_bytes,
    kv_bytes_per_block,
    kv_bytes_per_token,
    linear_state_bytes_per_slot,
    linear_state_pool_bytes,
    rope_table_bytes,
    runtime_headroom_bytes,
    step_activation_bytes,
)
from metrale_model_arch.memory.headroom import CPU_RUNTIME_FIXED_BYTES, CUDA_DRIVER_FIXED_BYTES


def test_standard_attention_caches_k_and_v_of_every_layer(tiny_llama: ModelConfig) -> None:
    # 2 layers x (K + V) x 2 kv heads x 16 dims x 4 bytes
    assert kv_bytes_per_token(tiny_llama, 4, indexer_paged=False) == 512
    assert kv_bytes_per_token(tiny_llama, 2, indexer_paged=True) == 256
    assert kv_bytes_per_block(tiny_llama, 4, 16, indexer_paged=False) == 8192


def test_mla_caches_the_latent_once_and_linear_layers_nothing(glm5_next: ModelConfig) -> None:
    # 11 DSA (MLA) layers x (kv_lora_rank 512 + qk_rope_head_dim 0) x 2 bytes
    assert kv_bytes_per_token(glm5_next, 2, indexer_paged=False) == 11 * 512 * 2 == 11_264
    # the paged indexer adds 4 * index_head_dim (128) bytes per DSA layer
    assert kv_bytes_per_token(glm5_next, 2, indexer_paged=True) == 11_264 + 11 * 512 == 16_896


def test_linear_state_pool_holds_one_dummy_slot(glm5_next: ModelConfig) -> None:
    # 34 KDA layers x (recurrent 64 heads x 128 x 128 x 4 B + conv 3 x 8192 ch x 3 taps x 4 B)
    per_slot = 34 * (64 * 128 * 128 * 4 + 3 * 8192 * 3 * 4)
    assert per_slot == 152_633_344
    assert linear_state_bytes_per_slot(glm5_next) == per_slot
    assert linear_state_pool_bytes(glm5_next, 8) == 9 * per_slot
    assert linear_state_pool_bytes(glm5_next, 0) == 2 * per_slot


def test_models_without_linear_attention_have_no_pool(tiny_llama: ModelConfig) -> None:
    assert linear_state_pool_bytes(tiny_llama, 64) == 0


def test_arena_holds_step_inputs_block_tables_and_logits_rows(tiny_llama: ModelConfig) -> None:
    # ids + positions + slots: 3 x 128 x 8 bytes; block tables: 4 rows x ceil(250 / 16) = 16
    # blocks x 8 bytes; logits: 4 rows x 1000 vocab x 4 bytes
    assert (
        buffer_arena_bytes(
            tiny_llama,
            max_batch_tokens=128,
            max_batch_size=4,
            dtype_bytes=4,
            max_seq_len=250,
            block_size=16,
        )
        == 3072 + 512 + 16_000
    )


def test_rope_table_is_float32_positions_by_rotary_dim(
    tiny_llama: ModelConfig, glm5_next: ModelConfig
) -> None:
    assert rope_table_bytes(tiny_llama, 256) == 256 * 16 * 4
    assert rope_table_bytes(glm5_next, 131072) == 0  # NoPE


def test_headroom_is_the_runtime_floor_plus_the_widest_step(tiny_llama: ModelConfig) -> None:
    # per token: 4 x hidden 64 + q 64 + k,v 64 + 3 x intermediate 128 = 768 values x 4 bytes x
    # 128 tokens; scores: 4 heads x 128 queries x 256 keys x 9 bytes; context: 2 x 256 x 64 x 4
    activations = 768 * 4 * 128 + 4 * 128 * 256 * 9 + 2 * 256 * 64 * 4
    assert activations == 1_703_936
    assert (
        step_activation_bytes(tiny_llama, max_batch_tokens=128, max_seq_len=256, dtype_bytes=4)
        == activations
    )
    cpu = runtime_headroom_bytes(
        tiny_llama,
        device_kind="cpu",
        budget_bytes=10**9,
        max_batch_tokens=128,
        max_seq_len=256,
        dtype_bytes=4,
    )
    assert cpu == CPU_RUNTIME_FIXED_BYTES + activations
    cuda = runtime_headroom_bytes(
        tiny_llama,
        device_kind="cuda",
        budget_bytes=10**9,
        max_batch_tokens=128,
        max_seq_len=256,
        dtype_bytes=4,
    )
    assert cuda == cpu + CUDA_DRIVER_FIXED_BYTES + 21_000_000
