"""Parity of ``glm4_moe`` (GLM-4.5 / 4.6) with transformers on tiny random checkpoints (every
parameter and the routing correction bias randomized, float32), its MTP layers loaded, and the
first run as its formula says."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing import save_tiny_glm4_moe
from metrale_testing.family_parity import FamilyCheckpoint, FamilyParityChecks, load_checkpoint
from safetensors.torch import load_file

from metrale_config import RopeScaling, model_config_from_hf_file
from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadOptions, allocate_kv_cache
from metrale_model_arch.build import CheckpointError
from metrale_model_arch.counts.glm4_moe import glm4_moe_param_counts
from metrale_model_arch.families.glm4_moe import Glm4MoeForCausalLM, Glm4MoeMtpLayer
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.kv_cache import allocate_layer_cache
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory import mtp_cache_spec, mtp_kv_bytes_per_token
from metrale_model_arch.memory.weights import MTP, weight_bytes, weight_owner
from metrale_model_arch.owners import DRAFT_KV_POOL
from metrale_model_arch.registry import family_for

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
BLOCK_SIZE = 4
PROMPT_LEN = 13
PROMPT_LENS = (1, 7, 13, 26)
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "moe_intermediate_size": 24,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
CASES: dict[str, dict[str, Any]] = {
    # Grouped top-k (4 groups, 2 kept), two shared experts, scaled and renormalized weights,
    # q/k norms, q/k/v biases, half the head rotated; one MTP layer with copies of the
    # embedding and head (skipped).
    "grouped-qk-norm-bias": {
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "use_qk_norm": True,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
        "num_nextn_predict_layers": 1,
    },
    # Every layer sparse, ungrouped, unnormalized, a quarter of the head rotated, tied head,
    # two MTP layers.
    "sparse-ungrouped-tied": {
        "num_hidden_layers": 2,
        "first_k_dense_replace": 0,
        "n_routed_experts": 6,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.5,
        "partial_rotary_factor": 0.25,
        "rope_theta": 500.0,
        "tie_word_embeddings": True,
        "num_nextn_predict_layers": 2,
    },
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> FamilyCheckpoint:
    path = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_glm4_moe(path, **SMALL, **CASES[request.param])
    return FamilyCheckpoint.saved(request.param, path, hf_model, PROMPT_LENS)


@pytest.fixture(scope="module")
def mtp_tensors(checkpoint: FamilyCheckpoint) -> dict[str, torch.Tensor]:
    """The saved MTP layers' tensors (``model.layers.{num_hidden_layers + k}.*``)."""
    num_layers = checkpoint.hf_model.config.num_hidden_layers
    saved = load_file(checkpoint.path / "model.safetensors")
    return {
        name: tensor
        for name, tensor in saved.items()
        if name.startswith("model.layers.") and int(name.split(".")[2]) >= num_layers
    }


class TestParity(FamilyParityChecks):
    family = Glm4MoeForCausalLM


def load(checkpoint: FamilyCheckpoint, dtype: torch.dtype = torch.float32) -> Glm4MoeForCausalLM:
    return load_checkpoint(checkpoint, Glm4MoeForCausalLM, dtype)


def test_config_exercises_the_case(checkpoint: FamilyCheckpoint) -> None:
    config, kwargs = checkpoint.config, CASES[checkpoint.name]
    assert family_for(config) is Glm4MoeForCausalLM
    assert config.moe is not None
    assert config.mtp is not None
    first_dense = kwargs["first_k_dense_replace"]
    num_layers = kwargs["num_hidden_layers"]
    assert config.moe.mlp_layer_types == tuple(
        "sparse" if i >= first_dense else "dense" for i in range(num_layers)
    )
    assert config.mtp.num_layers == kwargs["num_nextn_predict_layers"]
    assert config.mtp.mlp_layer_types == ("sparse",) * config.mtp.num_layers
    assert config.partial_rotary_factor == kwargs["partial_rotary_factor"]
    assert config.moe.n_group == kwargs.get("n_group", 1)
    assert config.moe.topk_group == kwargs.get("topk_group", 1)
    assert config.moe.routed_scaling_factor == kwargs["routed_scaling_factor"]
    assert config.moe.norm_topk_prob == kwargs["norm_topk_prob"]
    assert config.moe.num_shared_experts == kwargs["n_shared_experts"]
    assert config.qk_norm == kwargs.get("use_qk_norm", False)
    assert config.qkv_bias == kwargs.get("attention_bias", False)
    assert not config.o_proj_bias
    assert config.tie_word_embeddings == kwargs.get("tie_word_embeddings", False)


def test_parameter_counts_equal_transformers_plus_the_mtp_layers(
    checkpoint: FamilyCheckpoint, mtp_tensors: dict[str, torch.Tensor]
) -> None:
    counts = glm4_moe_param_counts(checkpoint.config)
    hf_params = sum(p.numel() for p in checkpoint.hf_model.parameters())
    hf_buffers = sum(b.numel() for n, b in checkpoint.hf_model.named_buffers() if "rotary" not in n)
    ours = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert ours + counts.layers_fp32 == hf_params + hf_buffers
    copies = ("embed_tokens.weight", "shared_head.head.weight")
    mtp_numel = sum(t.numel() for n, t in mtp_tensors.items() if not n.endswith(copies))
    assert counts.mtp + counts.mtp_fp32 == mtp_numel
    model = load(checkpoint)
    assert sum(p.numel() for p in model.parameters()) == ours + counts.layers_fp32 + mtp_numel
    mtp_bytes = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if weight_owner(n) == MTP
    )
    assert weight_bytes(checkpoint.config, 4).by_owner()[MTP] == mtp_bytes
    bf16 = weight_bytes(checkpoint.config, 2)
    assert bf16.mtp == 2 * counts.mtp + 4 * counts.mtp_fp32


def test_mtp_layers_are_loaded_and_owned(
    checkpoint: FamilyCheckpoint,
    mtp_tensors: dict[str, torch.Tensor],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="metrale.load"):
        model = load(checkpoint, torch.bfloat16)
    assert "MTP layer(s) loaded (weights.mtp) for MTP speculation" in caplog.text
    config = checkpoint.config
    assert config.mtp is not None
    assert len(model.model.mtp_layers) == config.mtp.num_layers
    for k, layer in enumerate(model.model.mtp_layers):
        assert isinstance(layer, Glm4MoeMtpLayer)
        assert isinstance(layer.mlp, GlmMoeBlock)
        prefix = f"model.layers.{config.num_hidden_layers + k}."
        saved = mtp_tensors
        torch.testing.assert_close(
            layer.eh_proj.weight, saved[prefix + "eh_proj.weight"].bfloat16(), atol=0, rtol=0
        )
        torch.testing.assert_close(
            layer.shared_head.norm.weight,
            saved[prefix + "shared_head.norm.weight"].bfloat16(),
            atol=0,
            rtol=0,
        )
        down_3 = saved[prefix + "mlp.experts.3.down_proj.weight"].bfloat16()
        torch.testing.assert_close(layer.mlp.experts.down_proj[3], down_3, atol=0, rtol=0)
        # The router and its correction bias stay float32, exactly as saved.
        assert layer.mlp.gate.weight.dtype == torch.float32
        assert torch.equal(layer.mlp.gate.weight, saved[prefix + "mlp.gate.weight"])
        bias = saved[prefix + "mlp.gate.e_score_correction_bias"]
        assert torch.equal(layer.mlp.gate.e_score_correction_bias, bias)
    names = [n for n, _ in model.named_parameters() if n.startswith("model.mtp_layers.")]
    assert names
    assert all(weight_owner(n) == MTP for n in names)


def test_a_checkpoint_without_its_declared_mtp_layer_is_refused(tmp_path: Path) -> None:
    kwargs = {**SMALL, **CASES["grouped-qk-norm-bias"]}
    transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**kwargs)).save_pretrained(tmp_path)
    config = model_config_from_hf_file(tmp_path)
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers"):
        load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))


def test_num_nextn_predict_layers_0_serves_without_the_mtp_layers(
    checkpoint: FamilyCheckpoint,
) -> None:
    config = attrs.evolve(checkpoint.config, mtp=None)
    model = load_safetensors_model(checkpoint.path, config, LoadOptions(device="cpu"))
    assert isinstance(model, Glm4MoeForCausalLM)
    assert len(model.model.mtp_layers) == 0
    assert MTP not in weight_bytes(config, 4).by_owner()


def test_scaled_rope_is_refused(checkpoint: FamilyCheckpoint) -> None:
    scaling = RopeScaling(rope_type="linear", factor=2.0)
    with pytest.raises(ValueError, match="plain RoPE only"):
        Glm4MoeForCausalLM(attrs.evolve(checkpoint.config, rope_scaling=scaling))


GLM_4_5_DIR = Path(__file__).parent / "data" / "glm-4.5"
# GLM-4.5's model card: 355B total parameters; its bfloat16 checkpoint holds ~716 GB (the
# stack, the MTP layer and, inside it, copies of the embedding and head, which MTP here shares).
GLM_4_5_PARAMS = 355e9
GLM_4_5_CHECKPOINT_BYTES = 716e9


def test_the_published_glm_4_5_plan_is_within_one_percent_of_its_size() -> None:
    config = model_config_from_hf_file(GLM_4_5_DIR)
    counts = glm4_moe_param_counts(config)
    stack = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    # transformers' Glm4MoeForCausalLM on this config (meta device): 352,797,814,784
    # parameters and 14,240 correction-bias entries.
    assert stack + counts.layers_fp32 == 352_797_829_024
    total = stack + counts.layers_fp32 + counts.mtp + counts.mtp_fp32
    assert abs(total / GLM_4_5_PARAMS - 1) < 0.01
    weights = weight_bytes(config, 2)
    assert abs(weights.total() / GLM_4_5_CHECKPOINT_BYTES - 1) < 0.01
    assert weights.by_owner()[MTP] == 2 * counts.mtp + 4 * counts.mtp_fp32


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def hf_block(hf_model: Any, tensors: dict[str, torch.Tensor], prefix: str) -> Any:
    """transformers' sparse decoder layer holding the MTP block's weights (experts fused)."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer

    config = hf_model.config
    own = {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
    experts = range(config.n_routed_experts)
    state = {name: t for name, t in own.items() if not name.startswith("mlp.experts.")}
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat([own[f"mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up")])
            for e in experts
        ]
    )
    state["mlp.experts.down_proj"] = torch.stack(
        [own[f"mlp.experts.{e}.down_proj.weight"] for e in experts]
    )
    block = Glm4MoeDecoderLayer(config, config.num_hidden_layers - 1).eval()
    missing, _ = block.load_state_dict(state, strict=False)
    assert not missing
    return block


def reference_mtp(
    hf_model: Any, path: Path, ids: list[int], previous: torch.Tensor, first_position: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h', logits)`` of MTP layer 0 over ``ids`` after ``previous``, from position
    ``first_position``, attending causally over these rows only."""
    config = hf_model.config
    prefix = f"model.layers.{config.num_hidden_layers}."
    tensors = load_file(path / "model.safetensors")
    eps = config.rms_norm_eps
    embeds = tensors["model.embed_tokens.weight"][ids]
    joined = torch.cat(
        [
            rms(embeds, tensors[prefix + "enorm.weight"], eps),
            rms(previous, tensors[prefix + "hnorm.weight"], eps),
        ],
        dim=-1,
    )
    x = (joined @ tensors[prefix + "eh_proj.weight"].T)[None]
    positions = torch.arange(first_position, first_position + len(ids))[None]
    n = len(ids)
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    out = hf_block(hf_model, tensors, prefix)(
        x,
        attention_mask=causal,
        position_ids=positions,
        position_embeddings=hf_model.model.rotary_emb(x, positions),
    )
    hidden = (out[0] if isinstance(out, tuple) else out)[0]
    head = hf_model.lm_head.weight
    return hidden, rms(hidden, tensors[prefix + "shared_head.norm.weight"], eps) @ head.T


@torch.inference_mode()
def test_mtp_forward_matches_the_formula(checkpoint: FamilyCheckpoint) -> None:
    """MTP layer 0 against h' = Block(eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])) and
    logits = lm_head(shared_head.norm(h')) written in plain torch over the saved tensors (the
    block: transformers' decoder layer holding the MTP block's weights; ``h_i``: transformers'
    final hidden states), through two chunks and one draft step on its own paged cache in
    scattered blocks."""
    path, hf_model, config = checkpoint.path, checkpoint.hf_model, checkpoint.config
    model = load(checkpoint)
    prompt = torch.randint(VOCAB_SIZE, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    target = hf_model.model(prompt[None]).last_hidden_state[0]
    # Ours: the target's own forward gives h_i; the layer runs in two chunks, then a draft.
    kv = allocate_kv_cache(
        config, num_blocks=8, block_size=BLOCK_SIZE, dtype=torch.float32, device="cpu"
    )
    positions = torch.arange(PROMPT_LEN)
    hidden = model(prompt, positions, kv, metadata([0, 1, 2, 3], PROMPT_LEN, PROMPT_LEN))
    torch.testing.assert_close(hidden, target, atol=1e-4, rtol=0)
    cache = allocate_layer_cache(
        mtp_cache_spec(config),
        num_blocks=8,
        block_size=BLOCK_SIZE,
        dtype=torch.float32,
        device="cpu",
        owner=DRAFT_KV_POOL,
    )
    assert (
        cache.num_bytes
        == 8 * BLOCK_SIZE * mtp_kv_bytes_per_token(config, 4)
        == 8 * BLOCK_SIZE * 256
    )
    table = [6, 1, 7, 3]  # scattered blocks
    split = 5
    first = model.forward_mtp(
        prompt[1 : split + 1],
        hidden[:split],
        positions[:split],
        cache[0],
        metadata(table, split, split),
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
    expected, expected_logits = reference_mtp(hf_model, path, ids, target[:-1], 0)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    logits = model.compute_mtp_logits(ours)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=0)
    # A draft: the layer again, one position on, over its own output and its argmax.
    draft = int(logits[-1].argmax())
    again = model.forward_mtp(
        torch.tensor([draft]), ours[-1:], positions[-1:], cache[0], metadata(table, PROMPT_LEN, 1)
    )
    chained, chained_logits = reference_mtp(
        hf_model, path, [*ids, draft], torch.cat([target[:-1], expected[-1:]]), 0
    )
    torch.testing.assert_close(again[0], chained[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        model.compute_mtp_logits(again)[0], chained_logits[-1], atol=1e-4, rtol=0
    )


def metadata(table: list[int], seq_len: int, query_len: int) -> Any:
    return build_attention_metadata(
        block_tables=[table], seq_lens=[seq_len], query_lens=[query_len], block_size=BLOCK_SIZE
    )
