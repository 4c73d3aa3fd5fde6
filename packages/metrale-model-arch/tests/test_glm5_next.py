"""GLM-5.3 (glm5_next) against transformers' Glm5NextForConditionalGeneration, same weights.

A tiny random config exercises every part: KDA and DSA layers (one of them a shared-indexer
layer), dense and MoE FFNs, four hyper-connection streams, pools of 4 tokens with a top-k of 8
tokens, so prompts longer than 11 tokens attend sparsely. Every parameter and buffer is random:
transformers' init leaves gates at 1, biases at 0 and norms at 1, which would hide layout bugs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing.device_scan import assert_tensors_made_on_the_models_device
from metrale_testing.padded_step import assert_padding_rows_change_nothing
from safetensors.torch import load_file, save_file

from metrale_config import ModelConfig, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.glm5_next import Glm5NextForCausalLM
from metrale_model_arch.families.glm5_next.dsa_attention import DsaAttention
from metrale_model_arch.families.glm5_next.kda_attention import KdaAttention
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.registry import family_for

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
BLOCK_SIZE = 8
NUM_GREEDY_TOKENS = 32
PROMPT_LENS = (1, 5, 12, 29, 41, 70)
LINEAR, INDEXED = "linear_attention", "indexed_attention"
TINY: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 0,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "index_n_heads": 16,
    "index_head_dim": 16,
    "index_topk": 8,
    "index_kpool": 4,
    "index_kpool_always_select_tail": True,
    "linear_num_heads": 2,
    "linear_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "swiglu_limit": 3.0,
    "rms_norm_eps": 1e-5,
    "layer_types": [LINEAR, INDEXED, INDEXED, LINEAR, LINEAR, INDEXED],
    "mlp_layer_types": ["dense", "sparse", "dense", "sparse", "sparse", "sparse"],
    "indexer_types": ["full", "full", "shared", "full", "full", "full"],
    "pad_token_id": 0,
    "max_position_embeddings": 4096,
}
VISION = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "out_hidden_size": 64,
    "projection_intermediate_size": 64,
}


@attrs.frozen(kw_only=True)
class Checkpoint:
    path: Path
    config: ModelConfig
    hf_model: Any
    prompts: dict[int, list[int]]


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter and buffer random: norms and the hyper-connections' scales around one,
    the rest small enough that activations stay moderate."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    with torch.no_grad():
        for name, tensor in tensors:
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            if "norm" in name or name.endswith("_hc.scale"):
                tensor.copy_(1.0 + 0.2 * noise)
            elif name.endswith("dt_bias"):
                # Decays of a trained model: a forget gate well inside (lower_bound, 0).
                tensor.copy_(-3.0 + 0.5 * noise)
            elif name.endswith(("A_log", "_hc.base", "e_score_correction_bias")):
                tensor.copy_(0.5 * noise)
            else:
                tensor.copy_(0.2 * noise)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    path = tmp_path_factory.mktemp("glm5_next")
    hf_config = transformers.Glm5NextConfig(text_config=TINY, vision_config=VISION)
    hf_model = transformers.Glm5NextForConditionalGeneration(hf_config).eval()
    randomize(hf_model, seed=0)
    hf_model.save_pretrained(path)
    generator = torch.Generator().manual_seed(1)
    prompts = {
        seq_id: torch.randint(1, VOCAB_SIZE, (length,), generator=generator).tolist()
        for seq_id, length in enumerate(PROMPT_LENS)
    }
    return Checkpoint(
        path=path, config=model_config_from_hf_file(path), hf_model=hf_model, prompts=prompts
    )


def load(
    checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, kernel_backend: str = "auto"
) -> Glm5NextForCausalLM:
    options = LoadOptions(dtype=dtype, device="cpu", kernel_backend=kernel_backend)
    model = load_safetensors_model(checkpoint.path, checkpoint.config, options)
    assert isinstance(model, Glm5NextForCausalLM)
    return model


def hf_logits(checkpoint: Checkpoint, prompt: Sequence[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = checkpoint.hf_model(input_ids=torch.tensor([list(prompt)])).logits
    return logits[0]


def runner(
    model: Glm5NextForCausalLM, paged_runner: Callable[..., Any], *, paged: bool = True
) -> Any:
    return paged_runner(model, num_blocks=128, block_size=BLOCK_SIZE, indexer_paged=paged)


def test_the_config_runs_every_kind_of_layer(checkpoint: Checkpoint) -> None:
    config = checkpoint.config
    assert family_for(config) is Glm5NextForCausalLM
    model = load(checkpoint)
    mixers = [type(layer.self_attn) for layer in model.model.layers]
    assert mixers.count(KdaAttention) == 3
    assert mixers.count(DsaAttention) == 3
    indexers = [
        layer.self_attn.indexer is not None
        for layer in model.model.layers
        if isinstance(layer.self_attn, DsaAttention)
    ]
    assert indexers == [True, False, True]
    # The float32-kept parameters are float32 in a bfloat16 model; the rest are bfloat16.
    bf16 = load(checkpoint, torch.bfloat16)
    layers = bf16.model.layers
    assert layers[1].mlp.gate.weight.dtype == torch.float32
    assert layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert layers[0].self_attn.conv1d.dtype == torch.float32
    assert layers[0].attn_hc.base.dtype == torch.float32
    assert layers[0].attn_hc.fn.dtype == torch.bfloat16
    assert layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("paged", [True, False], ids=["paged-indexer", "flat-indexer"])
def test_every_tensor_is_made_on_the_models_device(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any], paged: bool
) -> None:
    """With the reference ops a GPU's torch backend runs (the paged indexer once built its row
    offsets on the CPU beside a CUDA block table)."""
    model = load(checkpoint, kernel_backend="torch")
    assert_tensors_made_on_the_models_device(
        model,
        paged_runner,
        checkpoint.prompts,
        num_blocks=128,
        block_size=BLOCK_SIZE,
        indexer_paged=paged,
    )


@pytest.mark.parametrize("paged", [True, False], ids=["paged-indexer", "flat-indexer"])
def test_a_step_padded_to_a_bucket_gives_the_same_logits(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any], paged: bool
) -> None:
    """The property CUDA graphs' padded batches rely on (``metrale_testing.padded_step``)."""
    assert_padding_rows_change_nothing(
        load(checkpoint),
        paged_runner,
        checkpoint.prompts,
        bucket=8,
        num_blocks=128,
        block_size=BLOCK_SIZE,
        indexer_paged=paged,
    )


def test_ragged_prefill_matches_transformers(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    run = runner(load(checkpoint), paged_runner)
    ours = run.step(checkpoint.prompts)
    for seq_id, prompt in checkpoint.prompts.items():
        torch.testing.assert_close(ours[seq_id], hf_logits(checkpoint, prompt), rtol=0, atol=1e-4)


def greedy(run: Any, prompts: dict[int, list[int]], num_tokens: int) -> dict[int, list[int]]:
    logits = run.step(prompts)
    tokens = {seq_id: [int(logits[seq_id][-1].argmax())] for seq_id in prompts}
    for _ in range(num_tokens - 1):
        logits = run.step({seq_id: out[-1:] for seq_id, out in tokens.items()})
        for seq_id, out in tokens.items():
            out.append(int(logits[seq_id][-1].argmax()))
    return tokens


def test_greedy_tokens_match_transformers_generate(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    ours = greedy(runner(load(checkpoint), paged_runner), checkpoint.prompts, NUM_GREEDY_TOKENS)
    for seq_id, prompt in checkpoint.prompts.items():
        with torch.inference_mode():
            generated = checkpoint.hf_model.generate(
                torch.tensor([prompt]),
                max_new_tokens=NUM_GREEDY_TOKENS,
                min_new_tokens=NUM_GREEDY_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        assert ours[seq_id] == generated[0, len(prompt) :].tolist(), f"prompt {seq_id}"


def test_the_flat_indexer_gives_the_paged_indexers_logits(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    model = load(checkpoint)
    paged = greedy(runner(model, paged_runner), checkpoint.prompts, 12)
    flat_run = runner(model, paged_runner, paged=False)
    assert flat_run.states.allocations, "the flat layout keeps its indexer keys per sequence"
    assert greedy(flat_run, checkpoint.prompts, 12) == paged
    paged_logits = runner(model, paged_runner).step(checkpoint.prompts)
    flat_logits = runner(model, paged_runner, paged=False).step(checkpoint.prompts)
    for seq_id in checkpoint.prompts:
        torch.testing.assert_close(flat_logits[seq_id], paged_logits[seq_id], rtol=0, atol=1e-5)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "flat"])
def test_chunked_prefill_equals_one_prefill(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any], paged: bool
) -> None:
    """A 150-token prompt in chunks that split KDA's 64-token chunks and the indexer's pools,
    next to other sequences, gives the logits of one whole prefill."""
    model = load(checkpoint)
    prompt = torch.randint(1, VOCAB_SIZE, (150,), generator=torch.Generator().manual_seed(7))
    whole = runner(model, paged_runner, paged=paged).step({0: prompt.tolist()})[0]
    run = runner(model, paged_runner, paged=paged)
    pieces, start = [], 0
    for size in (37, 1, 30, 62, 20):
        others = {1: checkpoint.prompts[3]} if start == 0 else {1: [5]}
        pieces.append(run.step({0: prompt[start : start + size].tolist(), **others})[0])
        start += size
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=0, atol=1e-4)
    torch.testing.assert_close(whole, hf_logits(checkpoint, prompt.tolist()), rtol=0, atol=1e-4)


def test_batched_decode_equals_alone_and_survives_recompute(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """Each sequence decoded alone gives the tokens it gets in the batch; a sequence dropped
    midway (preempted) and recomputed from its tokens so far continues identically."""
    model = load(checkpoint)
    prompts = {seq_id: checkpoint.prompts[seq_id] for seq_id in (1, 3, 4)}
    batched = greedy(runner(model, paged_runner), prompts, 16)
    for seq_id, prompt in prompts.items():
        alone = greedy(runner(model, paged_runner), {seq_id: prompt}, 16)
        assert alone[seq_id] == batched[seq_id]
    run = runner(model, paged_runner)
    first = greedy(run, prompts, 6)
    run.free(3)
    # Recompute: prompt plus the tokens so far, in a new slot and new blocks.
    resumed = {3: prompts[3] + first[3]}
    logits = run.step({**resumed, 1: first[1][-1:], 4: first[4][-1:]})
    tokens = {seq_id: [*out, int(logits[seq_id][-1].argmax())] for seq_id, out in first.items()}
    for _ in range(16 - 7):
        logits = run.step({seq_id: out[-1:] for seq_id, out in tokens.items()})
        for seq_id, out in tokens.items():
            out.append(int(logits[seq_id][-1].argmax()))
    assert tokens == batched


def test_the_indexer_selection_matters(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """With a top-k covering every token the layers attend densely: the long prompts' logits
    change, the short ones' (fully selected either way) do not. So the parity above checks the
    selection, not only dense attention."""
    assert checkpoint.config.dsa is not None
    dense_config = attrs.evolve(
        checkpoint.config, dsa=attrs.evolve(checkpoint.config.dsa, index_topk=4096)
    )
    sparse = load(checkpoint)
    dense = Glm5NextForCausalLM(dense_config)
    dense.load_state_dict(sparse.state_dict())
    sparse_logits = runner(sparse, paged_runner).step(checkpoint.prompts)
    dense_logits = runner(dense.eval(), paged_runner).step(checkpoint.prompts)
    for seq_id, prompt in checkpoint.prompts.items():
        gap = float((sparse_logits[seq_id] - dense_logits[seq_id]).abs().max())
        # Dense for queries at positions < topk + kpool - 1 = 11.
        assert (gap > 1e-2) == (len(prompt) > 11), (seq_id, gap)


@pytest.mark.parametrize("prefix", ["model.", ""], ids=["flat-text", "text-model"])
def test_every_checkpoint_prefix_loads_the_same_weights(
    checkpoint: Checkpoint, tmp_path: Path, prefix: str
) -> None:
    """``model.language_model.`` (as saved here), ``model.`` (a text-only release) and no
    prefix (a ``Glm5NextTextModel`` save) load alike, the vision tower beside them; an MTP layer
    (``layers.<L>``) is skipped."""
    tensors = load_file(checkpoint.path / "model.safetensors")
    renamed = {
        name.replace("model.language_model.", prefix, 1): tensor for name, tensor in tensors.items()
    }
    num_layers = checkpoint.config.num_hidden_layers
    renamed[f"{prefix}layers.{num_layers}.eh_proj.weight"] = torch.zeros(4, 8)
    renamed[f"{prefix}layers.{num_layers}.shared_head.norm.weight"] = torch.zeros(4)
    save_file(renamed, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((checkpoint.path / "config.json").read_text())
    reloaded = load_safetensors_model(
        tmp_path, checkpoint.config, LoadOptions(dtype=torch.float32, device="cpu")
    )
    original = load(checkpoint).state_dict()
    assert reloaded.state_dict().keys() == original.keys()
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, original[name], rtol=0, atol=0)
