"""GLM-5.3's vision tower and image prompts against transformers' Glm5NextForConditionalGeneration.

A tiny random checkpoint with a two-block tower (4-pixel patches, so images of a few dozen pixels
give a dozen image tokens); prompts with one and with two images run through the paged path,
batched, and match transformers' logits and greedy tokens on the same ``pixel_values`` (made by
our preprocessing, equal to transformers' processor's). Every weight is random.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing.recording_allocator import RecordingAllocator
from metrale_testing.vision_checkpoint import (
    VisionCheckpoint,
    load_vision_model,
    save_vision_checkpoint,
)
from metrale_testing.vision_parity import (
    ImagePrompt,
    ImagePromptChecks,
    ImagePromptFamily,
    Prefill,
    laid_out_prompts,
    prefill_embeds,
    random_text,
)

from metrale_config import model_config_from_hf_dict, model_config_from_hf_file
from metrale_model_arch import (
    LoadOptions,
    Tokenizer,
    load_model,
    read_model_config,
    resolve_model,
)
from metrale_model_arch.counts.glm5_next_vision import vision_tower_params
from metrale_model_arch.families.glm5_next import Glm5NextForCausalLM
from metrale_model_arch.families.glm5_next.vision import (
    ImageInputs,
    expand_image_tokens,
    prompt_embeds,
)
from metrale_model_arch.families.glm5_next.vision.preprocess import preprocess_images
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import VISION as VISION_OWNER
from metrale_model_arch.memory.weights import weight_bytes

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
IMAGE, VIDEO_START, VIDEO_END = 250, 251, 252
NUM_GREEDY_TOKENS = 24
TEXT: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 48,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 0,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "index_n_heads": 4,
    "index_head_dim": 8,
    "index_topk": 8,
    "index_kpool": 4,
    "linear_num_heads": 2,
    "linear_head_dim": 8,
    "hc_mult": 2,
    "swiglu_limit": 3.0,
    "layer_types": [
        "linear_attention",
        "indexed_attention",
        "indexed_attention",
        "linear_attention",
    ],
    "mlp_layer_types": ["dense", "sparse", "sparse", "dense"],
    "indexer_types": ["full", "full", "shared", "full"],
    "pad_token_id": 0,
    "max_position_embeddings": 1024,
}
VISION = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 40,
          "out_hidden_size": 48, "projection_intermediate_size": 56, "patch_size": 4,
          "swiglu_limit": 2.0}  # fmt: skip
PROCESSOR = {"patch_size": 4, "min_image_tokens": 4, "max_image_tokens": 16}
# (height, width): one image of each shape, the last two in one prompt.
IMAGE_SIZES = ((20, 28), (50, 13), (9, 40))


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (norms around one), the rest small; buffers keep their values
    (the tower's rotary frequencies are a buffer the checkpoint does not carry)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name or name.endswith("_hc.scale"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("dt_bias"):
                param.copy_(-3.0 + 0.5 * noise)
            elif name.endswith(("A_log", "_hc.base")):
                param.copy_(0.5 * noise)
            else:
                param.copy_(0.3 * noise)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.5 * torch.randn(buffer.shape, generator=generator))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> VisionCheckpoint:
    path = tmp_path_factory.mktemp("glm5_next_vision")
    hf_config = transformers.Glm5NextConfig(
        text_config=TEXT,
        vision_config=VISION,
        image_token_id=IMAGE,
        video_token_id=IMAGE,
        video_start_token_id=VIDEO_START,
        video_end_token_id=VIDEO_END,
    )
    hf_model = transformers.Glm5NextForConditionalGeneration(hf_config).eval()
    randomize(hf_model, seed=0)
    pil_processor = pytest.importorskip(
        "transformers.models.glm5_next.image_processing_pil_glm5_next"
    )
    processor = pil_processor.Glm5NextImageProcessorPil(**PROCESSOR)
    return save_vision_checkpoint(path, hf_model, processor, IMAGE_SIZES)


def load(checkpoint: VisionCheckpoint, dtype: torch.dtype = torch.float32, **options: Any) -> Any:
    return load_vision_model(checkpoint, Glm5NextForCausalLM, dtype=dtype, **options)


def image_prompts(checkpoint: VisionCheckpoint) -> dict[int, ImagePrompt]:
    """Sequence 0: text, an image, text; sequence 1: two images between texts."""
    assert checkpoint.config.vision is not None
    processor = ImageProcessorConfig.from_directory(checkpoint.path, checkpoint.config.vision)
    text = random_text(seed=1, low=1, high=IMAGE)
    layouts = {
        0: ([0], [*text(7), IMAGE, *text(5)]),
        1: ([1, 2], [*text(3), IMAGE, IMAGE, *text(9)]),
    }
    return laid_out_prompts(
        checkpoint.images,
        layouts,
        lambda images: preprocess_images(images, processor),
        lambda tokens, images: expand_image_tokens(tokens, IMAGE, images.num_tokens(2)),
    )


def prefill(
    model: Glm5NextForCausalLM,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, ImagePrompt],
) -> Prefill:
    return prefill_embeds(model, paged_runner, prompts, prompt_embeds, block_size=8)


def hf_inputs(prompt: ImagePrompt) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.tensor([prompt.token_ids]),
        "pixel_values": prompt.images.pixel_values,
        "image_grid_thw": prompt.images.grid_thw,
    }


def test_the_pixel_values_are_transformers_processors(checkpoint: VisionCheckpoint) -> None:
    for prompt, which in zip(image_prompts(checkpoint).values(), ([0], [1, 2]), strict=True):
        reference = checkpoint.hf_processor([checkpoint.images[i] for i in which])
        torch.testing.assert_close(
            prompt.images.pixel_values, torch.as_tensor(reference["pixel_values"]), rtol=0, atol=0
        )
        assert prompt.images.grid_thw.tolist() == reference["image_grid_thw"].tolist()


def test_the_tower_matches_transformers(checkpoint: VisionCheckpoint) -> None:
    model = load(checkpoint)
    assert model.model.visual is not None
    images = image_prompts(checkpoint)[1].images
    with torch.inference_mode():
        ours = model.model.visual(images.pixel_values, images.grid_thw)
        theirs = checkpoint.hf_model.model.get_image_features(
            images.pixel_values, images.grid_thw
        ).pooler_output
    torch.testing.assert_close(ours, torch.cat(theirs), rtol=0, atol=1e-5)


class TestImagePrompts(ImagePromptChecks):
    family = ImagePromptFamily(load, image_prompts, prefill, hf_inputs, NUM_GREEDY_TOKENS)


def test_the_images_change_the_logits(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    """Swapping the two images of a prompt changes its logits from the first image token on."""
    prompt = image_prompts(checkpoint)[1]
    images = prompt.images
    first_tokens = images.num_tokens(2)[0]
    second = images.pixel_values[int(images.grid_thw[0].prod()) :]
    first = images.pixel_values[: int(images.grid_thw[0].prod())]
    swapped = ImagePrompt(
        token_ids=prompt.token_ids,
        images=ImageInputs(
            pixel_values=torch.cat([second, first]), grid_thw=images.grid_thw.flip(0)
        ),
    )
    assert sum(swapped.images.num_tokens(2)) == sum(images.num_tokens(2))
    model = load(checkpoint)
    ours = prefill(model, paged_runner, {0: prompt}).logits
    theirs = prefill(model, paged_runner, {0: swapped}).logits
    start = prompt.token_ids.index(IMAGE)
    torch.testing.assert_close(ours[0][:start], theirs[0][:start], rtol=0, atol=0)
    assert (
        float((ours[0][start + first_tokens :] - theirs[0][start + first_tokens :]).abs().max())
        > 1e-2
    )


def test_prompts_the_images_do_not_fit_are_refused(checkpoint: VisionCheckpoint) -> None:
    model = load(checkpoint)
    prompt = image_prompts(checkpoint)[0]
    ids = torch.tensor(prompt.token_ids)
    one_image_token_less = torch.cat([ids[:7], ids[8:]])
    with pytest.raises(ValueError, match="image tokens; its 1 image"):
        prompt_embeds(model, one_image_token_less, prompt.images)
    with pytest.raises(ValueError, match="but no images"):
        prompt_embeds(model, ids, None)
    with pytest.raises(ValueError, match="video input is not supported"):
        prompt_embeds(model, torch.cat([torch.tensor([VIDEO_START]), ids]), prompt.images)
    with pytest.raises(ValueError, match="more image placeholders"):
        expand_image_tokens([1, IMAGE, IMAGE], IMAGE, [4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_weight_plan_is_the_ledger_with_the_tower(
    checkpoint: VisionCheckpoint, dtype: torch.dtype
) -> None:
    allocator = RecordingAllocator()
    load(checkpoint, dtype, allocator=allocator)
    plan = weight_bytes(checkpoint.config, dtype.itemsize).by_owner()
    assert plan[VISION_OWNER] == vision_bytes(checkpoint, dtype)
    assert dict(allocator.bytes_by_owner) == plan


def vision_bytes(checkpoint: VisionCheckpoint, dtype: torch.dtype) -> int:
    tower = checkpoint.hf_model.model.visual
    return int(sum(p.numel() for p in tower.parameters())) * dtype.itemsize


@pytest.mark.parametrize(
    "vision",
    [{}, VISION, {**VISION, "attention_bias": False, "temporal_patch_size": 1}],
    ids=["default", "tiny", "no-bias"],
)
def test_the_tower_count_is_transformers(vision: dict[str, Any]) -> None:
    config = transformers.Glm5NextVisionConfig(**vision)
    with torch.device("meta"):
        tower = transformers.models.glm5_next.modeling_glm5_next.Glm5NextVisionModel(config)
    data = transformers.Glm5NextConfig(vision_config=vision).to_dict()
    parsed = model_config_from_hf_dict(data, source="test").vision
    assert parsed is not None
    assert vision_tower_params(parsed) == sum(p.numel() for p in tower.parameters())


def test_a_text_only_config_loads_no_tower(checkpoint: VisionCheckpoint, tmp_path: Path) -> None:
    """Without ``vision_config`` the tower's tensors are skipped and nothing is planned for it."""
    data = json.loads((checkpoint.path / "config.json").read_text())
    del data["vision_config"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    shutil.copy(checkpoint.path / "model.safetensors", tmp_path / "model.safetensors")
    config = model_config_from_hf_file(tmp_path)
    assert config.vision is None
    model = load_safetensors_model(tmp_path, config, LoadOptions(dtype=torch.float32))
    assert isinstance(model, Glm5NextForCausalLM)
    assert model.model.visual is None
    assert VISION_OWNER not in weight_bytes(config, 4).by_owner()


def test_text_only_loading_leaves_the_tower_of_a_vision_checkpoint_out(
    checkpoint: VisionCheckpoint, tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    """What the server does while it takes no images: the same checkpoint, no tower planned,
    allocated or loaded, and the text weights the same."""
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint.path / name, tmp_path / name)
    default_tokenizer.save(tmp_path)
    config = read_model_config(resolve_model(str(tmp_path)), text_only=True)
    assert config.vision is None
    allocator = RecordingAllocator()
    loaded = load_model(
        str(tmp_path),
        LoadOptions(dtype=torch.float32, device="cpu", text_only=True, allocator=allocator),
    )
    assert loaded.model.model.visual is None
    plan = weight_bytes(config, 4).by_owner()
    assert VISION_OWNER not in plan
    assert dict(allocator.bytes_by_owner) == plan
    full = load(checkpoint)
    text_only = loaded.model.state_dict()
    for name, tensor in full.state_dict().items():
        if not name.startswith("model.visual."):
            assert torch.equal(text_only[name], tensor), name
