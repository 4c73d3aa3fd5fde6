"""Shared fixtures: a tiny random GLM-5.3 saved as a real checkpoint, with the default tokenizer
(the default tokenizer and the tiny random Llama, ``tiny_model_dir``, come from the shared
``metrale_testing`` plugin)."""

from __future__ import annotations

from pathlib import Path

import pytest
from metrale_testing import build_native_ops_first as pytest_sessionstart  # noqa: F401
from metrale_testing import stay_eager

from metrale_model_arch import Tokenizer

stay_eager()


@pytest.fixture(scope="session")
def tiny_glm5_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    """A 4-layer random GLM-5.3 (KDA, DSA with a shared-indexer layer, MoE, 4 streams; pools
    of 4 tokens, top-k 8 tokens) over SmolLM2's vocabulary, as transformers saves it."""
    return save_tiny_glm5(tmp_path_factory.mktemp("tiny-glm5-next"), default_tokenizer)


def save_tiny_glm5(
    path: Path, default_tokenizer: Tokenizer, *, index_kpool: int = 4, index_topk: int = 8
) -> Path:
    """:func:`tiny_glm5_dir`'s model, with other indexer pools if asked."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    linear, indexed = "linear_attention", "indexed_attention"
    text = transformers.Glm5NextTextConfig(
        vocab_size=default_tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=0,
        qk_nope_head_dim=16,
        v_head_dim=16,
        index_n_heads=16,
        index_head_dim=16,
        index_topk=index_topk,
        index_kpool=index_kpool,
        linear_num_heads=2,
        linear_head_dim=16,
        hc_mult=4,
        layer_types=[linear, indexed, indexed, linear],
        mlp_layer_types=["dense", "sparse", "sparse", "dense"],
        indexer_types=["full", "full", "shared", "full"],
        max_position_embeddings=512,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        pad_token_id=0,
    )
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
              "out_hidden_size": 64, "projection_intermediate_size": 64}  # fmt: skip
    config = transformers.Glm5NextConfig(text_config=text.to_dict(), vision_config=vision)
    model = transformers.Glm5NextForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            noise = torch.randn(tensor.shape, generator=generator)
            if "norm" in name or name.endswith("_hc.scale"):
                tensor.copy_(1.0 + 0.2 * noise)
            elif name.endswith("dt_bias"):
                tensor.copy_(-3.0 + 0.5 * noise)
            else:
                tensor.copy_(0.2 * noise)
    model.save_pretrained(path)
    default_tokenizer.save(path)
    return path


@pytest.fixture(scope="session")
def tiny_glm4_moe_dir(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    """A 2-layer random GLM-4.5 (a dense layer, then MoE; partial rotary, q/k norms) with one
    random MTP layer, over SmolLM2's vocabulary."""
    from metrale_testing import save_tiny_glm4_moe

    path = tmp_path_factory.mktemp("tiny-glm4-moe")
    save_tiny_glm4_moe(
        path,
        vocab_size=default_tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=24,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        use_qk_norm=True,
        partial_rotary_factor=0.5,
        max_position_embeddings=512,
        num_nextn_predict_layers=1,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        pad_token_id=0,
    )
    default_tokenizer.save(path)
    return path


IMAGE_TOKEN = "<filename>"  # one of SmolLM2's special tokens: the image placeholder here
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}"
    "{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'image' %}"
    + IMAGE_TOKEN
    + "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The tower's 4-pixel patches: images of a few dozen pixels take 4 to 16 image tokens.
PROCESSOR = {"patch_size": 4, "min_image_tokens": 4, "max_image_tokens": 16}


def save_tiny_glm5_vision(path: Path, tokenizer: Tokenizer) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    linear, indexed = "linear_attention", "indexed_attention"
    text = transformers.Glm5NextTextConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=96,
        moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, q_lora_rank=32,
        kv_lora_rank=16, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16,
        index_n_heads=16, index_head_dim=16, index_topk=8, index_kpool=4, linear_num_heads=2,
        linear_head_dim=16, hc_mult=4, layer_types=[linear, indexed, indexed, linear],
        mlp_layer_types=["dense", "sparse", "sparse", "dense"],
        indexer_types=["full", "full", "shared", "full"], max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=0,
    )  # fmt: skip
    vision = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 40,
              "out_hidden_size": 64, "projection_intermediate_size": 56,
              "patch_size": 4}  # fmt: skip
    image_id = tokenizer.encode(IMAGE_TOKEN, add_special_tokens=False)
    assert len(image_id) == 1
    config = transformers.Glm5NextConfig(
        text_config=text.to_dict(),
        vision_config=vision,
        image_token_id=image_id[0],
        video_token_id=image_id[0],
        video_start_token_id=image_id[0] + 1,
        video_end_token_id=image_id[0] + 2,
    )
    model = transformers.Glm5NextForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = torch.randn(tensor.shape, generator=generator)
            if "norm" in name or name.endswith("_hc.scale"):
                tensor.copy_(1.0 + 0.2 * noise)
            elif name.endswith("dt_bias"):
                tensor.copy_(-3.0 + 0.5 * noise)
            else:
                tensor.copy_(0.2 * noise)
    model.save_pretrained(path)
    pil_processor = pytest.importorskip(
        "transformers.models.glm5_next.image_processing_pil_glm5_next"
    )
    pil_processor.Glm5NextImageProcessorPil(**PROCESSOR).save_pretrained(path)
    tokenizer.save(path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


@pytest.fixture(scope="session")
def tiny_glm5_vision_dir(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    """A tiny GLM-5.3 with a two-block vision tower (4-pixel patches: 4 to 16 tokens an
    image), its image placeholder SmolLM2's ``<filename>``, and a chat template writing one
    placeholder per image part."""
    return save_tiny_glm5_vision(tmp_path_factory.mktemp("tiny-glm5-vision"), default_tokenizer)
