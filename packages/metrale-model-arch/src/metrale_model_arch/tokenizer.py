"""``Tokenizer``: text to token ids and back, built from ``tokenizer.json`` or GGUF metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import attrs
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

# llama.cpp ``tokenizer.ggml.token_type`` values.
_CONTROL_TOKEN = 3
_USER_DEFINED_TOKEN = 4

_GPT2_SPLIT = "gpt2"
_DIGITS_THEN_GPT2_SPLIT = "digits+gpt2"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ``tokenizer.ggml.pre`` -> how text is split before BPE, as llama.cpp splits it for that name.
_GGUF_PRE_TOKENIZER_SPLITS: dict[str, str] = {
    "default": _GPT2_SPLIT,
    "gpt-2": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    "phi-2": _GPT2_SPLIT,
    "mpt": _GPT2_SPLIT,
    "olmo": _GPT2_SPLIT,
    "smollm": _DIGITS_THEN_GPT2_SPLIT,
    "starcoder": _DIGITS_THEN_GPT2_SPLIT,
    "refact": _DIGITS_THEN_GPT2_SPLIT,
    "command-r": _DIGITS_THEN_GPT2_SPLIT,
    "codeshell": _DIGITS_THEN_GPT2_SPLIT,
    "exaone": _DIGITS_THEN_GPT2_SPLIT,
    "minerva-7b": _DIGITS_THEN_GPT2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "stablelm2": _QWEN2_SPLIT,
}

SUPPORTED_GGUF_PRE_TOKENIZERS = tuple(sorted(_GGUF_PRE_TOKENIZER_SPLITS))


class TokenizerError(ValueError):
    """A tokenizer that cannot be built from the files or metadata given."""


@attrs.frozen(kw_only=True, eq=False)
class Tokenizer:
    """Encodes text to token ids and decodes ids to text.

    ``backend`` is a ``tokenizers.Tokenizer`` whose post-processor decides what
    ``encode(..., add_special_tokens=True)`` adds (``add_bos_token`` reports it). Special token
    strings are ``None`` when the model has no such token. ``eos_token_ids`` lists every id that
    ends generation, the ``eos_token``'s first.
    """

    backend: tokenizers.Tokenizer = attrs.field(repr=False)
    bos_token: str | None = None
    eos_token: str | None = None
    unk_token: str | None = None
    pad_token: str | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """Reads ``tokenizer.json``; special tokens from ``tokenizer_config.json``,
        ``special_tokens_map.json`` and ``generation_config.json`` when present."""
        model_dir = Path(model_dir)
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"{model_dir}: no tokenizer.json")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as error:
            raise TokenizerError(f"{tokenizer_file}: cannot be read: {error}") from error
        declared: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            declared.update(_read_json_object(model_dir / name))
        generation = _read_json_object(model_dir / "generation_config.json")

        special = {
            key: _token_content(declared.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        if special["bos_token"] is None and isinstance(generation.get("bos_token_id"), int):
            special["bos_token"] = backend.id_to_token(generation["bos_token_id"])
        extra_eos_ids = _as_int_tuple(generation.get("eos_token_id"))
        if special["eos_token"] is None and extra_eos_ids:
            special["eos_token"] = backend.id_to_token(extra_eos_ids[0])
        return cls._with_eos_ids(backend, special, extra_eos_ids)

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """Builds the tokenizer a GGUF file describes from its ``tokenizer.ggml.*`` metadata.

        ``fields`` maps GGUF keys to plain values (arrays as sequences). Supports byte-level BPE
        (``tokenizer.ggml.model == "gpt2"``) with the pre-tokenizers in
        ``SUPPORTED_GGUF_PRE_TOKENIZERS``; anything else raises ``TokenizerError``.
        """
        tokenizer_model = fields.get("tokenizer.ggml.model")
        if tokenizer_model != "gpt2":
            raise TokenizerError(
                f"GGUF tokenizer model {tokenizer_model!r} is not supported "
                "(supported: 'gpt2', byte-level BPE)"
            )
        tokens = [str(token) for token in _required(fields, "tokenizer.ggml.tokens")]
        merges = [str(merge) for merge in _required(fields, "tokenizer.ggml.merges")]
        token_types = [int(kind) for kind in fields.get("tokenizer.ggml.token_type", ())]
        backend = _byte_level_bpe(tokens, merges, token_types)
        backend.pre_tokenizer = _gguf_pre_tokenizer(fields.get("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()

        def token_for(key: str) -> str | None:
            token_id = fields.get(f"tokenizer.ggml.{key}")
            return None if token_id is None else tokens[int(token_id)]

        special = {
            "bos_token": token_for("bos_token_id"),
            "eos_token": token_for("eos_token_id"),
            "unk_token": token_for("unknown_token_id"),
            "pad_token": token_for("padding_token_id"),
        }
        backend.post_processor = _bos_eos_processor(
            bos_token=special["bos_token"] if fields.get("tokenizer.ggml.add_bos_token") else None,
            eos_token=special["eos_token"] if fields.get("tokenizer.ggml.add_eos_token") else None,
            backend=backend,
        )
        extra_eos_ids = tuple(
            int(fields[f"tokenizer.ggml.{key}"])
            for key in ("eot_token_id", "eom_token_id")
            if fields.get(f"tokenizer.ggml.{key}") is not None
        )
        return cls._with_eos_ids(backend, special, extra_eos_ids)

    @classmethod
    def _with_eos_ids(
        cls,
        backend: tokenizers.Tokenizer,
        special: dict[str, str | None],
        extra_eos_ids: tuple[int, ...],
    ) -> Tokenizer:
        eos_token = special["eos_token"]
        eos_id = None if eos_token is None else backend.token_to_id(eos_token)
        eos_ids = tuple(
            dict.fromkeys(([eos_id] if eos_id is not None else []) + list(extra_eos_ids))
        )
        return cls(backend=backend, eos_token_ids=eos_ids, **special)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self.token_to_id(self.pad_token)

    @property
    def unk_token_id(self) -> int | None:
        return self.token_to_id(self.unk_token)

    @property
    def add_bos_token(self) -> bool:
        """Whether ``encode(..., add_special_tokens=True)`` starts with the BOS id."""
        bos_id = self.bos_token_id
        return bos_id is not None and self.encode("", add_special_tokens=True)[:1] == [bos_id]

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``bos_token``/``eos_token``/``unk_token``/``pad_token`` that exist, by name (the
        variables a chat template sees)."""
        named = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "unk_token": self.unk_token,
            "pad_token": self.pad_token,
        }
        return {name: token for name, token in named.items() if token is not None}

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special (those ``skip_special_tokens`` drops)."""
        return frozenset(
            token_id
            for token_id, added in self.backend.get_added_tokens_decoder().items()
            if added.special
        )

    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes of text one token stands for, at most (its vocabulary spelling
        in UTF-8, which is never shorter): a text of ``b`` bytes is at least
        ``b / max_token_bytes()`` tokens. One pass over the vocabulary."""
        vocab = self.backend.get_vocab(with_added_tokens=True)
        return max((len(token.encode()) for token in vocab), default=1)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        token_id = self.backend.token_to_id(token)
        return None if token_id is None else int(token_id)

    def id_to_token(self, token_id: int) -> str | None:
        token = self.backend.id_to_token(token_id)
        return None if token is None else str(token)

    def save(self, model_dir: str | Path) -> None:
        """Writes ``tokenizer.json`` and ``tokenizer_config.json`` that ``from_dir`` reads back."""
        model_dir = Path(model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(model_dir / "tokenizer.json"))
        config = {**self.special_tokens_map, "add_bos_token": self.add_bos_token}
        (model_dir / "tokenizer_config.json").write_text(
            json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8"
        )
        if self.eos_token_ids:
            generation = {"eos_token_id": list(self.eos_token_ids)}
            (model_dir / "generation_config.json").write_text(
                json.dumps(generation, indent=2), encoding="utf-8"
            )


def _byte_level_bpe(
    tokens: list[str], merges: list[str], token_types: list[int]
) -> tokenizers.Tokenizer:
    spelling = _byte_spelling()
    alphabet = frozenset(spelling.values())
    # Tokens are stored in the byte alphabet; a few files store a plain-text spelling instead.
    vocab = {
        token if set(token) <= alphabet else _respell(token, spelling): token_id
        for token_id, token in enumerate(tokens)
    }
    merge_pairs = [_split_merge(merge) for merge in merges]
    backend = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False)
    )
    typed = list(zip(tokens, token_types, strict=False))
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel; adding it
    # would grow the vocabulary past what the model was trained with.
    control = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in typed
        if kind == _CONTROL_TOKEN and set(token) <= alphabet
    ]
    user_defined = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in typed
        if kind == _USER_DEFINED_TOKEN and token in vocab
    ]
    if control:
        backend.add_special_tokens(control)
    if user_defined:
        backend.add_tokens(user_defined)
    return backend


def _gguf_pre_tokenizer(pre: object) -> pre_tokenizers.PreTokenizer:
    name = "default" if pre is None else str(pre)
    split = _GGUF_PRE_TOKENIZER_SPLITS.get(name)
    if split is None:
        raise TokenizerError(
            f"GGUF pre-tokenizer {name!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_GGUF_PRE_TOKENIZERS)})"
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split == _GPT2_SPLIT)
    if split == _GPT2_SPLIT:
        return byte_level
    if split == _DIGITS_THEN_GPT2_SPLIT:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
    )


def _bos_eos_processor(
    *, bos_token: str | None, eos_token: str | None, backend: tokenizers.Tokenizer
) -> processors.PostProcessor | None:
    if bos_token is None and eos_token is None:
        return None
    prefix = [] if bos_token is None else [bos_token]
    suffix = [] if eos_token is None else [eos_token]
    used = dict.fromkeys(prefix + suffix)
    return processors.TemplateProcessing(
        single=[*prefix, "$A", *suffix],
        pair=[*prefix, "$A", *suffix, *prefix, "$B:1", *suffix],
        special_tokens=[(token, backend.token_to_id(token)) for token in used],
    )


@cache
def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes as themselves, the rest shifted
    past U+0100 in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    spelling = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in spelling)
    for offset, byte in enumerate(shifted):
        spelling[byte] = chr(256 + offset)
    return dict(sorted(spelling.items()))


def _respell(token: str, spelling: dict[int, str]) -> str:
    return "".join(spelling[byte] for byte in token.encode("utf-8"))


def _split_merge(merge: str) -> tuple[str, str]:
    left, separator, right = merge.partition(" ")
    if not separator:
        raise TokenizerError(f"GGUF merge {merge!r} is not two tokens separated by a space")
    return left, right


def _required(fields: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = fields.get(key)
    if value is None:
        raise TokenizerError(f"GGUF metadata has no {key}")
    return value  # type: ignore[no-any-return]


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TokenizerError(f"{path}: cannot be read: {error}") from error
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return value


def _token_content(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else None


def _as_int_tuple(value: object) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(item for item in value if isinstance(item, int) and not isinstance(item, bool))
    return ()
