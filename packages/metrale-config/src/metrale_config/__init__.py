"""Metrale model configs and environment levers."""

from metrale_config.errors import ConfigError, UndeclaredLeverError
from metrale_config.model_config import (
    DsaConfig,
    LinearAttentionConfig,
    MlaConfig,
    ModelConfig,
    MoeConfig,
    MtpConfig,
)
from metrale_config.rope import RopeScaling

__all__ = [
    "ConfigError",
    "DsaConfig",
    "LinearAttentionConfig",
    "MlaConfig",
    "ModelConfig",
    "MoeConfig",
    "MtpConfig",
    "RopeScaling",
    "UndeclaredLeverError",
]
