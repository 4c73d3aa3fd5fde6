"""Torch model families, one module each; :mod:`metrale_model_arch.registry` maps model types."""

from metrale_model_arch.families.base import CausalLM, KvCache, LayerCache
from metrale_model_arch.families.llama import LlamaForCausalLM

__all__ = ["CausalLM", "KvCache", "LayerCache", "LlamaForCausalLM"]
