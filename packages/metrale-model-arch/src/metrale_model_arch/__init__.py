"""Metrale architectures: torch model families over a paged KV cache, and their loaders."""

from metrale_model_arch.allocator import TensorAllocator, plain_allocator
from metrale_model_arch.architecture import Architecture
from metrale_model_arch.build import build_model
from metrale_model_arch.cache_spec import LayerCacheSpec
from metrale_model_arch.chat_template import ChatTemplate, ChatTemplateError
from metrale_model_arch.families import CausalLM, KvCache, LayerCache, LlamaForCausalLM
from metrale_model_arch.image_encoder import (
    image_encoder_for,
    planned_tokens_per_image,
    serves_images,
)
from metrale_model_arch.kv_cache import (
    KvCachePool,
    StateSlots,
    allocate_kv_cache,
    allocate_state_slots,
    kv_cache_bytes_per_token,
)
from metrale_model_arch.kv_cache_dtype import KV_CACHE_DTYPE_NAMES, KvCacheDtype
from metrale_model_arch.load import (
    LoadedModel,
    headless_config,
    load_model,
    mtp_free_config,
    read_model_config,
    text_only_config,
)
from metrale_model_arch.load_options import LoadOptions
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.gguf_loader import load_gguf_model, read_gguf_weights
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.model_source import ModelNotFoundError, ModelSource, resolve_model
from metrale_model_arch.prepared_image import ImageEncoder, PreparedImage
from metrale_model_arch.prompt_positions import PromptPositions
from metrale_model_arch.registry import (
    ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    UnsupportedModelError,
    architecture_for,
    cache_specs,
    family_for,
    planned_architecture,
)
from metrale_model_arch.tokenizer import Tokenizer, TokenizerError
from metrale_model_arch.weight_format import QUANTIZATION_NAMES, Quantization

__all__ = [
    "ARCHITECTURES",
    "KV_CACHE_DTYPE_NAMES",
    "QUANTIZATION_NAMES",
    "SUPPORTED_MODEL_TYPES",
    "Architecture",
    "CausalLM",
    "ChatTemplate",
    "ChatTemplateError",
    "CheckpointError",
    "ImageEncoder",
    "KvCache",
    "KvCacheDtype",
    "KvCachePool",
    "LayerCache",
    "LayerCacheSpec",
    "LlamaForCausalLM",
    "LoadOptions",
    "LoadedModel",
    "ModelNotFoundError",
    "ModelSource",
    "PreparedImage",
    "PromptPositions",
    "Quantization",
    "StateSlots",
    "TensorAllocator",
    "Tokenizer",
    "TokenizerError",
    "UnsupportedModelError",
    "allocate_kv_cache",
    "allocate_state_slots",
    "architecture_for",
    "build_model",
    "cache_specs",
    "family_for",
    "headless_config",
    "image_encoder_for",
    "kv_cache_bytes_per_token",
    "load_gguf_model",
    "load_model",
    "load_safetensors_model",
    "mtp_free_config",
    "plain_allocator",
    "planned_architecture",
    "planned_tokens_per_image",
    "read_gguf_weights",
    "read_model_config",
    "resolve_model",
    "serves_images",
    "text_only_config",
]
