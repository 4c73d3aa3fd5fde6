"""``load_model``: a model name -> weights, tokenizer and chat template, ready to run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from metrale_config import (
    ModelConfig,
    model_config_from_gguf_header,
    model_config_from_hf_file,
    model_config_with_mmproj,
    read_gguf_header,
)
from metrale_model_arch.chat_template import ChatTemplate
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.load_options import DEFAULT_LOAD_OPTIONS, LoadOptions
from metrale_model_arch.loading.gguf_loader import load_gguf_model
from metrale_model_arch.loading.mmproj_loader import load_gguf_model_with_mmproj
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.model_source import ModelSource, resolve_model
from metrale_model_arch.parallel.shard import TensorShard, shard_config
from metrale_model_arch.tokenizer import Tokenizer
from metrale_model_arch.weight_format import Quantization

# The Rust engine's fallback when a model ships no template of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@attrs.frozen(kw_only=True, eq=False)
class LoadedModel:
    """Everything needed to turn text into tokens, run the model and turn tokens back into text."""

    source: ModelSource
    config: ModelConfig
    model: CausalLM = attrs.field(repr=False)
    tokenizer: Tokenizer = attrs.field(repr=False)
    chat_template: ChatTemplate
    dtype: torch.dtype
    device: torch.device
    quantization: Quantization = Quantization.NONE
    # This rank's part of a model split across ranks; ``None``: the whole model.
    shard: TensorShard | None = None

    @property
    def rank_config(self) -> ModelConfig:
        """The config of the part this process holds (what its KV cache and arena are sized
        by); ``config`` is the whole model's."""
        return (
            self.config if self.shard is None else shard_config(self.config, self.shard.world_size)
        )

    @property
    def max_seq_len(self) -> int:
        return self.model.max_seq_len

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the tokenizer's, then any more the config names."""
        ids = list(self.tokenizer.eos_token_ids)
        ids += [i for i in self.config.eos_token_ids if i not in ids]
        return tuple(ids)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages``; ``tools`` and ``template_kwargs`` (such as
        ``enable_thinking``) are variables of the template, as transformers passes them."""
        return self.chat_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **(template_kwargs or {}),
        )


def read_model_config(
    source: ModelSource,
    *,
    without_head: bool = False,
    text_only: bool = False,
    without_mtp: bool = False,
) -> ModelConfig:
    """The config of ``source`` alone (config.json, or the GGUF header with its mmproj's); no
    weights are read.
    ``without_head`` / ``text_only`` / ``without_mtp``: as :func:`load_model` builds it
    without its own head / its vision tower / its MTP layers."""
    if source.kind == "gguf":
        header = read_gguf_header(source.path)
        config = model_config_from_gguf_header(header)
        if source.mmproj is not None and not text_only:
            config = model_config_with_mmproj(config, header, read_gguf_header(source.mmproj))
        return config
    config = model_config_from_hf_file(source.path)
    if text_only:
        config = text_only_config(config)
    if without_mtp:
        config = mtp_free_config(config)
    return headless_config(config) if without_head else config


def headless_config(config: ModelConfig) -> ModelConfig:
    """``config`` for a model whose logits are never computed (an embedding model): its head
    is the embeddings' matrix (tied), so no head of its own is planned, allocated or loaded,
    and a checkpoint saved without one (a base model) loads."""
    return attrs.evolve(config, tie_word_embeddings=True)


def text_only_config(config: ModelConfig) -> ModelConfig:
    """``config`` without its vision tower: none is planned, allocated or loaded (a server that
    takes no images does not pay for one)."""
    return attrs.evolve(config, vision=None, siglip_vision=None)


def mtp_free_config(config: ModelConfig) -> ModelConfig:
    """``config`` without its multi-token-prediction layers: none is planned, allocated or
    loaded (a server that does not speculate with them does not pay for them)."""
    return attrs.evolve(config, mtp=None)


def load_model(
    name: str | None = None,
    options: LoadOptions = DEFAULT_LOAD_OPTIONS,
    *,
    chat_template: ChatTemplate | None = None,
) -> LoadedModel:
    """Resolve ``name`` (``None``: the default model) and load it as ``options`` say
    (:class:`~metrale_model_arch.LoadOptions`); nothing is downloaded.

    ``chat_template`` replaces the model's own; without either, ChatML is used.
    """
    source = resolve_model(name)
    if source.kind == "gguf":
        header = read_gguf_header(source.path)
        config = read_model_config(source, text_only=options.text_only)
        if config.vision is None and config.siglip_vision is None:
            model = load_gguf_model(header, options)
        else:
            assert source.mmproj is not None
            model = load_gguf_model_with_mmproj(header, read_gguf_header(source.mmproj), options)
        tokenizer = Tokenizer.from_gguf_fields(header.fields)
        own_template = ChatTemplate.from_gguf_fields(
            header.fields, special_tokens=tokenizer.special_tokens_map
        )
    else:
        config = read_model_config(
            source,
            without_head=options.without_head,
            text_only=options.text_only,
            without_mtp=options.without_mtp,
        )
        model = load_safetensors_model(source.path, config, options)
        tokenizer = Tokenizer.from_dir(source.path)
        own_template = ChatTemplate.from_dir(
            source.path, special_tokens=tokenizer.special_tokens_map
        )
    template = (
        chat_template
        or own_template
        or ChatTemplate(
            source=CHATML_TEMPLATE,
            origin="built-in ChatML",
            special_tokens=tokenizer.special_tokens_map,
        )
    )
    return LoadedModel(
        source=source,
        config=config,
        model=model,
        tokenizer=tokenizer,
        chat_template=template,
        dtype=options.dtype,
        device=options.device,
        quantization=options.quantization,
        shard=options.shard,
    )
