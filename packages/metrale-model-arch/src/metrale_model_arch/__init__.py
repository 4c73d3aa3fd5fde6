"""Metrale architectures: torch model families over a paged KV cache, and their loaders."""

from metrale_model_arch.allocator import TensorAllocator, plain_allocator
from metrale_model_arch.build import CheckpointError, build_model
from metrale_model_arch.chat_template import ChatTemplate, ChatTemplateError
from metrale_model_arch.families import CausalLM, KvCache, LlamaForCausalLM
from metrale_model_arch.kv_cache import allocate_kv_cache, kv_cache_bytes_per_token
from metrale_model_arch.load import LoadedModel, load_model, read_model_config
from metrale_model_arch.loading.gguf_loader import load_gguf_model, read_gguf_weights
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.model_source import ModelNotFoundError, ModelSource, resolve_model
from metrale_model_arch.registry import SUPPORTED_MODEL_TYPES, UnsupportedModelError, family_for
from metrale_model_arch.tokenizer import Tokenizer, TokenizerError

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CausalLM",
    "ChatTemplate",
    "ChatTemplateError",
    "CheckpointError",
    "KvCache",
    "LlamaForCausalLM",
    "LoadedModel",
    "ModelNotFoundError",
    "ModelSource",
    "TensorAllocator",
    "Tokenizer",
    "TokenizerError",
    "UnsupportedModelError",
    "allocate_kv_cache",
    "build_model",
    "family_for",
    "kv_cache_bytes_per_token",
    "load_gguf_model",
    "load_model",
    "load_safetensors_model",
    "plain_allocator",
    "read_gguf_weights",
    "read_model_config",
    "resolve_model",
]
