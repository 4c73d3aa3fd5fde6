"""Qwen2.5-VL against transformers' Qwen2_5_VLForConditionalGeneration.

A tiny random checkpoint: a 2-layer Qwen2 text stack with M-RoPE, a 2-block tower (block 0
attends within windows of 2x2 merge blocks, block 1 to the whole frame; 4-pixel patches, so
images of a few dozen pixels give a few dozen image tokens and several windows, some cut short
at the edges). Prompts with one image and with two images of different sizes are prefilled in
one paged step, batched, at their M-RoPE positions, then decoded greedily at their sequence
index plus the prompt's delta; logits and tokens match transformers' on the same
``pixel_values`` (made by our preprocessing, equal to transformers' processor's). Every weight
is random.
"""

from __future__ import annotations

import json
import shutil
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
    random_text,
)
from safetensors.torch import save_file

from metrale_config import model_config_from_hf_dict
from metrale_model_arch import LoadOptions
from metrale_model_arch.counts.qwen2_5_vl_vision import qwen2_5_vl_vision_params
from metrale_model_arch.families.qwen2_5_vl import Qwen2_5_VLForCausalLM
from metrale_model_arch.families.qwen2_5_vl.mrope import mrope_cos_sin
from metrale_model_arch.families.qwen2_5_vl.positions import prompt_positions
from metrale_model_arch.families.qwen2_5_vl.vision import prompt_inputs
from metrale_model_arch.families.qwen2_5_vl.vision.preprocess import preprocess_images
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.families.qwen2_5_vl.vision.windows import window_order
from metrale_model_arch.families.rotary import rope_cos_sin_table
from metrale_model_arch.families.vision.image_inputs import ImageInputs, expand_image_tokens
from metrale_model_arch.load import text_only_config
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.rope_table import rope_table_bytes
from metrale_model_arch.memory.weights import VISION as VISION_OWNER
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.owners import ROPE_TABLE

transformers = pytest.importorskip("transformers")
pil_processor = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
vision_utils = pytest.importorskip("transformers.vision_utils")
hf_modeling = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")

VOCAB_SIZE = 256
IMAGE, VIDEO, VISION_START, VISION_END = 250, 251, 252, 253
NUM_GREEDY_TOKENS = 24
TEXT: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    "bos_token_id": 1,
    "eos_token_id": 2,
}
VISION = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48,
          "out_hidden_size": 64, "patch_size": 4, "window_size": 16,
          "fullatt_block_indexes": [1]}  # fmt: skip
PROCESSOR = {"patch_size": 4, "min_pixels": 64, "max_pixels": 64 * 64}
# (height, width) -> 10x14, 6x18 and 10x8 patches; the second prompt holds the last two.
IMAGE_SIZES = ((40, 56), (27, 70), (37, 29))


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random: norms around one, the rest small."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            is_norm = "norm" in name or "ln_q" in name
            param.copy_(1.0 + 0.2 * noise if is_norm else 0.25 * noise)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> VisionCheckpoint:
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    hf_config = transformers.Qwen2_5_VLConfig(
        text_config=TEXT,
        vision_config=VISION,
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    hf_model = transformers.Qwen2_5_VLForConditionalGeneration(hf_config).eval()
    randomize(hf_model, seed=0)
    processor = pil_processor.Qwen2VLImageProcessorPil(**PROCESSOR)
    return save_vision_checkpoint(path, hf_model, processor, IMAGE_SIZES)


def load(checkpoint: VisionCheckpoint, dtype: torch.dtype = torch.float32, **options: Any) -> Any:
    return load_vision_model(checkpoint, Qwen2_5_VLForCausalLM, dtype=dtype, **options)


def image_prompts(checkpoint: VisionCheckpoint) -> dict[int, ImagePrompt]:
    """Sequence 0: text, an image, text; sequence 1: two images between texts, each image
    wrapped in vision start and end tokens as the chat template writes it."""
    assert checkpoint.config.vision is not None
    processor = Qwen2VLImageProcessorConfig.from_directory(
        checkpoint.path, checkpoint.config.vision
    )
    text = random_text(seed=1, low=3, high=IMAGE)
    image = [VISION_START, IMAGE, VISION_END]
    layouts = {
        0: ([0], [*text(7), *image, *text(5)]),
        1: ([1, 2], [*text(3), *image, *text(2), *image, *text(6)]),
    }
    return laid_out_prompts(
        checkpoint.images,
        layouts,
        lambda images: preprocess_images(images, processor),
        lambda tokens, images: expand_image_tokens(tokens, IMAGE, images.num_tokens(2)),
    )


def prefill(
    model: Qwen2_5_VLForCausalLM,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, ImagePrompt],
) -> Prefill:
    """All prompts in one paged step, at their M-RoPE positions; each decode step's token at
    its sequence index plus its prompt's delta."""
    wrapped = WithPromptInputs(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=8)
    with torch.inference_mode():
        inputs = [
            prompt_inputs(model, torch.tensor(p.token_ids), p.images) for p in prompts.values()
        ]
    wrapped.embeds = torch.cat([i.embeds for i in inputs])
    wrapped.positions = torch.cat([i.positions.positions for i in inputs], dim=1)
    logits = run.step({seq_id: p.token_ids for seq_id, p in prompts.items()})
    deltas = {s: i.positions.delta for s, i in zip(prompts, inputs, strict=True)}

    def at_mrope_positions(tokens: Mapping[int, list[int]]) -> None:
        wrapped.positions = torch.tensor(
            [len(prompts[s].token_ids) + len(out) - 1 + deltas[s] for s, out in tokens.items()]
        )

    return Prefill(run=run, logits=logits, before_decode_step=at_mrope_positions)


def hf_inputs(prompt: ImagePrompt) -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([prompt.token_ids])
    return {
        "input_ids": input_ids,
        "pixel_values": prompt.images.pixel_values,
        "image_grid_thw": prompt.images.grid_thw,
        "mm_token_type_ids": (input_ids == IMAGE).to(torch.int32),
    }


def test_the_pixel_values_are_transformers_processors(checkpoint: VisionCheckpoint) -> None:
    processor = pil_processor.Qwen2VLImageProcessorPil(**PROCESSOR)
    for prompt, which in zip(image_prompts(checkpoint).values(), ([0], [1, 2]), strict=True):
        reference = processor([checkpoint.images[i] for i in which], return_tensors="pt")
        torch.testing.assert_close(
            prompt.images.pixel_values, reference["pixel_values"], rtol=0, atol=0
        )
        assert prompt.images.grid_thw.tolist() == reference["image_grid_thw"].tolist()


@pytest.mark.parametrize(
    "grids",
    [[(1, 10, 14)], [(1, 6, 18), (1, 10, 8)], [(2, 4, 4)], [(1, 16, 16)]],
    ids=["edges", "two-images", "two-frames", "whole-windows"],
)
def test_the_window_order_is_transformers(grids: list[tuple[int, int, int]]) -> None:
    grid_thw = torch.tensor(grids)
    expected_order, cu_windows = vision_utils.get_vision_window_index(
        grid_thw, spatial_merge_size=2, window_size=16, patch_size=4
    )
    windows = window_order(grid_thw, merge_size=2, window_blocks=2)
    assert windows.blocks.tolist() == expected_order.tolist()
    assert [4 * size for size in windows.window_sizes] == cu_windows.diff().tolist()


def test_the_tower_matches_transformers(checkpoint: VisionCheckpoint) -> None:
    model = load(checkpoint)
    assert model.model.visual is not None
    images = image_prompts(checkpoint)[1].images
    assert len(window_order(images.grid_thw, 2, 2).window_sizes) > 2 * images.num_images
    with torch.inference_mode():
        ours = model.model.visual(images.pixel_values, images.grid_thw)
        theirs = checkpoint.hf_model.model.get_image_features(
            images.pixel_values, images.grid_thw
        ).pooler_output
    torch.testing.assert_close(ours, torch.cat(theirs), rtol=0, atol=1e-4)


def test_the_prompt_positions_are_transformers_rope_index(checkpoint: VisionCheckpoint) -> None:
    hf_model = checkpoint.hf_model.model
    for prompt in image_prompts(checkpoint).values():
        inputs = hf_inputs(prompt)
        expected, delta = hf_model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"]
        )
        ours = prompt_positions(
            prompt.token_ids, prompt.images.grid_thw, image_token_id=IMAGE, merge_size=2
        )
        assert torch.equal(ours.positions, expected[:, 0])
        assert ours.delta == int(delta) < 0
    text = prompt_positions([5, 6, 7], None, image_token_id=IMAGE, merge_size=2)
    assert text.positions.tolist() == [[0, 1, 2]] * 3
    assert text.delta == 0


def test_each_frequency_turns_by_its_sections_position(checkpoint: VisionCheckpoint) -> None:
    table = rope_cos_sin_table(checkpoint.config, 64)  # (64, 16): 8 cos, then 8 sin
    plain = torch.tensor([0, 5, 63, 7])
    assert torch.equal(mrope_cos_sin(table, plain.expand(3, -1), (2, 3, 3)), table[plain])
    (row,) = mrope_cos_sin(table, torch.tensor([[1], [2], [3]]), (2, 3, 3))
    sections = [table[1, :2], table[2, 2:5], table[3, 5:8]]
    sections += [table[1, 8:10], table[2, 10:13], table[3, 13:16]]
    assert torch.equal(row, torch.cat(sections))


class TestImagePrompts(ImagePromptChecks):
    family = ImagePromptFamily(
        load, image_prompts, prefill, hf_inputs, NUM_GREEDY_TOKENS, min_distinct_greedy_tokens=8
    )


def test_text_prompts_run_from_plain_positions(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    """Without images the engine's ``(tokens,)`` positions are the M-RoPE ones."""
    prompt = torch.randint(3, IMAGE, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    run = paged_runner(load(checkpoint), num_blocks=16, block_size=8)
    ours = run.step({0: prompt})[0]
    with torch.inference_mode():
        theirs = checkpoint.hf_model(input_ids=torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_the_images_change_the_logits(
    checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
) -> None:
    """Other pixels of the same size change a prompt's logits from its image on, not before."""
    prompt = image_prompts(checkpoint)[0]
    noise = ImageInputs(
        pixel_values=torch.randn(prompt.images.pixel_values.shape),
        grid_thw=prompt.images.grid_thw,
    )
    model = load(checkpoint)
    ours = prefill(model, paged_runner, {0: prompt}).logits[0]
    other = prefill(model, paged_runner, {0: attrs.evolve(prompt, images=noise)}).logits[0]
    start = prompt.token_ids.index(IMAGE)
    torch.testing.assert_close(ours[:start], other[:start], rtol=0, atol=0)
    assert float((ours[start:] - other[start:]).abs().max()) > 1e-2


def test_transformers_5_module_names_load_too(checkpoint: VisionCheckpoint, tmp_path: Path) -> None:
    """A checkpoint named as transformers 5's modules are (``model.language_model.``,
    ``model.visual.``) loads the same weights as the hub's names."""
    state = {name: t.contiguous() for name, t in checkpoint.hf_model.state_dict().items()}
    assert any(name.startswith("model.language_model.") for name in state)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(checkpoint.path / "config.json", tmp_path / "config.json")
    renamed = load_safetensors_model(tmp_path, checkpoint.config, LoadOptions(dtype=torch.float32))
    expected = load(checkpoint).state_dict()
    assert renamed.state_dict().keys() == expected.keys()
    for name, tensor in renamed.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_prompts_the_images_do_not_fit_are_refused(checkpoint: VisionCheckpoint) -> None:
    model = load(checkpoint)
    prompt = image_prompts(checkpoint)[0]
    ids = torch.tensor(prompt.token_ids)
    start = prompt.token_ids.index(IMAGE)
    one_image_token_less = torch.cat([ids[:start], ids[start + 1 :]])
    with pytest.raises(ValueError, match="image tokens; its 1 image"):
        prompt_inputs(model, one_image_token_less, prompt.images)
    with pytest.raises(ValueError, match="but no images"):
        prompt_inputs(model, ids, None)
    with pytest.raises(ValueError, match="video input is not supported"):
        prompt_inputs(model, torch.cat([torch.tensor([VIDEO]), ids]), prompt.images)
    with pytest.raises(ValueError, match="image 0 takes 35 tokens, its run has 34"):
        prompt_positions(one_image_token_less, prompt.images.grid_thw, image_token_id=IMAGE,
                         merge_size=2)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_weight_plan_is_the_ledger_with_the_tower(
    checkpoint: VisionCheckpoint, dtype: torch.dtype
) -> None:
    allocator = RecordingAllocator()
    load(checkpoint, dtype, allocator=allocator)
    plan = weight_bytes(checkpoint.config, dtype.itemsize).by_owner()
    tower = checkpoint.hf_model.model.visual
    assert plan[VISION_OWNER] == sum(p.numel() for p in tower.parameters()) * dtype.itemsize
    rope_table = allocator.bytes_by_owner.pop(ROPE_TABLE)
    assert rope_table == rope_table_bytes(checkpoint.config, TEXT["max_position_embeddings"])
    assert dict(allocator.bytes_by_owner) == plan


def test_a_text_only_load_plans_and_loads_no_tower(checkpoint: VisionCheckpoint) -> None:
    config = text_only_config(checkpoint.config)
    allocator = RecordingAllocator()
    model = load_safetensors_model(
        checkpoint.path, config, LoadOptions(dtype=torch.float32, allocator=allocator)
    )
    assert isinstance(model, Qwen2_5_VLForCausalLM)
    assert model.model.visual is None
    plan = weight_bytes(config, 4).by_owner()
    assert VISION_OWNER not in plan
    del allocator.bytes_by_owner[ROPE_TABLE]
    assert dict(allocator.bytes_by_owner) == plan


@pytest.mark.parametrize("vision", [{}, VISION], ids=["default", "tiny"])
def test_the_tower_count_is_transformers(vision: dict[str, Any]) -> None:
    config = transformers.Qwen2_5_VLVisionConfig(**vision)
    with torch.device("meta"):
        tower = hf_modeling.Qwen2_5_VisionTransformerPretrainedModel(config)
    data = transformers.Qwen2_5_VLConfig(vision_config=vision).to_dict()
    parsed = model_config_from_hf_dict(data, source="test").vision
    assert parsed is not None
    assert qwen2_5_vl_vision_params(parsed) == sum(p.numel() for p in tower.parameters())


def test_the_checkpoints_processor_config_is_read(checkpoint: VisionCheckpoint) -> None:
    assert checkpoint.config.vision is not None
    saved = json.loads((checkpoint.path / "preprocessor_config.json").read_text())
    config = Qwen2VLImageProcessorConfig.from_json(saved, checkpoint.config.vision)
    assert (config.min_pixels, config.max_pixels, config.factor) == (64, 4096, 8)
