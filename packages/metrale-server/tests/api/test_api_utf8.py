"""A reply full of emoji and CJK, split across byte-level tokens, streams without a broken
character in any chunk.

The model is built to say it: a Llama whose layers add nothing (zero output projections), so
the next token depends on the current one only, and whose ``lm_head`` maps each token of the
reply to the next. Greedy decoding then spells the reply token by token, characters split
across tokens included.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from metrale_model_arch import Tokenizer
from metrale_server import EngineArgs, build_engine

CANDIDATES = "你好世界中文字符测试漢字語言日本語한국어😀🙂🎉🚀🌍🔥💡🍣🐍✨🧠🌸🎵🦄🥟🧩🪐🫖"


def reply_tokens(tokenizer: Tokenizer, avoid: set[int]) -> tuple[str, list[int]]:
    """Characters whose tokens are all distinct (so "next token" is a function), and their ids."""
    used = set(avoid)
    text, ids = "", []
    for char in CANDIDATES:
        char_ids = tokenizer.encode(char, add_special_tokens=False)
        if used.isdisjoint(char_ids) and len(set(char_ids)) == len(char_ids):
            used.update(char_ids)
            text += char
            ids += char_ids
    return text, ids


@pytest.fixture(scope="module")
def chain_model(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> tuple[Path, str, list[int], list[int]]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    chat_prompt = default_tokenizer.encode(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    start_id = chat_prompt[-1]
    text, ids = reply_tokens(default_tokenizer, {start_id})
    config = transformers.LlamaConfig(
        vocab_size=default_tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        model.lm_head.weight.zero_()
        chain = [start_id, *ids]
        for current, following in itertools.pairwise(chain):
            model.lm_head.weight[following] = 50 * embeddings[current] / embeddings[current].norm()
    path = tmp_path_factory.mktemp("chain-llama")
    model.save_pretrained(path, safe_serialization=True)
    default_tokenizer.save(path)
    return path, text, ids, chat_prompt


@pytest.fixture(scope="module")
def chain_server(
    chain_model: tuple[Path, str, list[int], list[int]],
    serve_engine: Callable[..., AbstractContextManager[Any]],
) -> Iterator[Any]:
    engine = build_engine(EngineArgs(model=str(chain_model[0]), dtype="float32", max_batch_size=4))
    with serve_engine(engine, "chain") as running:
        yield running


def check_chunks(raw: bytes, texts: list[str]) -> None:
    for frame in raw.split(b"\n\n"):
        frame.decode("utf-8", errors="strict")
    for text in texts:
        assert "\ufffd" not in text
        for char in text:
            assert not 0xD800 <= ord(char) <= 0xDFFF


def test_the_reply_splits_characters_across_tokens(
    chain_model: tuple[Path, str, list[int], list[int]], default_tokenizer: Tokenizer
) -> None:
    _, text, ids, _ = chain_model
    assert len(text) >= 15
    pieces = [default_tokenizer.decode([i]) for i in ids]
    assert sum("\ufffd" in piece for piece in pieces) >= 10
    assert default_tokenizer.decode(ids) == text


def test_completion_stream_never_breaks_a_character(
    chain_server: Any, chain_model: tuple[Path, str, list[int], list[int]]
) -> None:
    _, text, ids, chat_prompt = chain_model
    body = {
        "prompt": chat_prompt[-1:],
        "max_tokens": len(ids),
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    response = chain_server.client.post("/v1/completions", json=body)
    chunks = chain_server.parse_sse(response.content)
    texts = [c["choices"][0]["text"] for c in chunks]
    check_chunks(response.content, texts)
    assert "".join(texts) == text
    assert len([t for t in texts if t]) < len(ids)  # partial characters were held back


def test_chat_stream_never_breaks_a_character(
    chain_server: Any, chain_model: tuple[Path, str, list[int], list[int]]
) -> None:
    _, text, ids, _ = chain_model
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": len(ids),
        "temperature": 0,
        "ignore_eos": True,
    }
    whole = chain_server.client.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["message"]["content"] == text
    response = chain_server.client.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = chain_server.parse_sse(response.content)
    texts = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    check_chunks(response.content, texts)
    assert "".join(texts) == text
