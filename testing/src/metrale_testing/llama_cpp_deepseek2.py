"""DeepSeek-V2 / V3 as llama.cpp's converter (``DeepseekV2Model``) writes them: ``TextModel``'s
keys with MLA as one latent kv head, the MLA sizes, the MoE keys and YaRN's log multiplier,
and ``kv_b_proj`` split into ``k_b_proj`` (each head's key rows transposed) and ``v_b_proj``."""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from metrale_testing.llama_cpp_text_model import Hparams, rope_parameters, text_model_metadata

DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")
_GATING_FUNCS = {
    "softmax": gguf.ExpertGatingFuncType.SOFTMAX,
    "sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
}


def deepseek2_metadata(
    writer: gguf.GGUFWriter, hparams: Hparams, num_blocks: int, *, legacy_mla: bool
) -> None:
    """``DeepseekV2Model.set_gguf_parameters``: ``TextModel``'s (MLA as one latent kv head;
    its expert, group and gating keys), then the MLA sizes, the MoE keys and YaRN's log
    multiplier. ``legacy_mla``: the converter before llama.cpp's MLA change (the heads' own key
    and value lengths, no ``_mla`` keys)."""
    if hparams.get("rope_interleave") is False:
        raise NotImplementedError("llama.cpp rotates adjacent pairs; rope_interleave false")
    kv_heads = hparams["num_attention_heads"] if legacy_mla else 1
    text_model_metadata(writer, {**hparams, "num_key_value_heads": kv_heads}, num_blocks)
    writer.add_expert_count(hparams["n_routed_experts"])
    writer.add_expert_used_count(hparams["num_experts_per_tok"])
    if hparams.get("n_group") is not None:
        writer.add_expert_group_count(hparams["n_group"])
    if hparams.get("topk_group") is not None:
        writer.add_expert_group_used_count(hparams["topk_group"])
    if (scoring := hparams.get("scoring_func")) is not None:
        writer.add_expert_gating_func(_GATING_FUNCS[scoring])
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_vocab_size(hparams["vocab_size"])
    if hparams.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(hparams["q_lora_rank"])
    kv_lora_rank, rope_dims = hparams["kv_lora_rank"], hparams["qk_rope_head_dim"]
    writer.add_kv_lora_rank(kv_lora_rank)
    qk_head_dim = hparams["qk_nope_head_dim"] + rope_dims
    if legacy_mla:
        writer.add_key_length(qk_head_dim)
        writer.add_value_length(hparams["v_head_dim"])
    else:
        writer.add_key_length(kv_lora_rank + rope_dims)
        writer.add_value_length(kv_lora_rank)
        writer.add_key_length_mla(qk_head_dim)
        writer.add_value_length_mla(hparams["v_head_dim"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_count(hparams.get("n_shared_experts", 0))
    if hparams.get("routed_scaling_factor") is not None:
        writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    if hparams.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    writer.add_rope_dimension_count(rope_dims)
    if (mscale_all_dim := rope_parameters(hparams).get("mscale_all_dim")) is not None:
        writer.add_rope_scaling_yarn_log_mul(0.1 * mscale_all_dim)


def split_kv_b(
    tensors: Iterator[tuple[str, np.ndarray]], hparams: Hparams
) -> Iterator[tuple[str, np.ndarray]]:
    """``DeepseekV2Model.modify_tensors``: ``kv_b_proj`` as ``k_b_proj`` (each head's key rows
    transposed) and ``v_b_proj``."""
    nope, v = hparams["qk_nope_head_dim"], hparams["v_head_dim"]
    for name, data in tensors:
        if not name.endswith("kv_b_proj.weight"):
            yield name, data
            continue
        per_head = data.reshape(hparams["num_key_value_heads"], nope + v, data.shape[-1])
        yield name.replace("kv_b_proj", "k_b_proj"), per_head[:, :nope].transpose(0, 2, 1).copy()
        yield name.replace("kv_b_proj", "v_b_proj"), per_head[:, nope:].copy()
