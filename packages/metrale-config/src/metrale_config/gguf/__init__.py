"""GGUF files: the header (metadata and tensor index) read from bytes, and its ``ModelConfig``."""

from metrale_config.gguf.config import model_config_from_gguf, model_config_from_gguf_header
from metrale_config.gguf.header import GgufHeader, GgufTensorInfo, read_gguf_header

__all__ = [
    "GgufHeader",
    "GgufTensorInfo",
    "model_config_from_gguf",
    "model_config_from_gguf_header",
    "read_gguf_header",
]
