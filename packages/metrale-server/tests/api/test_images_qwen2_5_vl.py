"""Qwen2.5-VL's images over HTTP: a tiny random Qwen2.5-VL with its windowed tower, served,
answers questions about one image and about two through the ``openai`` SDK exactly as
transformers' model generates from the same ``pixel_values``, at its M-RoPE positions: the
prompt's from the request, each later token at its index plus the prompt's delta. The steps are
8 tokens, so an image's 8 to 12 tokens are prefilled across chunks. A text-only request on the
same server, and text beside image requests in one batch (preempted too), match transformers as
well; the encoder cache and the tower are allocated as planned."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from PIL import Image

from metrale_model_arch import Tokenizer
from metrale_model_arch.families.qwen2_5_vl.vision.preprocess import preprocess_images
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.owners import ENCODER_CACHE, SLIDING_WINDOW_KV, VISION
from metrale_server import EngineArgs, SamplingParams, build_engine
from metrale_server.engine.prompt_image import place_images
from metrale_server.pooling.model_task import engine_model_config

from .test_images import data_url, image_part, random_image

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pil_processor = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

MODEL = "tiny-qwen2.5-vl"
# SmolLM2's special tokens standing for Qwen's image pad, vision start / end and video pad.
IMAGE_TOKEN, VISION_START, VISION_END, VIDEO_TOKEN = (
    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>"
)  # fmt: skip
NUM_TOKENS = 16
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}"
    "{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'image' %}"
    + VISION_START + IMAGE_TOKEN + VISION_END
    + "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)  # fmt: skip
# 4-pixel patches merged 2x2, at most 32x32 pixels: images of a few dozen pixels take 8 to 16
# image tokens; windows of 2x2 merged patches (block 0), the whole image (block 1).
PROCESSOR = {"patch_size": 4, "min_pixels": 64, "max_pixels": 32 * 32}
VISION_CONFIG = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48,
                 "out_hidden_size": 64, "patch_size": 4, "window_size": 16,
                 "fullatt_block_indexes": [1]}  # fmt: skip
IMAGES = {
    "photo": random_image(20, 28, seed=0),  # 16x32 pixels: 2x4 merged patches
    "tall": random_image(50, 13, seed=1, mode="RGBA"),  # 48x16: 6x2, its delta -6
}


def save_tiny_qwen2_5_vl(path: Path, tokenizer: Tokenizer, **text_fields: object) -> Path:
    def token_id(text: str) -> int:
        (found,) = tokenizer.encode(text, add_special_tokens=False)
        return int(found)

    text = {
        "vocab_size": tokenizer.vocab_size, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "mrope_section": [2, 3, 3]},
    } | text_fields  # fmt: skip
    config = transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=VISION_CONFIG,
        image_token_id=token_id(IMAGE_TOKEN),
        video_token_id=token_id(VIDEO_TOKEN),
        vision_start_token_id=token_id(VISION_START),
        vision_end_token_id=token_id(VISION_END),
    )
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            is_norm = "norm" in name or "ln_q" in name
            param.copy_(1.0 + 0.2 * noise if is_norm else 0.25 * noise)
    model.save_pretrained(path)
    pil_processor.Qwen2VLImageProcessorPil(**PROCESSOR).save_pretrained(path)
    tokenizer.save(path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return save_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2_5_vl"), default_tokenizer)


@pytest.fixture(scope="module")
def server(
    qwen_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> Iterator[Any]:
    args = EngineArgs(
        model=str(qwen_dir), dtype="float32", device="cpu", max_seq_len=256,
        max_batch_size=4, max_batch_tokens=8, images_per_prompt=2,
    )  # fmt: skip
    with serve_engine(build_engine(args), MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def reference(qwen_dir: Path) -> Any:
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(qwen_dir).eval()


def transformers_greedy(
    reference: Any, qwen_dir: Path, token_ids: list[int], images: list[Image.Image], n: int
) -> list[int]:
    input_ids = torch.tensor([token_ids])
    inputs: dict[str, Any] = {"input_ids": input_ids}
    if images:
        vision = engine_model_config(EngineArgs(model=str(qwen_dir))).vision
        assert vision is not None
        processor = Qwen2VLImageProcessorConfig.from_directory(qwen_dir, vision)
        pixels = preprocess_images(images, processor)
        is_image = input_ids == reference.config.image_token_id
        inputs |= {
            "pixel_values": pixels.pixel_values,
            "image_grid_thw": pixels.grid_thw,
            "mm_token_type_ids": is_image.to(torch.int32),
        }
    with torch.no_grad():
        out = reference.generate(
            **inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    generated: list[int] = out[0, len(token_ids) :].tolist()
    return generated


def question(*names: str, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    parts = [image_part(data_url(IMAGES[name])) for name in names]
    return [{"role": "user", "content": [{"type": "text", "text": "Look: "}, *parts,
                                         {"type": "text", "text": text}]}]  # fmt: skip


@pytest.mark.parametrize("names", [("tall",), ("photo", "tall"), ()], ids=["one", "two", "text"])
def test_questions_are_answered_as_transformers_generates(
    server: Any, reference: Any, qwen_dir: Path, names: tuple[str, ...]
) -> None:
    messages = question(*names)
    tokenized = server.client.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert tokenized.status_code == 200, tokenized.text
    token_ids = tokenized.json()["tokens"]
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    greedy = {"max_tokens": NUM_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
    completion = client.chat.completions.create(model=MODEL, messages=messages, **greedy)
    assert completion.usage.prompt_tokens == len(token_ids)
    assert completion.usage.completion_tokens == NUM_TOKENS
    images = [IMAGES[name] for name in names]
    expected = transformers_greedy(reference, qwen_dir, token_ids, images, NUM_TOKENS)
    assert len(set(expected)) >= 6, "a degenerate model proves little"
    tokenizer = server.state.engine.tokenizer
    assert completion.choices[0].message.content == tokenizer.decode(
        expected, skip_special_tokens=True
    )
    # Again, streamed: its prompt's first blocks come from the prefix cache, the prefill
    # starting inside the prompt at the stored positions.
    hits = server.metric("metrale_prefix_cache_hits_total")
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **greedy)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == completion.choices[0].message.content
    assert server.metric("metrale_prefix_cache_hits_total") >= hits + 16
    server.wait_idle()


def test_the_encoder_cache_and_the_tower_are_allocated_as_planned(server: Any) -> None:
    memory = server.client.get("/memory").json()
    for owner in (ENCODER_CACHE, VISION):
        assert memory["plan_by_owner"][owner] > 0
        assert memory["ledger_by_owner"][owner] == memory["plan_by_owner"][owner]
    # 16 image tokens (32x32 pixels at most, more than the 8-token steps) of 64 float32 values.
    assert memory["plan_by_owner"][ENCODER_CACHE] == 16 * 64 * 4


PROMPTS = (("photo", "tall"), (), ("tall",))


@attrs.frozen(kw_only=True, eq=False)
class Served:
    prompts: list[list[int]]
    outputs: list[list[int]]
    engine: Any
    encoder_batches: list[int]  # images per tower forward


def serve_at_once(qwen_dir: Path, num_kv_blocks: int | None, step_tokens: int = 24) -> Served:
    """A two-image request, a text request and an image request at once through an engine of
    ``num_kv_blocks`` KV blocks, 24-token steps: the first step prefills 24 of the first
    prompt's 30 tokens (both its images, the second cut short); the second holds the rest of
    it, the text prompt and most of the third, whose image is in the encoder cache."""
    args = EngineArgs(
        model=str(qwen_dir), dtype="float32", device="cpu", max_seq_len=128,
        max_batch_size=3, max_batch_tokens=step_tokens, num_kv_blocks=num_kv_blocks,
    )  # fmt: skip
    engine = build_engine(args)
    encoder = engine.core.runner.image_step.encoder  # type: ignore[union-attr]
    batches: list[int] = []
    encode = encoder.encode

    def counted(images: list[Any]) -> Any:
        batches.append(len(images))
        return encode(images)

    encoder.encode = counted
    tokenizer = engine.core.loaded.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    prompts: list[list[int]] = []
    for index, names in enumerate(PROMPTS):
        text = "".join(f"Look {VISION_START}{IMAGE_TOKEN}{VISION_END} " for _ in names) + "now."
        prompt = tokenizer.encode(text, add_special_tokens=False)
        images = [encoder.prepare(IMAGES[name]) for name in names]
        token_ids, placed = place_images(prompt, encoder.image_token_id, images)
        prompts.append(list(token_ids))
        engine.add_request(str(index), token_ids, params, images=placed)
    finished: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
    outputs = [finished[str(index)] for index in range(len(PROMPTS))]
    return Served(prompts=prompts, outputs=outputs, engine=engine, encoder_batches=batches)


def test_text_beside_images_in_one_batch_and_preempted_matches_transformers(
    qwen_dir: Path, reference: Any
) -> None:
    roomy = serve_at_once(qwen_dir, num_kv_blocks=None)
    assert [len(prompt) for prompt in roomy.prompts] == [30, 2, 18]
    assert roomy.encoder_batches == [2]
    for prompt, names, tokens in zip(roomy.prompts, PROMPTS, roomy.outputs, strict=True):
        images = [IMAGES[name] for name in names]
        assert tokens == transformers_greedy(reference, qwen_dir, prompt, images, NUM_TOKENS)
    # Four 16-token blocks for requests of three, two and three blocks: they preempt each
    # other, and each recomputes its prompt and outputs at their stored positions.
    tight = serve_at_once(qwen_dir, num_kv_blocks=4)
    assert tight.engine.core.stats.num_preemptions > 0
    assert tight.outputs == roomy.outputs
    assert tight.engine.block_manager.num_free_blocks == tight.engine.num_kv_blocks


def test_images_over_sliding_window_rings_match_transformers(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> None:
    # The second layer slides over 8 tokens; 8-token steps make its rings 32 tokens, which the
    # 18 to 46 token sequences wrap, images chunked across steps.
    windowed = save_tiny_qwen2_5_vl(
        tmp_path_factory.mktemp("windowed-qwen2_5_vl"), default_tokenizer,
        use_sliding_window=True, sliding_window=8, max_window_layers=1,
    )  # fmt: skip
    served = serve_at_once(windowed, num_kv_blocks=None, step_tokens=8)
    assert served.engine.ledger.live_bytes_by_owner()[SLIDING_WINDOW_KV] > 0
    reference = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(windowed).eval()
    config = transformers.AutoConfig.from_pretrained(windowed)
    config.text_config.sliding_window = 1000
    wide = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        windowed, config=config
    ).eval()
    slides = False
    for prompt, names, tokens in zip(served.prompts, PROMPTS, served.outputs, strict=True):
        images = [IMAGES[name] for name in names]
        assert tokens == transformers_greedy(reference, windowed, prompt, images, NUM_TOKENS)
        slides |= tokens != transformers_greedy(wide, windowed, prompt, images, NUM_TOKENS)
    assert slides, "transformers' model ignores the window: the check proves nothing"


REFUSED = {
    # Past the 200:1 aspect ratio Qwen2-VL's resizing takes.
    "2x500": (random_image(2, 500, seed=4), "aspect ratio"),
    # Resized to 8x384 pixels (a short side of one merged patch at least): 48 image tokens.
    "10x1500": (random_image(10, 1500, seed=5), "48 image tokens; the server planned for 16"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_image_its_preprocessing_refuses_is_a_400_naming_its_part(
    server: Any, case: str
) -> None:
    image, words = REFUSED[case]
    parts = [{"type": "text", "text": "Hi "}, image_part(data_url(image))]
    response = server.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 2},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["param"] == "messages[0].content[1].image_url"
    server.wait_idle()
    assert server.state.engine.stats.num_free_kv_blocks == server.state.engine.stats.num_kv_blocks
