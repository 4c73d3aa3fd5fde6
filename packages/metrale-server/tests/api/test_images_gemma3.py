"""Gemma 3's images served: a tiny random ``gemma3`` (a sliding and a global layer, a SigLIP
tower pooled to 4 tokens an image) answers image questions through the ``openai`` SDK exactly
as transformers' model generates from the same prompt, ``pixel_values`` and ``token_type_ids``.
The prompt text is expanded as transformers' processor does (each ``<start_of_image>`` becomes
``"\\n\\n<start_of_image>"``, the image tokens, ``"<end_of_image>\\n\\n"``), and each image is
prefilled within one step (its tokens attend to each other): with 8-token steps the scheduler
cuts chunks before an image instead of inside it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_model_arch import Tokenizer, sliding_window_ring
from metrale_model_arch.families.gemma3.vision.preprocess import preprocess_images
from metrale_model_arch.families.gemma3.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.owners import ENCODER_CACHE, SLIDING_WINDOW_KV, VISION
from metrale_server import EngineArgs, build_engine
from metrale_server.pooling.model_task import engine_model_config

from .test_images import data_url, image_part, random_image

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pil_processor = pytest.importorskip("transformers.models.gemma3.image_processing_pil_gemma3")

MODEL = "tiny-gemma3"
# SmolLM2's special tokens standing for Gemma 3's image, begin- and end-of-image tokens.
IMAGE, BOI, EOI = "<filename>", "<gh_stars>", "<issue_start>"
TOKENS_PER_IMAGE = 4
NUM_TOKENS = 16
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}"
    "{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'image' %}"
    + BOI
    + "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def token_id(tokenizer: Tokenizer, text: str) -> int:
    [single] = tokenizer.encode(text, add_special_tokens=False)
    return single


def save_tiny_gemma3(path: Path, tokenizer: Tokenizer) -> Path:
    text = {"vocab_size": tokenizer.vocab_size, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "sliding_window": 6, "sliding_window_pattern": 2,
            "query_pre_attn_scalar": 8, "max_position_embeddings": 256,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": 0}  # fmt: skip
    vision = {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
              "vision_use_head": False}  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        image_token_index=token_id(tokenizer, IMAGE),
        boi_token_index=token_id(tokenizer, BOI),
        eoi_token_index=token_id(tokenizer, EOI),
    )
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "vision_tower" in name and "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_((0.02 if "embed_tokens" in name else 0.3) * noise)
    model.save_pretrained(path)
    pil_processor.Gemma3ImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(path)
    tokenizer.save(path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


IMAGES = [random_image(20, 28, seed=0), random_image(50, 13, seed=1)]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return save_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3"), default_tokenizer)


@pytest.fixture(scope="module")
def server(
    gemma3_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> Iterator[Any]:
    args = EngineArgs(model=str(gemma3_dir), dtype="float32", device="cpu", max_seq_len=256,
                      max_batch_size=4, max_batch_tokens=8)  # fmt: skip
    with serve_engine(build_engine(args), MODEL) as running:
        yield running


def question(count: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "Look at this"}]
    for image in IMAGES[:count]:
        parts += [image_part(data_url(image)), {"type": "text", "text": "and"}]
    parts.append({"type": "text", "text": " what do you see?"})
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize("count", [1, 2])
def test_image_questions_are_answered_as_transformers_generates(
    server: Any, gemma3_dir: Path, count: int
) -> None:
    messages = question(count)
    tokenized = server.client.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert tokenized.status_code == 200, tokenized.text
    token_ids = tokenized.json()["tokens"]
    tokenizer = server.state.engine.tokenizer
    image_id = token_id(tokenizer, IMAGE)
    assert token_ids.count(image_id) == count * TOKENS_PER_IMAGE
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    greedy = {"max_tokens": NUM_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
    completion = client.chat.completions.create(model=MODEL, messages=messages, **greedy)
    assert completion.usage.prompt_tokens == len(token_ids)
    vision = engine_model_config(EngineArgs(model=str(gemma3_dir))).siglip_vision
    assert vision is not None
    processor = ImageProcessorConfig.from_directory(gemma3_dir, vision)
    pixel_values = preprocess_images(IMAGES[:count], processor).pixel_values
    reference = transformers.Gemma3ForConditionalGeneration.from_pretrained(gemma3_dir).eval()
    reference.generation_config.eos_token_id = None  # ignore_eos: never stop, never mask
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        out = reference.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=pixel_values,
            token_type_ids=(ids == image_id).long(),
            max_new_tokens=NUM_TOKENS,
            do_sample=False,
        )
    expected = out[0, len(token_ids) :].tolist()
    assert completion.choices[0].message.content == tokenizer.decode(
        expected, skip_special_tokens=True
    )
    server.wait_idle()


def test_the_tower_and_encoder_cache_are_allocated_as_planned(server: Any) -> None:
    memory = server.client.get("/memory").json()
    # And the sliding layer's K/V rings (6-token window, 8-token steps): image prompts ran
    # through them.
    for owner in (ENCODER_CACHE, VISION, SLIDING_WINDOW_KV):
        assert memory["plan_by_owner"][owner] > 0
        assert memory["ledger_by_owner"][owner] == memory["plan_by_owner"][owner]


def test_an_image_larger_than_a_step_is_refused(gemma3_dir: Path, serve_engine: Any) -> None:
    # An image's 4 tokens never fit in 3-token steps: refused, not left waiting for ever.
    args = EngineArgs(model=str(gemma3_dir), dtype="float32", device="cpu", max_seq_len=256,
                      max_batch_size=2, max_batch_tokens=3)  # fmt: skip
    with serve_engine(build_engine(args), MODEL) as small:
        response = small.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": question(1), "max_tokens": 2},
        )
    assert response.status_code == 400, response.text
    assert "--max-prefill-tokens" in response.json()["error"]["message"]


def test_an_image_larger_than_the_ring_step_is_refused(
    gemma3_dir: Path, serve_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The step (16 tokens) holds an image's 6 with its markers, but a ring sized for 5-token
    # steps caps each sequence's share below it: refused, not left waiting for ever.
    monkeypatch.setattr(sliding_window_ring, "ring_step_tokens", lambda window, step: 5)
    args = EngineArgs(model=str(gemma3_dir), dtype="float32", device="cpu", max_seq_len=256,
                      max_batch_size=2, max_batch_tokens=16)  # fmt: skip
    with serve_engine(build_engine(args), MODEL) as capped:
        memory = capped.client.get("/memory").json()
        assert memory["plan_by_owner"][SLIDING_WINDOW_KV] > 0
        refused = capped.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": question(1), "max_tokens": 2},
        )
        text = capped.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        )
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert "takes 6 tokens" in message
    assert "the 5 one sequence runs" in message
    assert "--sliding-window-cache full" in message
    assert text.status_code == 200, text.text
