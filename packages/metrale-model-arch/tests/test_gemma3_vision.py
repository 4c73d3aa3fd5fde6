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
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from metrale_config import ModelConfig, model_config_from_hf_dict, model_config_from_hf_file
from metrale_model_arch import LoadOptions, text_only_config
from metrale_model_arch.counts.gemma3 import projector_params, siglip_tower_params
from metrale_model_arch.families.gemma3 import Gemma3ForConditionalGeneration
from metrale_model_arch.families.gemma3.vision import ImageInputs, prompt_embeds
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


@attrs.frozen(kw_only=True)
class Checkpoint:
    path: Path
    config: ModelConfig
    hf_model: Any
    images: list[Image.Image]


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


def random_image(height: int, width: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
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
    hf_model.save_pretrained(path)
    size = {"height": VISION["image_size"], "width": VISION["image_size"]}
    pil_processor.Gemma3ImageProcessorPil(size=size).save_pretrained(path)
    images = [random_image(h, w, seed) for seed, (h, w) in enumerate(IMAGE_SIZES)]
    return Checkpoint(
        path=path, config=model_config_from_hf_file(path), hf_model=hf_model, images=images
    )


def load(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, **options: Any) -> Any:
    options = {"dtype": dtype, "device": "cpu", "max_seq_len": MAX_SEQ_LEN, **options}
    model = load_safetensors_model(checkpoint.path, checkpoint.config, LoadOptions(**options))
    assert isinstance(model, Gemma3ForConditionalGeneration)
    return model


@attrs.frozen(kw_only=True)
class ImagePrompt:
    token_ids: list[int]
    images: ImageInputs


def image_prompts(checkpoint: Checkpoint) -> dict[int, ImagePrompt]:
    """Sequence 0: text, an image, text; sequence 1: text, an image, text, an image, text."""
    assert checkpoint.config.siglip_vision is not None
    processor = ImageProcessorConfig.from_directory(
        checkpoint.path, checkpoint.config.siglip_vision
    )
    generator = torch.Generator().manual_seed(1)

    def text(length: int) -> list[int]:
        return torch.randint(1, IMAGE, (length,), generator=generator).tolist()

    image = [BOI, *[IMAGE] * TOKENS_PER_IMAGE, EOI]
    layouts = {
        0: ([0], [*text(5), *image, *text(4)]),
        1: ([1, 2], [*text(3), *image, *text(2), *image, *text(5)]),
    }
    return {
        seq_id: ImagePrompt(
            token_ids=tokens,
            images=preprocess_images([checkpoint.images[i] for i in which], processor),
        )
        for seq_id, (which, tokens) in layouts.items()
    }


class WithPromptEmbeds(torch.nn.Module):
    """The model for :class:`PagedRunner`: the next step takes ``pending`` embeddings."""

    def __init__(self, model: Gemma3ForConditionalGeneration) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config
        self.pending: torch.Tensor | None = None

    def forward(self, *args: Any) -> torch.Tensor:
        embeds, self.pending = self.pending, None
        hidden: torch.Tensor = self.inner(*args, inputs_embeds=embeds)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.inner.compute_logits(hidden)


def prefill(
    model: Gemma3ForConditionalGeneration,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, ImagePrompt],
) -> tuple[Any, dict[int, torch.Tensor]]:
    """All prompts in one paged step, their embeddings from :func:`prompt_embeds`."""
    wrapped = WithPromptEmbeds(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=4)
    with torch.inference_mode():
        wrapped.pending = torch.cat(
            [prompt_embeds(model, torch.tensor(p.token_ids), p.images) for p in prompts.values()]
        )
    logits = run.step({seq_id: p.token_ids for seq_id, p in prompts.items()})
    return run, logits


def hf_inputs(prompt: ImagePrompt, *, bidirectional: bool = True) -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([prompt.token_ids])
    inputs = {"input_ids": input_ids, "pixel_values": prompt.images.pixel_values}
    if bidirectional:
        inputs["token_type_ids"] = (input_ids == IMAGE).long()
    return inputs


def hf_logits(checkpoint: Checkpoint, prompt: ImagePrompt, **options: bool) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = checkpoint.hf_model(**hf_inputs(prompt, **options)).logits[0]
    return logits


def test_the_config_has_one_sliding_and_one_global_layer(checkpoint: Checkpoint) -> None:
    config = checkpoint.config
    assert [str(kind) for kind in config.layer_types] == ["sliding_attention", "full_attention"]
    assert config.sliding_window == 6
    vision = config.siglip_vision
    assert vision is not None
    assert (vision.image_token_id, vision.boi_token_id, vision.eoi_token_id) == (IMAGE, BOI, EOI)
    assert (vision.patches_per_side, vision.pool_size) == (4, 2)


def test_the_pixel_values_are_transformers_processors(checkpoint: Checkpoint) -> None:
    processor = pil_processor.Gemma3ImageProcessorPil.from_pretrained(checkpoint.path)
    for prompt, which in zip(image_prompts(checkpoint).values(), ([0], [1, 2]), strict=True):
        reference = processor([checkpoint.images[i] for i in which], return_tensors="pt")
        torch.testing.assert_close(
            prompt.images.pixel_values, reference["pixel_values"], rtol=0, atol=0
        )


def test_the_tower_and_projector_match_transformers(checkpoint: Checkpoint) -> None:
    model = load(checkpoint)
    assert model.visual is not None
    pixel_values = image_prompts(checkpoint)[1].images.pixel_values
    with torch.inference_mode():
        ours = model.visual(pixel_values)
        theirs = checkpoint.hf_model.model.get_image_features(pixel_values).pooler_output
    assert ours.shape == (2, TOKENS_PER_IMAGE, TEXT["hidden_size"])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_image_prompts_match_transformers_logits(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    prompts = image_prompts(checkpoint)
    _, logits = prefill(load(checkpoint), paged_runner, prompts)
    for seq_id, prompt in prompts.items():
        torch.testing.assert_close(logits[seq_id], hf_logits(checkpoint, prompt), rtol=0, atol=1e-4)


def test_image_tokens_attend_to_their_whole_image(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
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
    _, ours = prefill(model, paged_runner, {0: prompt})
    torch.testing.assert_close(ours[0], causal, rtol=0, atol=1e-4)


def test_greedy_tokens_match_transformers_generate(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    prompts = image_prompts(checkpoint)
    run, logits = prefill(load(checkpoint), paged_runner, prompts)
    tokens = {seq_id: [int(out[-1].argmax())] for seq_id, out in logits.items()}
    for _ in range(NUM_GREEDY_TOKENS - 1):
        logits = run.step({seq_id: out[-1:] for seq_id, out in tokens.items()})
        for seq_id, out in tokens.items():
            out.append(int(logits[seq_id][-1].argmax()))
    for seq_id, prompt in prompts.items():
        with torch.inference_mode():
            generated = checkpoint.hf_model.generate(
                **hf_inputs(prompt),
                max_new_tokens=NUM_GREEDY_TOKENS,
                min_new_tokens=NUM_GREEDY_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        assert tokens[seq_id] == generated[0, len(prompt.token_ids) :].tolist(), seq_id


def test_a_decode_row_beside_an_image_prefill_matches_transformers(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """One step: sequence 0's next token (a decode row, on the masked path with the other's
    image prefill) and sequence 1's whole prompt."""
    model = load(checkpoint)
    prompts = image_prompts(checkpoint)
    first, second = prompts[0], prompts[1]
    wrapped = WithPromptEmbeds(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=4)
    with torch.inference_mode():
        wrapped.pending = prompt_embeds(model, torch.tensor(first.token_ids), first.images)
        token = int(run.step({0: first.token_ids})[0][-1].argmax())
        wrapped.pending = torch.cat(
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
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """A chunk ending right after the first image's ``<end_of_image>``, the second image in the
    next chunk, gives the one-shot logits."""
    model = load(checkpoint)
    prompt = image_prompts(checkpoint)[1]
    tokens = prompt.token_ids
    cut = tokens.index(EOI) + 1
    with torch.inference_mode():
        embeds = prompt_embeds(model, torch.tensor(tokens), prompt.images)
    wrapped = WithPromptEmbeds(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=4)
    chunks = []
    for start, stop in ((0, cut), (cut, len(tokens))):
        wrapped.pending = embeds[start:stop]
        chunks.append(run.step({0: tokens[start:stop]})[0])
    _, one_shot = prefill(model, paged_runner, {0: prompt})
    torch.testing.assert_close(torch.cat(chunks), one_shot[0], rtol=0, atol=1e-5)


def test_a_chunk_inside_an_image_is_refused(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
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


def test_prompts_the_images_do_not_fit_are_refused(checkpoint: Checkpoint) -> None:
    model = load(checkpoint)
    prompt = image_prompts(checkpoint)[0]
    ids = torch.tensor(prompt.token_ids)
    one_image_token_less = torch.cat([ids[:7], ids[8:]])
    with pytest.raises(ValueError, match="3 image tokens; its 1 image"):
        prompt_embeds(model, one_image_token_less, prompt.images)
    with pytest.raises(ValueError, match="but no images"):
        prompt_embeds(model, ids, None)


class RecordingAllocator:
    def __init__(self) -> None:
        self.bytes_by_owner: defaultdict[str, int] = defaultdict(int)

    def __call__(
        self, owner: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        self.bytes_by_owner[owner] += tensor.numel() * tensor.element_size()
        return tensor


def planned(config: ModelConfig, dtype: torch.dtype) -> dict[str, int]:
    """The plan's owners of weights and the RoPE table, each with its bytes (a tied head has
    none)."""
    weights = weight_bytes(config, dtype.itemsize).by_owner()
    plan = {**weights, ROPE_TABLE: rope_table_bytes(config, MAX_SEQ_LEN)}
    return {owner: size for owner, size in plan.items() if size}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_weight_plan_is_the_ledger_with_the_tower(
    checkpoint: Checkpoint, dtype: torch.dtype
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
    checkpoint: Checkpoint, layout: dict[str, str], tmp_path: Path
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


def test_text_only_loading_leaves_the_tower_out(checkpoint: Checkpoint) -> None:
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
