"""build_model: projections stored column-major on CPU, embeddings untouched."""

from __future__ import annotations

import attrs
import pytest
import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import BackendUnavailableError
from metrale_model_arch import LlamaForCausalLM, LoadOptions, build_model


def test_cpu_projections_are_column_major_views_with_the_same_values(
    tiny_config: ModelConfig,
) -> None:
    untied = attrs.evolve(tiny_config, tie_word_embeddings=False)
    torch.manual_seed(0)
    weights = LlamaForCausalLM(untied).state_dict()
    model = build_model(untied, weights.items(), LoadOptions(dtype=torch.float32, device="cpu"))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears
    for name, param in model.named_parameters():
        assert torch.equal(param, weights[name]), name
    for module in linears:
        weight = module.weight
        assert weight.stride() == (1, weight.shape[0])
    embedding = model.get_submodule("model.embed_tokens").weight
    assert embedding.is_contiguous()


def test_tied_head_stays_the_row_major_embedding(tiny_config: ModelConfig) -> None:
    tied = attrs.evolve(tiny_config, tie_word_embeddings=True)
    weights = {
        k: v for k, v in LlamaForCausalLM(tied).state_dict().items() if k != "lm_head.weight"
    }
    model = build_model(tied, weights.items(), LoadOptions(dtype=torch.float32, device="cpu"))
    head = model.get_submodule("lm_head").weight
    assert head is model.get_submodule("model.embed_tokens").weight
    assert head.is_contiguous()


def test_the_kernel_backend_is_chosen_by_name(tiny_config: ModelConfig) -> None:
    weights = LlamaForCausalLM(tiny_config).state_dict()
    for name, chosen in (("auto", {"cpu", "torch"}), ("torch", {"torch"})):
        model = build_model(
            tiny_config,
            weights.items(),
            LoadOptions(dtype=torch.float32, device="cpu", kernel_backend=name),
        )
        assert model.backend.name in chosen
    with pytest.raises(BackendUnavailableError, match="needs a CUDA device"):
        build_model(
            tiny_config,
            weights.items(),
            LoadOptions(dtype=torch.float32, device="cpu", kernel_backend="cupy"),
        )
