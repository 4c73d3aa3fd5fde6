"""Images over HTTP: a tiny random GLM-5.3 with its vision tower, served, answers image
questions through the ``openai`` and ``anthropic`` SDKs exactly as transformers' model generates
from the same ``pixel_values``; a repeated image is encoded once; bad images are 400s naming
the part, after which the server keeps serving with every KV block free; the encoder cache is
planned and allocated byte for byte."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from metrale_model_arch.families.glm5_next.vision.preprocess import preprocess_images
from metrale_model_arch.families.glm5_next.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.owners import ENCODER_CACHE, VISION
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.engine.prompt_image import place_images
from metrale_server.image_limits import ImageLimits
from metrale_server.memory.preflight import plan_engine_memory
from metrale_server.pooling.model_task import engine_model_config

from ..conftest import IMAGE_TOKEN

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MODEL = "tiny-glm5-vision"
NUM_TOKENS = 16


def random_image(height: int, width: int, seed: int, mode: str = "RGB") -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


def data_url(image: Image.Image, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    media = {"PNG": "image/png", "JPEG": "image/jpeg"}[fmt]
    return f"data:{media};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


IMAGES = {
    "photo": random_image(20, 28, seed=0),
    "tall": random_image(50, 13, seed=1, mode="RGBA"),
    "gray": random_image(9, 40, seed=2, mode="L"),
}


@pytest.fixture(scope="module")
def vision_dir(tiny_glm5_vision_dir: Path) -> Path:
    return tiny_glm5_vision_dir


@pytest.fixture(scope="module")
def server(
    vision_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> Iterator[Any]:
    # 8-token steps: a 16-token image is prefilled over two or three steps.
    args = EngineArgs(
        model=str(vision_dir), dtype="float32", device="cpu", max_seq_len=256,
        max_batch_size=4, max_batch_tokens=8, images_per_prompt=2,
    )  # fmt: skip
    with serve_engine(build_engine(args), MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def reference(vision_dir: Path) -> Any:
    return transformers.Glm5NextForConditionalGeneration.from_pretrained(vision_dir).eval()


def transformers_greedy(
    reference: Any, vision_dir: Path, token_ids: list[int], images: list[Image.Image], n: int
) -> list[int]:
    vision = engine_model_config(EngineArgs(model=str(vision_dir))).vision
    assert vision is not None
    inputs = preprocess_images(images, ImageProcessorConfig.from_directory(vision_dir, vision))
    with torch.no_grad():
        out = reference.generate(
            input_ids=torch.tensor([token_ids]),
            pixel_values=inputs.pixel_values,
            image_grid_thw=inputs.grid_thw,
            max_new_tokens=n,
            do_sample=False,
        )
    generated: list[int] = out[0, len(token_ids) :].tolist()
    return generated


def question(*names: str, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    parts = [image_part(data_url(IMAGES[name])) for name in names]
    return [{"role": "user", "content": [{"type": "text", "text": "Look: "}, *parts,
                                         {"type": "text", "text": text}]}]  # fmt: skip


@pytest.mark.parametrize("names", [("photo",), ("tall", "gray")])
def test_image_questions_are_answered_as_transformers_generates(
    server: Any, reference: Any, vision_dir: Path, names: tuple[str, ...]
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
    expected = transformers_greedy(reference, vision_dir, token_ids, images, NUM_TOKENS)
    tokenizer = server.state.engine.tokenizer
    assert completion.choices[0].message.content == tokenizer.decode(
        expected, skip_special_tokens=True
    )
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **greedy)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == completion.choices[0].message.content
    server.wait_idle()


def test_the_anthropic_sdk_gets_the_same_answer_from_an_image_block(server: Any) -> None:
    buffer = io.BytesIO()
    IMAGES["photo"].save(buffer, format="PNG")
    data = base64.b64encode(buffer.getvalue()).decode()
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused")
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "Look: "},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "What is in the picture?"},
    ]
    message = client.messages.create(
        model=MODEL,
        max_tokens=NUM_TOKENS,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        extra_body={"temperature": 0},  # the client sends sampling fields only through it
    )
    chat = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused").chat.completions
    twin = chat.create(
        model=MODEL, messages=question("photo"), max_tokens=NUM_TOKENS, temperature=0
    )
    assert message.content[0].text == twin.choices[0].message.content  # type: ignore[union-attr]
    assert message.usage.input_tokens == twin.usage.prompt_tokens
    counted = client.messages.count_tokens(
        model=MODEL,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
    )
    assert counted.input_tokens == twin.usage.prompt_tokens


def test_a_repeated_image_is_encoded_once(server: Any) -> None:
    image = random_image(24, 24, seed=7)
    encoded = server.metric("metrale_mm_images_encoded_total")
    hits = server.metric("metrale_mm_image_cache_hits_total")
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    first = [{"role": "user", "content": [image_part(data_url(image))]}]
    answer = server.client.post("/v1/chat/completions", json={**body, "messages": first})
    assert answer.status_code == 200, answer.text
    # The chat's next turn sends the same picture again: the same pixels, the same digest.
    second = [
        *first,
        {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]},
        {"role": "user", "content": [{"type": "text", "text": "And again?"}]},
    ]
    again = server.client.post("/v1/chat/completions", json={**body, "messages": second})
    assert again.status_code == 200, again.text
    assert server.metric("metrale_mm_images_encoded_total") == encoded + 1
    assert server.metric("metrale_mm_image_cache_hits_total") >= hits + 1
    server.wait_idle()


def too_many_pixels() -> str:
    return data_url(random_image(40, 40, seed=3))


BAD_IMAGES = {
    "not base64": ("data:image/png;base64,@@@@", "not valid base64"),
    "not a data URL": ("data:image/png,abc", "data:<media type>;base64"),
    "not an image": (
        f"data:image/png;base64,{base64.b64encode(b'hello').decode()}",
        "cannot be read",
    ),
    "a URL": ("https://example.com/cat.png", "--allow-image-urls"),
    "too many pixels": (too_many_pixels(), "--max-image-pixels"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_a_bad_image_is_a_400_naming_its_part_and_the_server_keeps_serving(
    server: Any, case: str
) -> None:
    url, words = BAD_IMAGES[case]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi "}, image_part(url)]}]
    with server.overridden(image_limits=ImageLimits(max_pixels=1000)):
        response = server.client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["param"] == "messages[0].content[1].image_url"
    server.wait_idle()
    assert greedy_ok(server)


def test_more_images_than_the_server_takes_are_refused_before_any_is_read(server: Any) -> None:
    # images_per_prompt is 2: the third part is named, and its bad bytes are never decoded.
    parts = [image_part(data_url(IMAGES["photo"]))] * 2 + [image_part("data:image/png;base64,@")]
    response = server.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 2},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "at most 2" in error["message"]
    assert error["param"] == "messages[0].content[2].image_url"
    assert greedy_ok(server)


def test_the_encoder_cache_and_the_tower_are_allocated_as_planned(server: Any) -> None:
    memory = server.client.get("/memory").json()
    for owner in (ENCODER_CACHE, VISION):
        assert memory["plan_by_owner"][owner] > 0
        assert memory["ledger_by_owner"][owner] == memory["plan_by_owner"][owner]
    # 16 image tokens (one image at most, more than the 8-token steps) of 64 float32 values.
    assert memory["plan_by_owner"][ENCODER_CACHE] == 16 * 64 * 4


def test_no_images_plans_and_loads_no_tower(vision_dir: Path) -> None:
    args = EngineArgs(model=str(vision_dir), dtype="float32", device="cpu", max_seq_len=256,
                      max_batch_size=4, images_per_prompt=0)  # fmt: skip
    config = engine_model_config(args)
    assert config.vision is None
    plan = plan_engine_memory(args, config, device=torch.device("cpu"), dtype=torch.float32)
    assert VISION not in plan.by_owner()
    assert ENCODER_CACHE not in plan.by_owner()


def test_a_text_only_model_refuses_image_parts(
    tiny_model_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> None:
    engine = build_engine(EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=2))
    with serve_engine(engine, "tiny") as text_only:
        response = text_only.client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": question("photo"), "max_tokens": 2},
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "messages[0].content[1].type"
        assert "vision tower" in error["message"]


def greedy_ok(server: Any) -> bool:
    response = server.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": question("gray"), "max_tokens": 2, "temperature": 0},
    )
    return bool(response.status_code == 200)


def test_the_responses_api_takes_an_input_image(server: Any) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    url = data_url(IMAGES["tall"])
    content: list[Any] = [
        {"type": "input_text", "text": "Look: "},
        {"type": "input_image", "image_url": url, "detail": "auto"},
        {"type": "input_text", "text": "What is in the picture?"},
    ]
    response = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": content}],
        max_output_tokens=NUM_TOKENS,
        temperature=0,
        store=False,
    )
    twin = client.chat.completions.create(
        model=MODEL, messages=question("tall"), max_tokens=NUM_TOKENS, temperature=0
    )
    assert response.output_text == twin.choices[0].message.content


def engine_outputs(vision_dir: Path, num_kv_blocks: int | None) -> tuple[list[list[int]], Any]:
    """Three image requests at once through an engine of ``num_kv_blocks`` KV blocks: each
    one's greedy tokens, and the engine (its stats)."""
    args = EngineArgs(
        model=str(vision_dir), dtype="float32", device="cpu", max_seq_len=128,
        max_batch_size=3, max_batch_tokens=8, num_kv_blocks=num_kv_blocks,
    )  # fmt: skip
    engine = build_engine(args)
    encoder = engine.core.runner.image_step.encoder  # type: ignore[union-attr]
    tokenizer = engine.core.loaded.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for index, names in enumerate([("photo",), ("tall", "gray"), ("photo", "tall")]):
        text = "".join(f"Look {IMAGE_TOKEN} " for _ in names) + "now."
        prompt = tokenizer.encode(text, add_special_tokens=False)
        images = [encoder.prepare(IMAGES[name]) for name in names]
        token_ids, placed = place_images(prompt, encoder.image_token_id, images)
        engine.add_request(str(index), token_ids, params, images=placed)
    finished: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
    return [finished[str(index)] for index in range(3)], engine


def test_preempted_image_requests_give_the_same_tokens(vision_dir: Path) -> None:
    roomy, _ = engine_outputs(vision_dir, num_kv_blocks=None)
    # Four 16-token blocks for three requests of three blocks each: they preempt each other,
    # and each recomputes its prompt, images included, when it runs again.
    tight, engine = engine_outputs(vision_dir, num_kv_blocks=4)
    assert engine.core.stats.num_preemptions > 0
    assert tight == roomy
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 serving ``/photo.png`` (IMAGES["photo"]), 404 elsewhere."""
    buffer = io.BytesIO()
    IMAGES["photo"].save(buffer, format="PNG")
    body = buffer.getvalue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/photo.png"
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=host.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{host.server_address[1]}"
    finally:
        host.shutdown()
        host.server_close()


def test_image_urls_are_fetched_only_when_allowed_and_within_the_limits(
    server: Any, image_host: str
) -> None:
    def ask(url: str) -> Any:
        parts = [{"type": "text", "text": "Look: "}, image_part(url)]
        parts.append({"type": "text", "text": "What is in the picture?"})
        messages = [{"role": "user", "content": parts}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
        return server.client.post("/v1/chat/completions", json=body)

    refused = ask(f"{image_host}/photo.png")
    assert refused.status_code == 400
    assert "--allow-image-urls" in refused.json()["error"]["message"]
    twin = ask(data_url(IMAGES["photo"]))
    with server.overridden(image_limits=ImageLimits(allow_urls=True)):
        fetched = ask(f"{image_host}/photo.png")
        missing = ask(f"{image_host}/missing.png")
    with server.overridden(image_limits=ImageLimits(allow_urls=True, max_bytes=100)):
        too_large = ask(f"{image_host}/photo.png")
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["choices"][0]["message"] == twin.json()["choices"][0]["message"]
    assert missing.status_code == 400
    assert "HTTP 404" in missing.json()["error"]["message"]
    assert too_large.status_code == 400
    assert "--max-image-bytes" in too_large.json()["error"]["message"]
    server.wait_idle()


def test_llm_generate_takes_multi_modal_data(vision_dir: Path, reference: Any) -> None:
    llm = LLM(str(vision_dir), dtype="float32", device="cpu", max_seq_len=256, max_batch_size=2)
    text = f"<|im_start|>user\nLook: {IMAGE_TOKEN} and {IMAGE_TOKEN}<|im_end|>\n"
    images = [IMAGES["tall"], IMAGES["gray"]]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    [output] = llm.generate({"prompt": text, "multi_modal_data": {"image": images}}, params)
    assert output.error is None
    token_ids = list(output.prompt_token_ids)
    assert len(token_ids) > len(llm.engine.loaded.tokenizer.encode(text))
    expected = transformers_greedy(reference, vision_dir, token_ids, images, NUM_TOKENS)
    assert list(output.outputs[0].token_ids) == expected
    with pytest.raises(ValueError, match=r"2 image placeholder\(s\) for 3 image"):
        llm.generate({"prompt": text, "multi_modal_data": {"image": images[:1] * 3}}, params)
