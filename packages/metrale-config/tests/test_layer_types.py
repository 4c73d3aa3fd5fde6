"""``LayerType``: HF spellings, the old constant names, and ``ModelConfig`` coercing strings."""

from __future__ import annotations

import attrs
import pytest

import metrale_config
from metrale_config import LayerType, ModelConfig, MtpConfig
from metrale_config import model_config as model_config_module


def test_values_are_the_hf_spellings() -> None:
    assert [kind.value for kind in LayerType] == [
        "full_attention",
        "sliding_attention",
        "linear_attention",
        "sparse_attention",
    ]
    assert LayerType.SLIDING_ATTENTION == "sliding_attention"
    assert str(LayerType.LINEAR_ATTENTION) == "linear_attention"
    assert "sparse_attention" in {LayerType.SPARSE_ATTENTION}


@pytest.mark.parametrize("kind", list(LayerType))
def test_old_constant_names_are_the_members(kind: LayerType) -> None:
    assert getattr(metrale_config, kind.name) is kind
    assert getattr(model_config_module, kind.name) is kind


def test_model_config_coerces_strings_to_layer_types() -> None:
    config = ModelConfig(
        source="test",
        model_type="llama",
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=16,
        layer_types=["full_attention", "sliding_attention"],
    )
    assert config.layer_types == (LayerType.FULL_ATTENTION, LayerType.SLIDING_ATTENTION)
    assert all(type(kind) is LayerType for kind in config.layer_types)
    assert config.num_layers_of_type(LayerType.SLIDING_ATTENTION) == 1
    with pytest.raises(ValueError, match="chunked"):
        attrs.evolve(config, layer_types=("full_attention", "chunked"))


def test_mtp_layer_types_are_layer_types() -> None:
    mtp = MtpConfig(num_layers=1, layer_types=("sparse_attention",))
    assert mtp.layer_types == (LayerType.SPARSE_ATTENTION,)
    assert type(mtp.layer_types[0]) is LayerType
