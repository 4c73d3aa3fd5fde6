"""``TextModel.set_gguf_parameters`` of llama.cpp's converter, for the keys the families of
:mod:`metrale_testing.llama_cpp_gguf` have."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

Hparams = Mapping[str, Any]


def rope_parameters(hparams: Hparams) -> dict[str, Any]:
    """``TextModel.rope_parameters``: the checkpoint's, with its ``rope_theta`` mirrored in."""
    params = dict(hparams.get("rope_parameters") or hparams.get("rope_scaling") or {})
    mirrors_theta = "full_attention" not in params and "rope_theta" not in params
    if mirrors_theta and hparams.get("rope_theta") is not None:
        params["rope_theta"] = hparams["rope_theta"]
    return params


def text_model_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``TextModel.set_gguf_parameters``, for the keys these families have."""
    writer.add_block_count(num_layers)
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams["num_key_value_heads"])
    rope = rope_parameters(hparams)
    full = rope.get("full_attention", rope)
    if full.get("rope_type") == "linear" and full.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    elif full.get("rope_type") == "yarn" and full.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(full["factor"])
        writer.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        if (ext_factor := full.get("extrapolation_factor")) is not None:
            writer.add_rope_scaling_yarn_ext_factor(ext_factor)
        if (attn_factor := full.get("attention_factor", full.get("attn_factor"))) is not None:
            writer.add_rope_scaling_yarn_attn_factor(attn_factor)
        if (beta_fast := full.get("beta_fast")) is not None:
            writer.add_rope_scaling_yarn_beta_fast(beta_fast)
        if (beta_slow := full.get("beta_slow")) is not None:
            writer.add_rope_scaling_yarn_beta_slow(beta_slow)
    elif full.get("rope_type") in ("su", "longrope"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    elif full.get("rope_type") not in (None, "default"):
        raise NotImplementedError(f"rope_type {full['rope_type']!r}")
    if full.get("rope_theta") is not None:
        writer.add_rope_freq_base(full["rope_theta"])
    if (local_theta := rope.get("sliding_attention", {}).get("rope_theta")) is not None:
        writer.add_rope_freq_base_swa(local_theta)
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    if hparams.get("head_dim") is not None:
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
