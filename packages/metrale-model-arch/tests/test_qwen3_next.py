"""Parity of ``qwen3_next`` (Qwen3-Next) with transformers on a tiny random checkpoint (every
parameter randomized, float32): Gated DeltaNet layers with fewer key than value heads and a
value dim unlike the key dim, gated attention with partial rotary and biases, a dense layer
beside sparse ones; a prompt past one 64-token delta-rule chunk. The checkpoint carries a random
MTP layer (``mtp.*``, as Qwen3-Next's releases do): loaded, counted and owned by
``weights.mtp`` only when the config keeps it, its K/V priced for the draft pool, and its
forward against the formula written in plain torch (the block: transformers' decoder layer)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing.family_parity import (
    Bfloat16ParityChecks,
    FamilyCheckpoint,
    assert_counts_equal_transformers,
    load_checkpoint,
    random_prompts,
)
from metrale_testing.qwen3_next_mtp import add_qwen3_next_mtp, save_tiny_qwen3_next
from safetensors.torch import load_file

from metrale_config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    ConfigError,
    MtpConfig,
    model_config_from_hf_dict,
    model_config_from_hf_file,
)
from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadOptions, allocate_kv_cache, mtp_free_config
from metrale_model_arch.build import CheckpointError
from metrale_model_arch.cache_spec import FullAttentionSpec, LinearAttentionSpec
from metrale_model_arch.counts.qwen3_next import qwen3_next_param_counts
from metrale_model_arch.families.checkpoint_mapping import Skip, TensorTarget
from metrale_model_arch.families.qwen3_next import (
    Qwen3NextForCausalLM,
    qwen3_next_checkpoint_mapping,
)
from metrale_model_arch.families.qwen3_next.decoder_layer import SharedExpertMoeBlock
from metrale_model_arch.families.qwen3_next.mtp import Qwen3NextMtpBlock, Qwen3NextMtpLayer
from metrale_model_arch.kv_cache import allocate_layer_cache, allocate_state_slots
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory import mtp_cache_spec, mtp_kv_bytes_per_token
from metrale_model_arch.memory.weights import MTP, weight_bytes, weight_owner
from metrale_model_arch.owners import DRAFT_KV_POOL
from metrale_model_arch.registry import cache_specs, family_for

transformers = pytest.importorskip("transformers")

PROMPT_LENS = (1, 7, 13, 70)
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.25,
    "rope_theta": 500.0,
    "attention_bias": True,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 12,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "norm_topk_prob": False,
    "mlp_only_layers": [2],
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


# The stack layer whose shapes the MTP layer takes: full attention, sparse (as MTP layer 0 is).
MTP_SOURCE_LAYER = 1
BLOCK_SIZE = 4
PROMPT_LEN = 13
# The MTP layer's output and logits against the formula's (float32; measured at most 8.1e-6 and
# 1.8e-5 of logits up to 6.3, most of it carried from the target's hidden states, ours within
# 1.2e-5 of transformers').
MTP_ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> FamilyCheckpoint:
    path = tmp_path_factory.mktemp("tiny-qwen3_next")
    hf_model = save_tiny_qwen3_next(path, **TINY)
    add_qwen3_next_mtp(path, torch.Generator().manual_seed(1), source_layer=MTP_SOURCE_LAYER)
    return FamilyCheckpoint.saved("tiny", path, hf_model, PROMPT_LENS)


@pytest.fixture(scope="module")
def mtp_tensors(checkpoint: FamilyCheckpoint) -> dict[str, torch.Tensor]:
    saved = load_file(checkpoint.path / "model.safetensors")
    return {name: tensor for name, tensor in saved.items() if name.startswith("mtp.")}


class TestParity(Bfloat16ParityChecks):
    family = Qwen3NextForCausalLM
    num_greedy_tokens = 24
    # Gated DeltaNet's chunked form sums over other chunk boundaries: measured 9.7e-5 and 1.3e-4
    # (the last bit of a gate moving the second) on logits of this random model.
    chunked_atol = 2e-4

    def bfloat16_prompts(self, checkpoint: FamilyCheckpoint) -> list[list[int]]:
        # The longest prompt (70 tokens) outgrows the check's 16 blocks of 4 (on it: 0.142
        # ours, 0.157 theirs); eight shorter ones average over router flips either way.
        # Measured: 0.092 ours, 0.102 theirs.
        return list(random_prompts(checkpoint.config.vocab_size, [48] * 8, seed=5).values())


def test_config_and_cache_specs(checkpoint: FamilyCheckpoint) -> None:
    config = checkpoint.config
    assert family_for(config) is Qwen3NextForCausalLM
    assert config.partial_rotary_factor == 0.25
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("sparse", "sparse", "dense", "sparse")
    # No MTP count in config.json (none in Qwen3-Next's own): one MTP layer, as vLLM reads it.
    assert config.mtp == MtpConfig(
        num_layers=1, layer_types=(FULL_ATTENTION,), mlp_layer_types=("sparse",)
    )
    linear = LinearAttentionSpec(
        num_heads=4, head_dim=12, conv_kernel_dim=3, num_key_heads=2, value_head_dim=8
    )
    full = FullAttentionSpec(num_kv_heads=2, head_dim=16)
    assert cache_specs(config, indexer_paged=True) == (linear, full, linear, full)
    # (value heads, key dim, value dim) float32, and q | k | v channels of the last 2 inputs.
    recurrent, conv = linear.state(256)
    assert recurrent.shape == (4, 12, 8)
    assert conv.shape == (2 * 2 * 12 + 4 * 8, 2)


def test_parameter_counts_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    """Without its MTP layers (transformers holds none): the stack as transformers builds it,
    the checkpoint's ``mtp.*`` skipped."""
    stack_only = attrs.evolve(checkpoint, config=mtp_free_config(checkpoint.config))
    counts = qwen3_next_param_counts(stack_only.config)
    assert counts.mtp == 0
    assert_counts_equal_transformers(stack_only, counts, Qwen3NextForCausalLM)
    assert load_checkpoint(stack_only, Qwen3NextForCausalLM).num_mtp_layers == 0


def test_the_mtp_layer_is_loaded_counted_and_owned(
    checkpoint: FamilyCheckpoint, mtp_tensors: dict[str, torch.Tensor]
) -> None:
    config = checkpoint.config
    counts = qwen3_next_param_counts(config)
    assert counts.mtp == sum(t.numel() for t in mtp_tensors.values())
    model = load_checkpoint(checkpoint, Qwen3NextForCausalLM, torch.bfloat16)
    assert model.num_mtp_layers == 1
    (layer,) = model.model.mtp_layers
    assert isinstance(layer, Qwen3NextMtpLayer)
    assert isinstance(layer.mlp, SharedExpertMoeBlock)
    assert layer.linear_attn is None
    saved = {name: t.bfloat16() for name, t in mtp_tensors.items()}
    for name in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert torch.equal(layer.get_parameter(f"{name}.weight"), saved[f"mtp.{name}.weight"])
    block = "mtp.layers.0."
    qkv = torch.cat([saved[f"{block}self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(layer.self_attn.qkv_proj.weight, qkv)
    expert_3 = [saved[f"{block}mlp.experts.3.{p}_proj.weight"] for p in ("gate", "up")]
    assert torch.equal(layer.mlp.experts.gate_up_proj[3], torch.cat(expert_3))
    shared_gate = saved[f"{block}mlp.shared_expert_gate.weight"]
    assert torch.equal(layer.mlp.shared_expert_gate.weight, shared_gate)
    owned = [(n, p) for n, p in model.named_parameters() if weight_owner(n) == MTP]
    assert {n for n, _ in owned} == {
        n for n, _ in model.named_parameters() if n.startswith("model.mtp_layers.0.")
    }
    owned_bytes = sum(p.numel() * p.element_size() for _, p in owned)
    assert owned_bytes == 2 * counts.mtp == weight_bytes(config, 2).by_owner()[MTP]
    # Its draft cache: a full-attention layer's K and V, 2 heads of 16 values a token.
    assert mtp_cache_spec(config) == FullAttentionSpec(num_kv_heads=2, head_dim=16)
    assert mtp_kv_bytes_per_token(config, 2) == 2 * 2 * 16 * 2
    # Without MTP speculation the config drops it: not planned, not loaded (skipped).
    stack_only = mtp_free_config(config)
    assert MTP not in weight_bytes(stack_only, 2).by_owner()


def test_the_mapping_places_the_mtp_weights(checkpoint: FamilyCheckpoint) -> None:
    config = checkpoint.config
    target = qwen3_next_checkpoint_mapping(config)
    assert target("mtp.fc.weight", (64, 128)) == TensorTarget("model.mtp_layers.0.fc.weight")
    assert target("mtp.norm.weight", (64,)) == TensorTarget("model.mtp_layers.0.norm.weight")
    q = target("mtp.layers.0.self_attn.q_proj.weight", (128, 64))
    assert q == TensorTarget("model.mtp_layers.0.self_attn.qkv_proj.weight", (slice(0, 128),))
    up = target("mtp.layers.0.mlp.experts.5.up_proj.weight", (16, 64))
    assert up == TensorTarget("model.mtp_layers.0.mlp.experts.gate_up_proj", (5, slice(16, None)))
    beyond = target("mtp.layers.1.input_layernorm.weight", (64,))
    assert isinstance(beyond, Skip)
    assert "beyond the config's 1 MTP layer" in beyond.reason
    assert target("mtp.embed_tokens.weight", (256, 64)) is None  # not Qwen3-Next's: refused
    dropped = qwen3_next_checkpoint_mapping(mtp_free_config(config))
    assert isinstance(dropped("mtp.fc.weight", (64, 128)), Skip)
    assert isinstance(dropped("mtp.layers.0.mlp.gate.weight", (8, 64)), Skip)


def test_two_mtp_layers_load_the_second_as_a_block(tmp_path: Path) -> None:
    save_tiny_qwen3_next(tmp_path, **TINY)
    add_qwen3_next_mtp(tmp_path, torch.Generator().manual_seed(2), source_layer=3, num_layers=2)
    config = model_config_from_hf_file(tmp_path)
    assert config.mtp is not None
    assert config.mtp.num_layers == 2
    # vLLM's rule at the MTP layer's own index: layer 1 is not in mlp_only_layers ([2]).
    assert config.mtp.mlp_layer_types == ("sparse", "sparse")
    model = load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))
    assert isinstance(model, Qwen3NextForCausalLM)
    first, second = model.model.mtp_layers
    assert isinstance(first, Qwen3NextMtpLayer)
    assert type(second) is Qwen3NextMtpBlock
    saved = load_file(tmp_path / "model.safetensors")
    owned = sum(p.numel() for n, p in model.named_parameters() if weight_owner(n) == MTP)
    mtp_saved = sum(t.numel() for n, t in saved.items() if n.startswith("mtp."))
    assert owned == mtp_saved == qwen3_next_param_counts(config).mtp


def test_a_checkpoint_without_mtp_weights_is_refused_when_they_are_asked(tmp_path: Path) -> None:
    """A transformers save drops ``mtp.*``: with the MTP layer kept (speculation asked) the
    load names what is missing; without it the stack loads."""
    save_tiny_qwen3_next(tmp_path, **TINY)
    config = model_config_from_hf_file(tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.mtp_layers\.0\.fc\.weight.*set num_nextn"):
        load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))
    stack = load_safetensors_model(tmp_path, mtp_free_config(config), LoadOptions(device="cpu"))
    assert isinstance(stack, Qwen3NextForCausalLM)
    assert stack.num_mtp_layers == 0


def test_the_mtp_count_fields() -> None:
    """vLLM's ``num_nextn_predict_layers``, else Qwen's ``mtp_num_hidden_layers``; 0 keeps none."""
    for field in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        data = {**TINY, "model_type": "qwen3_next", field: 0}
        assert model_config_from_hf_dict(data, source="config.json").mtp is None
    data = {**TINY, "model_type": "qwen3_next", "mtp_num_hidden_layers": 2}
    mtp = model_config_from_hf_dict(data, source="config.json").mtp
    assert mtp is not None
    assert mtp.num_layers == 2
    data = {**data, "num_nextn_predict_layers": 1}
    mtp = model_config_from_hf_dict(data, source="config.json").mtp
    assert mtp is not None
    assert mtp.num_layers == 1
    with pytest.raises(ConfigError, match="'num_nextn_predict_layers' must not be negative"):
        model_config_from_hf_dict({**data, "num_nextn_predict_layers": -1}, source="config.json")


def test_mtp_layers_need_a_full_attention_layer_in_the_stack(checkpoint: FamilyCheckpoint) -> None:
    """The draft pool pages the MTP layer's K/V as a stack full-attention layer's."""
    linear_only = attrs.evolve(checkpoint.config, layer_types=(LINEAR_ATTENTION,) * 4)
    with pytest.raises(ValueError, match="MTP layers with no full-attention layer"):
        Qwen3NextForCausalLM(linear_only)
    Qwen3NextForCausalLM(mtp_free_config(linear_only))


def centred_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3-Next's zero-centred RMSNorm: ``(1 + w)`` times the normed row."""
    return (1.0 + weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def hf_block(hf_model: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """transformers' decoder layer (full attention, sparse MoE: stack layer
    ``MTP_SOURCE_LAYER``'s kind) holding the MTP block's weights (experts stacked)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    config = hf_model.config
    prefix = "mtp.layers.0."
    own = {n[len(prefix) :]: t for n, t in tensors.items() if n.startswith(prefix)}
    experts = range(config.num_experts)
    state = {name: t for name, t in own.items() if not re.match(r"mlp\.experts\.\d+\.", name)}
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat([own[f"mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up")])
            for e in experts
        ]
    )
    state["mlp.experts.down_proj"] = torch.stack(
        [own[f"mlp.experts.{e}.down_proj.weight"] for e in experts]
    )
    block = Qwen3NextDecoderLayer(config, MTP_SOURCE_LAYER).eval()
    block.load_state_dict(state, strict=True)
    return block


def reference_mtp(
    hf_model: Any, tensors: dict[str, torch.Tensor], ids: list[int], previous: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h', logits)`` of the MTP layer over ``ids`` after ``previous`` from position 0:
    h' = norm(Block(fc([pre_fc_norm_embedding(embed(t_{i+1})); pre_fc_norm_hidden(h_i)]))),
    logits = lm_head(h'); the embedding and the head are the target's."""
    eps = hf_model.config.rms_norm_eps
    embeds = hf_model.model.embed_tokens.weight[ids]
    joined = torch.cat(
        [
            centred_rms(embeds, tensors["mtp.pre_fc_norm_embedding.weight"], eps),
            centred_rms(previous, tensors["mtp.pre_fc_norm_hidden.weight"], eps),
        ],
        dim=-1,
    )
    x = (joined @ tensors["mtp.fc.weight"].T)[None]
    n = len(ids)
    positions = torch.arange(n)[None]
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    out = hf_block(hf_model, tensors)(
        x,
        position_embeddings=hf_model.model.rotary_emb(x, positions),
        attention_mask=causal,
        position_ids=positions,
    )
    hidden = centred_rms(
        (out[0] if isinstance(out, tuple) else out)[0], tensors["mtp.norm.weight"], eps
    )
    return hidden, hidden @ hf_model.lm_head.weight.T


def metadata(table: list[int], seq_len: int, query_len: int, slot: int | None = None) -> Any:
    return build_attention_metadata(
        block_tables=[table],
        seq_lens=[seq_len],
        query_lens=[query_len],
        block_size=BLOCK_SIZE,
        state_slots=None if slot is None else [slot],
    )


@torch.inference_mode()
def test_mtp_forward_matches_the_formula(
    checkpoint: FamilyCheckpoint, mtp_tensors: dict[str, torch.Tensor]
) -> None:
    """The MTP layer against the formula over the saved tensors (``h_i``: transformers' final
    hidden states, which ours equal), through two chunks and one draft step on its own paged
    cache in scattered blocks."""
    hf_model = checkpoint.hf_model
    model = load_checkpoint(checkpoint, Qwen3NextForCausalLM)
    config = model.config
    prompt = torch.randint(256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    target = hf_model.model(prompt[None]).last_hidden_state[0]
    kv = allocate_kv_cache(
        config, num_blocks=8, block_size=BLOCK_SIZE, dtype=torch.float32, device="cpu"
    )
    states = allocate_state_slots(
        config, num_slots=1, max_seq_len=64, dtype=torch.float32, device="cpu"
    )
    positions = torch.arange(PROMPT_LEN)
    hidden = model(
        prompt, positions, kv, metadata([0, 1, 2, 3], PROMPT_LEN, PROMPT_LEN, slot=0), states
    )
    torch.testing.assert_close(hidden, target, atol=1e-4, rtol=0)
    cache = allocate_layer_cache(
        mtp_cache_spec(config),
        num_blocks=8,
        block_size=BLOCK_SIZE,
        dtype=torch.float32,
        device="cpu",
        owner=DRAFT_KV_POOL,
    )
    assert cache.num_bytes == 8 * BLOCK_SIZE * mtp_kv_bytes_per_token(config, 4)
    table, split = [6, 1, 7, 3], 5
    first = model.forward_mtp(
        prompt[1 : split + 1], hidden[:split], positions[:split], cache[0], metadata(table, 5, 5)
    )
    rest = model.forward_mtp(
        prompt[split + 1 :],
        hidden[split:-1],
        positions[split:-1],
        cache[0],
        metadata(table, PROMPT_LEN - 1, PROMPT_LEN - 1 - split),
    )
    ours = torch.cat([first, rest])
    ids = prompt[1:].tolist()
    expected, expected_logits = reference_mtp(hf_model, mtp_tensors, ids, target[:-1])
    torch.testing.assert_close(ours, expected, atol=MTP_ATOL, rtol=0)
    logits = model.compute_mtp_logits(ours)
    torch.testing.assert_close(logits, expected_logits, atol=MTP_ATOL, rtol=0)
    # A draft: the layer again, one position on, over its own (normed) output and its argmax.
    draft = int(logits[-1].argmax())
    again = model.forward_mtp(
        torch.tensor([draft]), ours[-1:], positions[-1:], cache[0], metadata(table, PROMPT_LEN, 1)
    )
    chained, chained_logits = reference_mtp(
        hf_model, mtp_tensors, [*ids, draft], torch.cat([target[:-1], expected[-1:]])
    )
    torch.testing.assert_close(again[0], chained[-1], atol=MTP_ATOL, rtol=0)
    torch.testing.assert_close(
        model.compute_mtp_logits(again)[0], chained_logits[-1], atol=MTP_ATOL, rtol=0
    )
