"""Metrale model configs and environment levers."""

from metrale_config.errors import ConfigError, UndeclaredLeverError
from metrale_config.fp8_quantization import Fp8Granularity, Fp8Method, Fp8Quantization
from metrale_config.gguf import (
    GgufHeader,
    GgufTensorInfo,
    model_config_from_gguf,
    model_config_from_gguf_header,
    model_config_with_mmproj,
    read_gguf_header,
)
from metrale_config.hf import (
    model_config_from_hf_dict,
    model_config_from_hf_file,
    normalize_model_type,
)
from metrale_config.int4_quantization import Int4Method, Int4Quantization
from metrale_config.layer_types import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
    SPARSE_ATTENTION,
    LayerType,
)
from metrale_config.levers import (
    LEVERS,
    Lever,
    check_environment,
    read_bool_lever,
    read_int_lever,
    read_lever,
    read_str_lever,
)
from metrale_config.model_config import (
    DsaConfig,
    LinearAttentionConfig,
    MhcConfig,
    MlaConfig,
    ModelConfig,
    MoeConfig,
    MtpConfig,
    NormLayout,
    VisionConfig,
)
from metrale_config.rope import RopeScaling
from metrale_config.siglip_vision import SiglipVisionConfig

__all__ = [
    "FULL_ATTENTION",
    "LEVERS",
    "LINEAR_ATTENTION",
    "SLIDING_ATTENTION",
    "SPARSE_ATTENTION",
    "ConfigError",
    "DsaConfig",
    "Fp8Granularity",
    "Fp8Method",
    "Fp8Quantization",
    "GgufHeader",
    "GgufTensorInfo",
    "Int4Method",
    "Int4Quantization",
    "LayerType",
    "Lever",
    "LinearAttentionConfig",
    "MhcConfig",
    "MlaConfig",
    "ModelConfig",
    "MoeConfig",
    "MtpConfig",
    "NormLayout",
    "RopeScaling",
    "SiglipVisionConfig",
    "UndeclaredLeverError",
    "VisionConfig",
    "check_environment",
    "model_config_from_gguf",
    "model_config_from_gguf_header",
    "model_config_from_hf_dict",
    "model_config_from_hf_file",
    "model_config_with_mmproj",
    "normalize_model_type",
    "read_bool_lever",
    "read_gguf_header",
    "read_int_lever",
    "read_lever",
    "read_str_lever",
]
