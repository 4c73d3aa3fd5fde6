"""GGUF files: the header (metadata and tensor index) read from bytes, and its ``ModelConfig``
(with an mmproj's tower beside a text model)."""

from metrale_config.gguf.config import model_config_from_gguf, model_config_from_gguf_header
from metrale_config.gguf.header import GgufHeader, GgufTensorInfo, read_gguf_header
from metrale_config.gguf.mmproj import model_config_with_mmproj

__all__ = [
    "GgufHeader",
    "GgufTensorInfo",
    "model_config_from_gguf",
    "model_config_from_gguf_header",
    "model_config_with_mmproj",
    "read_gguf_header",
]
