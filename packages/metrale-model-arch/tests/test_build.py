"""build_model: projections stored column-major on CPU, embeddings untouched unless a float32
head shares them."""

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


@pytest.mark.parametrize(
    ("dtype", "is_input_major"), [(torch.float32, True), (torch.bfloat16, False)]
)
def test_a_tied_float32_head_is_the_embedding_stored_input_major(
    tiny_config: ModelConfig, dtype: torch.dtype, is_input_major: bool
) -> None:
    tied = attrs.evolve(tiny_config, tie_word_embeddings=True)
    weights = {
        k: v for k, v in LlamaForCausalLM(tied).state_dict().items() if k != "lm_head.weight"
    }
    model = build_model(tied, weights.items(), LoadOptions(dtype=dtype, device="cpu"))
    embedding = model.get_submodule("model.embed_tokens")
    head = model.get_submodule("lm_head").weight
    assert head is embedding.weight
    assert torch.equal(head, weights["model.embed_tokens.weight"].to(dtype))
    assert head.is_contiguous() is not is_input_major
    assert (head.stride() == (1, head.shape[0])) is is_input_major
    ids = torch.tensor([3, 0, 3, tied.vocab_size - 1])
    assert torch.equal(embedding(ids), weights["model.embed_tokens.weight"].to(dtype)[ids])


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
