"""Gemma 3 with images against transformers' Gemma3ForConditionalGeneration.

A tiny random checkpoint: two text layers (one sliding, window 6; one global), a two-layer
SigLIP tower over 16-pixel images in 4-pixel patches, pooled to 4 tokens an image. Prompts with
one and with two images (``<start_of_image>``, 4 image tokens, ``<end_of_image>``, as
transformers' processor lays them out) run batched through the paged path and match
transformers' logits and greedy tokens on the same ``pixel_values`` (made by our preprocessing,
equal to transformers' processor's), with its ``token_type_ids`` (each image's tokens attend to
the whole image). Every weight is random.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
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
    WithPromptInputs,
    laid_out_prompts,
    prefill_embeds,
    random_text,
    transformers_logits,
)
from safetensors.torch import load_file, save_file

from metrale_config import ModelConfig, model_config_from_hf_dict
from metrale_model_arch import LoadOptions, text_only_config
from metrale_model_arch.counts.gemma3 import projector_params, siglip_tower_params
from metrale_model_arch.families.gemma3 import Gemma3ForConditionalGeneration
from metrale_model_arch.families.gemma3.vision import prompt_embeds
from metrale_model_arch.families.gemma3.vision.preprocess import preprocess_images
from metrale_model_arch.families.gemma3.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.rope_table import rope_table_bytes
from metrale_model_arch.memory.weights import VISION as VISION_OWNER
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.owners import ROPE_TABLE

transformers = pytest.importorskip("transformers")
pil_processor = pytest.importorskip("transformers.models.gemma3.image_processing_pil_gemma3")

VOCAB_SIZE = 256
IMAGE, BOI, EOI = 250, 251, 252
TOKENS_PER_IMAGE = 4
NUM_GREEDY_TOKENS = 24
MAX_SEQ_LEN = 128
TEXT = {"vocab_size": VOCAB_SIZE, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "sliding_window": 6, "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 8, "max_position_embeddings": MAX_SEQ_LEN}  # fmt: skip
VISION = {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
          "vision_use_head": False}  # fmt: skip
# (height, width): one image of each shape; the last two go in one prompt.
IMAGE_SIZES = ((20, 28), (50, 13), (9, 40))


def randomize(model: torch.nn.Module) -> None:
    """Every parameter random: the tower's LayerNorm scales around one, Gemma's ``1 + w``
    norms around zero; the text embeddings (times sqrt(hidden), tied to the head) small, so the
    layers, not the input token, choose the next token."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "vision_tower" in name and "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_((0.02 if "embed_tokens" in name else 0.3) * noise)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> VisionCheckpoint:
    path = tmp_path_factory.mktemp("gemma3")
    hf_config = transformers.Gemma3Config(
        text_config=TEXT,
        vision_config=VISION,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        image_token_index=IMAGE,
        boi_token_index=BOI,
        eoi_token_index=EOI,
    )
    hf_model = transformers.Gemma3ForConditionalGeneration(hf_config).eval()
    randomize(hf_model)
    size = {"height": VISION["image_size"], "width": VISION["image_size"]}
    processor = pil_processor.Gemma3ImageProcessorPil(size=size)
    return save_vision_checkpoint(path, hf_model, processor, IMAGE_SIZES)


def load(checkpoint: VisionCheckpoint, dtype: torch.dtype = torch.float32, **options: Any) -> Any:
    options = {"max_seq_len": MAX_SEQ_LEN, **options}
    return load_vision_model(checkpoint, Gemma3ForConditionalGeneration, dtype=dtype, **options)


def image_prompts(checkpoint: VisionCheckpoint) -> dict[int, ImagePrompt]:
    """Sequence 0: text, an image, text; sequence 1: text, an image, text, an image, text."""
    assert checkpoint.config.siglip_vision is not None
    processor = ImageProcessorConfig.from_directory(
        checkpoint.path, checkpoint.config.siglip_vision
    )
    text = random_text(seed=1, low=1, high=IMAGE)
    image = [BOI, *[IMAGE] * TOKENS_PER_IMAGE, EOI]
    layouts = {
        0: ([0], [*text(5), *image, *text(4)]),
        1: ([1, 2], [*text(3), *image, *text(2), *image, *text(5)]),
    }
    return laid_out_prompts(
        checkpoint.images, layouts, lambda images: preprocess_images(images, processor)
    )


def prefill(
    model: Gemma3ForConditionalGeneration,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, ImagePrompt],
) -> Prefill:
    return prefill_embeds(model, paged_runner, prompts, prompt_embeds, block_size=4)


def hf_inputs(prompt: ImagePrompt, *, bidirectional: bool = True) -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([prompt.token_ids])
    inputs = {"input_ids": input_ids, "pixel_values": prompt.images.pixel_values}
    if bidirectional:
        inputs["token_type_ids"] = (input_ids == IMAGE).long()
    return inputs


def hf_logits(checkpoint: VisionCheckpoint, prompt: ImagePrompt, **options: bool) -> torch.Tensor:
    return transformers_logits(checkpoint.hf_model, hf_inputs(prompt, **options))


def test_the_config_has_one_sliding_and_one_global_layer(checkpoint: VisionCheckpoint) -> None:
    config = checkpoint.config
    assert [str(kind) for kind in config.layer_types] == ["sliding_attention", "full_attention"]
    assert config.sliding_window == 6
    vision = config.siglip_vision
    assert vision is not None
    assert (vision.image_token_id, vision.boi_token_id, vision.eoi_token_id) == (IMAGE, BOI, EOI)
    assert (vision.patches_per_side, vision.pool_size) == (4, 2)


def test_the_pixel_values_are_transformers_processors(checkpoint: VisionCheckpoint) -> None:
    processor = pil_processor.Gemma3ImageProcessorPil.from_pretrained(checkpoint.path)
    for prompt, which in zip(image_prompts(checkpoint).values(), ([0], [1, 2]), strict=True):
        reference = processor([checkpoint.images[i] for i in which], return_tensors="pt")
        torch.testing.assert_close(
            prompt.images.pixel_values, reference["pixel_values"], rtol=0, atol=0
        )


def test_the_tower_and_projector_match_transformers(checkpoint: VisionCheckpoint) -> None:
    model = load(checkpoint)
    assert model.visual is not None
    pixel_values = image_prompts(checkpoint)[1].images.pixel_values
    with torch.inference_mode():
        ours = model.visual(pixel_values)
        theirs = checkpoint.hf_model.model.get_image_features(pixel_values).pooler_output
    assert ours.shape == (2, TOKENS_PER_IMAGE, TEXT["hidden_size"])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


class TestImagePrompts(ImagePromptChecks):
    family = ImagePromptFamily(load, image_prompts, prefill, hf_inputs, NUM_GREEDY_TOKENS)


def test_image_tokens_attend_to_their_whole_image(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    """transformers' logits with and without ``token_type_ids`` differ from the first image
    token on; ours without the image spans (causal only) are its causal ones."""
    prompt = image_prompts(checkpoint)[1]
    first = prompt.token_ids.index(IMAGE)
    bidirectional = hf_logits(checkpoint, prompt)
    causal = hf_logits(checkpoint, prompt, bidirectional=False)
    torch.testing.assert_close(causal[:first], bidirectional[:first], rtol=0, atol=1e-6)
    assert float((causal[first:] - bidirectional[first:]).abs().max()) > 1e-2
    model = load(checkpoint)
    model.image_token_id = None
    ours = prefill(model, paged_runner, {0: prompt}).logits
    torch.testing.assert_close(ours[0], causal, rtol=0, atol=1e-4)


def test_a_decode_row_beside_an_image_prefill_matches_transformers(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    """One step: sequence 0's next token (a decode row, on the masked path with the other's
    image prefill) and sequence 1's whole prompt."""
    model = load(checkpoint)
    prompts = image_prompts(checkpoint)
    first, second = prompts[0], prompts[1]
    wrapped = WithPromptInputs(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=4)
    with torch.inference_mode():
        wrapped.embeds = prompt_embeds(model, torch.tensor(first.token_ids), first.images)
        token = int(run.step({0: first.token_ids})[0][-1].argmax())
        wrapped.embeds = torch.cat(
            [
                model.embed(torch.tensor([token])),
                prompt_embeds(model, torch.tensor(second.token_ids), second.images),
            ]
        )
    logits = run.step({0: [token], 1: second.token_ids})
    extended = attrs.evolve(first, token_ids=[*first.token_ids, token])
    torch.testing.assert_close(
        logits[0][-1], hf_logits(checkpoint, extended)[-1], rtol=0, atol=1e-4
    )
    torch.testing.assert_close(logits[1], hf_logits(checkpoint, second), rtol=0, atol=1e-4)


def test_chunks_between_images_match_one_shot(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    """A chunk ending right after the first image's ``<end_of_image>``, the second image in the
    next chunk, gives the one-shot logits."""
    model = load(checkpoint)
    prompt = image_prompts(checkpoint)[1]
    tokens = prompt.token_ids
    cut = tokens.index(EOI) + 1
    with torch.inference_mode():
        embeds = prompt_embeds(model, torch.tensor(tokens), prompt.images)
    wrapped = WithPromptInputs(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=4)
    chunks = []
    for start, stop in ((0, cut), (cut, len(tokens))):
        wrapped.embeds = embeds[start:stop]
        chunks.append(run.step({0: tokens[start:stop]})[0])
    one_shot = prefill(model, paged_runner, {0: prompt}).logits
    torch.testing.assert_close(torch.cat(chunks), one_shot[0], rtol=0, atol=1e-5)


def test_a_chunk_inside_an_image_is_refused(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    tokens = image_prompts(checkpoint)[0].token_ids
    inside = tokens.index(IMAGE) + 2
    run = paged_runner(load(checkpoint), num_blocks=64, block_size=4)
    with pytest.raises(ValueError, match="rows end inside an image"):
        run.step({0: tokens[:inside]})
    run = paged_runner(load(checkpoint), num_blocks=64, block_size=4)
    run.step({0: tokens[: inside - 2]})
    with pytest.raises(ValueError, match="rows start inside an image"):
        run.step({0: tokens[inside - 2 :]})


def test_prompts_the_images_do_not_fit_are_refused(checkpoint: VisionCheckpoint) -> None:
    model = load(checkpoint)
    prompt = image_prompts(checkpoint)[0]
    ids = torch.tensor(prompt.token_ids)
    one_image_token_less = torch.cat([ids[:7], ids[8:]])
    with pytest.raises(ValueError, match="3 image tokens; its 1 image"):
        prompt_embeds(model, one_image_token_less, prompt.images)
    with pytest.raises(ValueError, match="but no images"):
        prompt_embeds(model, ids, None)


def planned(config: ModelConfig, dtype: torch.dtype) -> dict[str, int]:
    """The plan's owners of weights and the RoPE table, each with its bytes (a tied head has
    none)."""
    weights = weight_bytes(config, dtype.itemsize).by_owner()
    plan = {**weights, ROPE_TABLE: rope_table_bytes(config, MAX_SEQ_LEN)}
    return {owner: size for owner, size in plan.items() if size}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_weight_plan_is_the_ledger_with_the_tower(
    checkpoint: VisionCheckpoint, dtype: torch.dtype
) -> None:
    allocator = RecordingAllocator()
    load(checkpoint, dtype, allocator=allocator)
    plan = planned(checkpoint.config, dtype)
    hf_vision = (
        checkpoint.hf_model.model.vision_tower,
        checkpoint.hf_model.model.multi_modal_projector,
    )
    vision_params = sum(p.numel() for module in hf_vision for p in module.parameters())
    assert plan[VISION_OWNER] == vision_params * dtype.itemsize
    assert dict(allocator.bytes_by_owner) == plan


@pytest.mark.parametrize(
    ("vision", "num_tokens"), [({}, 49), (VISION, TOKENS_PER_IMAGE)], ids=["default", "tiny"]
)
def test_the_tower_count_is_transformers(vision: dict[str, Any], num_tokens: int) -> None:
    hf_config = transformers.Gemma3Config(
        text_config={**TEXT, "hidden_size": 40},
        vision_config={**vision, "vision_use_head": False},
        mm_tokens_per_image=num_tokens,
    )
    with torch.device("meta"):
        model = transformers.models.gemma3.modeling_gemma3.Gemma3Model(hf_config)
    parsed = model_config_from_hf_dict(hf_config.to_dict(), source="test").siglip_vision
    assert parsed is not None
    assert siglip_tower_params(parsed) == sum(p.numel() for p in model.vision_tower.parameters())
    assert projector_params(parsed, 40) == sum(
        p.numel() for p in model.multi_modal_projector.parameters()
    )


def renamed(names: dict[str, str], name: str) -> str:
    for old, new in names.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


# What transformers 5 saves -> the module names it loads into, and the published checkpoints'.
LAYOUTS = {
    "module-names": {
        "language_model.model.": "model.language_model.",
        "vision_tower.": "model.vision_tower.",
        "multi_modal_projector.": "model.multi_modal_projector.",
    },
    "published": {"vision_tower.": "vision_tower.vision_model."},
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_checkpoint_layouts_load_the_same_weights(
    checkpoint: VisionCheckpoint, layout: dict[str, str], tmp_path: Path
) -> None:
    tensors = load_file(checkpoint.path / "model.safetensors")
    assert all(renamed(layout, name) != name for name in tensors if "vision" in name)
    tensors = {renamed(layout, name): tensor for name, tensor in tensors.items()}
    # A SigLIP pooling head (vision_use_head) is skipped: Gemma 3 never runs it.
    tensors[renamed(layout, "vision_tower.head.probe")] = torch.zeros(1, 1, VISION["hidden_size"])
    save_file(tensors, tmp_path / "model.safetensors")
    model = load_safetensors_model(tmp_path, checkpoint.config, LoadOptions(dtype=torch.float32))
    expected = load(checkpoint).state_dict()
    state = model.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


def test_text_only_loading_leaves_the_tower_out(checkpoint: VisionCheckpoint) -> None:
    """A text-only load of the same checkpoint: no tower planned, allocated or loaded, the text
    weights the same; a config without ``vision_config`` has no tower either."""
    config = text_only_config(checkpoint.config)
    assert config.siglip_vision is None
    allocator = RecordingAllocator()
    options = LoadOptions(dtype=torch.float32, max_seq_len=MAX_SEQ_LEN, allocator=allocator)
    model = load_safetensors_model(checkpoint.path, config, options)
    assert isinstance(model, Gemma3ForConditionalGeneration)
    assert model.visual is None
    assert model.image_token_id is None
    plan = planned(config, torch.float32)
    assert VISION_OWNER not in plan
    assert dict(allocator.bytes_by_owner) == plan
    full = load(checkpoint).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(full[name], tensor), name
    with pytest.raises(ValueError, match="has no vision tower loaded"):
        prompt_embeds(model, torch.tensor([1, 2]), None)
    data = json.loads((checkpoint.path / "config.json").read_text())
    del data["vision_config"]
    assert model_config_from_hf_dict(data, source="test").siglip_vision is None
