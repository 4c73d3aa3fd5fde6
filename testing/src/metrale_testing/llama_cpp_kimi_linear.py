"""Kimi Linear as llama.cpp's converter (``KimiLinearModel``) writes it, from Moonshot's
config.json (``linear_attn_config``, ``first_k_dense_replace``, ``moe_router_activation_func``):
``TextModel``'s keys with MLA as one latent kv head, then ``head_count_kv`` again as one count per
layer (0 on KDA layers), the KDA sizes, DeepSeek's MLA sizes and the MoE keys; the q/k/v conv1d
kernels reshaped to ``(1, channels, 1, kernel)``, ``A_log`` as ``-exp(A_log)``, ``dt_bias`` as
``ssm_dt.bias``, the experts stacked per projection and ``kv_b_proj`` split as DeepSeek's."""

from __future__ import annotations

import re
from collections.abc import Iterator

import gguf
import numpy as np

from metrale_testing.llama_cpp_deepseek2 import split_kv_b
from metrale_testing.llama_cpp_text_model import Hparams, text_model_metadata

_GATING_FUNCS = {
    "softmax": gguf.ExpertGatingFuncType.SOFTMAX,
    "sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
}
_EXPERT = re.compile(
    r"model\.layers\.(?P<layer>\d+)\.block_sparse_moe\.experts\.(?P<e>\d+)\.(?P<w>w[123])\.weight"
)
_STACKED_NAMES = {"w1": "ffn_gate_exps", "w2": "ffn_down_exps", "w3": "ffn_up_exps"}


def kimi_linear_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_blocks: int) -> None:
    """``KimiLinearModel.set_gguf_parameters`` over ``TextModel``'s."""
    text_hparams = {
        **hparams,
        "max_position_embeddings": hparams["model_max_length"],
        "num_key_value_heads": 1,
    }
    text_model_metadata(writer, text_hparams, num_blocks)
    writer.add_expert_count(hparams["num_experts"])
    writer.add_expert_used_count(hparams["num_experts_per_token"])
    if hparams.get("topk_group") is not None:
        writer.add_expert_group_used_count(hparams["topk_group"])
    writer.add_expert_gating_func(_GATING_FUNCS[hparams["moe_router_activation_func"]])
    writer.add_vocab_size(hparams["vocab_size"])
    linear = hparams["linear_attn_config"]
    writer.add_head_count_kv(
        [1 if i + 1 in linear["full_attn_layers"] else 0 for i in range(num_blocks)]
    )
    writer.add_ssm_conv_kernel(linear["short_conv_kernel_size"])
    writer.add_kda_head_dim(linear["head_dim"])
    if hparams.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(hparams["q_lora_rank"])
    kv_lora_rank, rope_dims = hparams["kv_lora_rank"], hparams["qk_rope_head_dim"]
    writer.add_kv_lora_rank(kv_lora_rank)
    writer.add_rope_dimension_count(rope_dims)
    writer.add_key_length(kv_lora_rank + rope_dims)
    writer.add_key_length_mla(hparams["qk_nope_head_dim"] + rope_dims)
    writer.add_value_length_mla(hparams["v_head_dim"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_count(hparams["num_shared_experts"])
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])


def kimi_linear_tensors(
    tensors: Iterator[tuple[str, np.ndarray]], hparams: Hparams
) -> Iterator[tuple[str, np.ndarray]]:
    """``KimiLinearModel.modify_tensors`` over the checkpoint's tensors (named so that gguf-py's
    tensor map gives llama.cpp's names; the stacked experts by llama.cpp's own)."""
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, data in split_kv_b(tensors, hparams):
        if name.endswith(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")):
            data = data.reshape(1, data.shape[0], 1, data.shape[-1])
        elif name.endswith(".A_log"):
            data = -np.exp(data.astype(np.float32))
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        if (expert := _EXPERT.fullmatch(name)) is None:
            yield name, data
            continue
        stacked = f"blk.{expert['layer']}.{_STACKED_NAMES[expert['w']]}.weight"
        experts.setdefault(stacked, {})[int(expert["e"])] = data
    for name, by_expert in experts.items():
        yield name, np.stack([by_expert[e] for e in range(len(by_expert))])
