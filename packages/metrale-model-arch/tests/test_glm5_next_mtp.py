"""GLM-5.3's MTP layer against the formula in plain torch, its block run by transformers:

    h' = Block(eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]))
    logits = lm_head(shared_head.norm(h'))

The block is a one-stream DSA layer with its own indexer; the reference runs it as a one-layer
transformers ``Glm5NextTextModel`` (``hc_mult = 1``) whose final norm is ``shared_head.norm``.
A prompt of 29 tokens attends sparsely (pools of 4, top-k 8 tokens), at once and in two chunks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import add_glm5_mtp_layer
from safetensors.torch import load_file

from metrale_config import model_config_from_hf_file
from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadOptions
from metrale_model_arch.cache_spec import FlatIndexerSpec
from metrale_model_arch.families.glm5_next import Glm5NextForCausalLM
from metrale_model_arch.kv_cache import allocate_layer_cache
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory import MTP, mtp_cache_spec, param_counts
from metrale_model_arch.owners import weight_owner

transformers = pytest.importorskip("transformers")

VOCAB_SIZE, HIDDEN, NUM_TOKENS, BLOCK_SIZE = 256, 64, 29, 8
TEXT: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE, "hidden_size": HIDDEN, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 0,
    "qk_nope_head_dim": 16, "v_head_dim": 16, "index_n_heads": 16, "index_head_dim": 16,
    "index_topk": 8, "index_kpool": 4, "linear_num_heads": 2, "linear_head_dim": 16,
    "hc_mult": 4, "swiglu_limit": 3.0, "layer_types": ["linear_attention", "indexed_attention"],
    "mlp_layer_types": ["dense", "sparse"], "indexer_types": ["full", "full"],
    "max_position_embeddings": 256, "pad_token_id": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("glm5_next_mtp")
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
              "out_hidden_size": HIDDEN, "projection_intermediate_size": 64}  # fmt: skip
    hf_config = transformers.Glm5NextConfig(text_config=TEXT, vision_config=vision)
    hf_model = transformers.Glm5NextForConditionalGeneration(hf_config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in [*hf_model.named_parameters(), *hf_model.named_buffers()]:
            noise = torch.randn(tensor.shape, generator=generator)
            tensor.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
    hf_model.save_pretrained(path)
    add_glm5_mtp_layer(path, generator, source_layer=1)
    return path


def reference_logits(
    path: Path, tokens: torch.Tensor, hidden: torch.Tensor, target: Glm5NextForCausalLM
) -> torch.Tensor:
    """The formula over the checkpoint's tensors, the block a one-stream transformers layer."""
    tensors = load_file(path / "model.safetensors")
    stack = next(n for n in tensors if ".layers.0." in n).split("layers.0.")[0]
    mtp = f"{stack}layers.{TEXT['num_hidden_layers']}."
    eps = 1e-5

    def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    embeds = tensors[f"{stack}embed_tokens.weight"][tokens]
    enorm, hnorm = tensors[mtp + "enorm.weight"], tensors[mtp + "hnorm.weight"]
    joined = torch.cat((rms_norm(embeds, enorm), rms_norm(hidden, hnorm)), dim=-1)
    x = joined @ tensors[mtp + "eh_proj.weight"].t()
    block = one_layer_reference(path, tensors, stack, mtp)
    with torch.inference_mode():
        normed: torch.Tensor = block.model.language_model(inputs_embeds=x[None]).last_hidden_state
        return normed[0] @ target.lm_head.weight.t()


def one_layer_reference(path: Path, tensors: dict[str, torch.Tensor], stack: str, mtp: str) -> Any:
    """The MTP block saved as a one-layer, one-stream checkpoint (its final norm
    ``shared_head.norm``) and loaded by transformers, which maps the checkpoint's names."""
    import json

    from safetensors.torch import save_file

    block_dir = path / "mtp_block"
    block_dir.mkdir(exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    config["text_config"].update(
        num_hidden_layers=1, hc_mult=1, layer_types=["indexed_attention"],
        mlp_layer_types=["sparse"], indexer_types=["full"], num_nextn_predict_layers=0,
    )  # fmt: skip
    (block_dir / "config.json").write_text(json.dumps(config))
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
    saved = {n: t for n, t in tensors.items() if ".layers." not in n}
    saved |= {
        f"{stack}layers.0.{n[len(mtp) :]}": t
        for n, t in tensors.items()
        if n.startswith(mtp) and not n[len(mtp) :].startswith(own)
    }
    saved[f"{stack}norm.weight"] = tensors[mtp + "shared_head.norm.weight"]
    save_file({n: t.contiguous() for n, t in saved.items()}, block_dir / "model.safetensors")
    return transformers.Glm5NextForConditionalGeneration.from_pretrained(block_dir).eval()


def run_mtp(
    model: Glm5NextForCausalLM, tokens: torch.Tensor, hidden: torch.Tensor, cuts: list[int]
) -> torch.Tensor:
    """The MTP layer over ``tokens`` in chunks ending at ``cuts``, through its paged latent and
    a flat indexer slot; the logits of every position."""
    config = model.config
    assert config.dsa is not None
    cache = allocate_layer_cache(
        mtp_cache_spec(config), num_blocks=8, block_size=BLOCK_SIZE, dtype=torch.float32,
        device="cpu", owner="test",
    )  # fmt: skip
    flat = FlatIndexerSpec(index_head_dim=config.dsa.index_head_dim, index_kpool=4)
    state = tuple(
        torch.zeros((2, *t.shape), dtype=torch.uint8 if t.dtype == "uint8" else torch.float32)
        for t in flat.state(64)
    )
    table = [5, 2, 7, 0]  # non-contiguous blocks
    logits, start = [], 0
    with torch.inference_mode():
        for end in cuts:
            metadata = build_attention_metadata(
                block_tables=[table], seq_lens=[end], query_lens=[end - start],
                block_size=BLOCK_SIZE, state_slots=[1],
            )  # fmt: skip
            out = model.forward_mtp(
                tokens[start:end], hidden[start:end], torch.arange(start, end), cache[0],
                metadata, state,
            )  # fmt: skip
            logits.append(model.compute_mtp_logits(out))
            start = end
    return torch.cat(logits)


def test_the_mtp_layer_is_the_formula(checkpoint: Path) -> None:
    config = model_config_from_hf_file(checkpoint)
    assert config.mtp is not None
    model = load_safetensors_model(checkpoint, config, LoadOptions(dtype=torch.float32))
    assert isinstance(model, Glm5NextForCausalLM)
    assert model.num_mtp_layers == 1
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, VOCAB_SIZE, (NUM_TOKENS,), generator=generator)
    hidden = torch.randn(NUM_TOKENS, HIDDEN, generator=generator)
    expected = reference_logits(checkpoint, tokens, hidden, model)
    at_once = run_mtp(model, tokens, hidden, [NUM_TOKENS])
    torch.testing.assert_close(at_once, expected, rtol=1e-4, atol=1e-4)
    chunked = run_mtp(model, tokens, hidden, [17, 18, NUM_TOKENS])
    torch.testing.assert_close(chunked, expected, rtol=1e-4, atol=1e-4)
    # The layer's weights are its own owner, counted as loaded.
    mtp_params = [p for n, p in model.named_parameters() if weight_owner(n) == MTP]
    counts = param_counts(config)
    assert sum(p.numel() for p in mtp_params) == counts.mtp + counts.mtp_fp32
