"""Tiny random checkpoints as transformers saves them (safetensors), over a given tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from metrale_model_arch import Tokenizer


def save_tiny_llama(path: Path, tokenizer: Tokenizer, max_positions: int) -> Path:
    """A 2-layer random Llama (GQA, untied) over ``tokenizer``'s vocabulary, saved as
    safetensors (the tokenizer is not saved: callers add the one they want)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def save_random_model(
    path: Path, tokenizer: Tokenizer, config_name: str, model_name: str, **extra: object
) -> Path:
    """A 2-layer model of transformers' ``model_name`` (its config ``config_name``, with
    ``extra`` fields) with random weights, norms near 1, saved with ``tokenizer``."""
    import torch
    import transformers

    config = getattr(transformers, config_name)(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **{"head_dim": 16, "max_position_embeddings": 256, **extra},
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = getattr(transformers, model_name)(config)
    randomize_weights(model, torch.Generator().manual_seed(0))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)
    return path


def save_tiny_glm4_moe(path: Path, seed: int = 0, **kwargs: Any) -> Any:
    """Save a random ``Glm4MoeForCausalLM`` (parameters and correction biases) plus random MTP
    layers named as GLM-4.5 names them; returns the transformers model."""
    import torch
    import transformers

    hf_model = transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**kwargs)).eval()
    generator = torch.Generator().manual_seed(seed)
    randomize_weights(hf_model, generator, buffers=True)
    hf_model.save_pretrained(path, safe_serialization=True)
    add_mtp_layers(path, hf_model.config, generator)
    return hf_model


def save_tiny_deepseek_v3(path: Path, seed: int = 0, **kwargs: Any) -> Any:
    """Save a random ``DeepseekV3ForCausalLM`` (parameters and correction biases) plus random
    MTP layers named as DeepSeek-V3 names them; returns the transformers model."""
    import torch
    import transformers

    config = transformers.DeepseekV3Config(**kwargs)
    hf_model = transformers.DeepseekV3ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    randomize_weights(hf_model, generator, buffers=True)
    hf_model.save_pretrained(path, safe_serialization=True)
    add_mtp_layers(path, hf_model.config, generator)
    return hf_model


def randomize_weights(model: Any, generator: torch.Generator, *, buffers: bool = False) -> None:
    """Draw every parameter of a transformers ``model`` anew (with ``buffers``, every buffer
    too, such as MoE correction biases, but the RoPE tables) in ``named_parameters`` order:
    ``1 + 0.2 * noise`` for norms, ``0.2 * noise`` elsewhere."""
    import torch

    named = [*model.named_parameters(), *(model.named_buffers() if buffers else ())]
    with torch.no_grad():
        for name, tensor in named:
            if "rotary_emb" in name:
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            tensor.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)


def add_mtp_layers(path: Path, hf_config: Any, generator: torch.Generator) -> None:
    """Append ``num_nextn_predict_layers`` random MTP layers to ``model.safetensors``: the last
    layer's tensors renumbered (a sparse block), ``enorm``, ``hnorm``, ``eh_proj``,
    ``shared_head.norm``; the first also with copies of the embedding and the head."""
    import torch
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    tensors = load_file(file)
    num_layers, hidden = hf_config.num_hidden_layers, hf_config.hidden_size
    last = f"model.layers.{num_layers - 1}."
    for k in range(hf_config.num_nextn_predict_layers):
        prefix = f"model.layers.{num_layers + k}."
        shapes = {
            prefix + name[len(last) :]: tensor.shape
            for name, tensor in tensors.items()
            if name.startswith(last)
        }
        for name in ("enorm", "hnorm", "shared_head.norm"):
            shapes[f"{prefix}{name}.weight"] = torch.Size([hidden])
        shapes[f"{prefix}eh_proj.weight"] = torch.Size([hidden, 2 * hidden])
        for name, shape in shapes.items():
            noise = torch.randn(shape, generator=generator)
            tensors[name] = 1.0 + 0.2 * noise if "norm" in name else 0.2 * noise
        if k == 0:
            embedding = tensors["model.embed_tokens.weight"]
            tensors[f"{prefix}embed_tokens.weight"] = embedding.clone()
            tensors[f"{prefix}shared_head.head.weight"] = embedding.clone()
    save_file({n: t.contiguous() for n, t in tensors.items()}, file, metadata={"format": "pt"})
