"""``config.json`` parsing: one module per family group, ``config`` dispatching on model_type."""

from metrale_config.hf.config import (
    CONFIG_FILE_NAME,
    model_config_from_hf_dict,
    model_config_from_hf_file,
    normalize_model_type,
)

__all__ = [
    "CONFIG_FILE_NAME",
    "model_config_from_hf_dict",
    "model_config_from_hf_file",
    "normalize_model_type",
]
