"""A saved transformers checkpoint -> the GGUF llama.cpp's ``convert_hf_to_gguf.py`` writes for it,
for the dense families gemma2, gemma3_text, phi3, olmo2, granite and smollm3, glm4_moe,
deepseek_v2 / deepseek_v3, gpt_oss, qwen3_next, kimi_linear and Qwen2.5-VL's text stack
(``qwen2vl``; its tower: :mod:`metrale_testing.llama_cpp_mmproj`).

Written from the converter's model classes (``Gemma2Model``, ``Gemma3Model``, ``Phi3MiniModel``,
``Olmo2Model``, ``GraniteModel``, ``SmolLM3Model``, ``Glm4MoeModel``, ``DeepseekV2Model``,
``GptOssModel``, ``Qwen3NextModel``; ``TextModel`` / ``LlamaModel`` for what they inherit) and
gguf-py's tensor map: the same metadata keys and values, tensor names, and value transforms (Q/K
rows permuted where ``LlamaModel`` permutes; gemma's norms ``+ 1``; Phi-3's LongRoPE factors as
tensors; experts stacked, GLM's MTP layers as ``blk.N.nextn.*``; DeepSeek's ``kv_b_proj`` split
in two, or whole as before llama.cpp's MLA change with ``legacy_mla``; gpt-oss's experts as
:mod:`metrale_testing.llama_cpp_gpt_oss` writes them; Qwen3-Next's tensors as
:mod:`metrale_testing.llama_cpp_qwen3next` does, Kimi Linear's as
:mod:`metrale_testing.llama_cpp_kimi_linear` does). No tokenizer is written (the checkpoints
have none), so nothing is trimmed from gemma3's embedding. Matrices go to ``qtype``; 1-D
tensors, biases, norms, routers and conv1d kernels stay F32, and a matrix whose rows are not
whole ``qtype`` blocks falls back to F16, as the converter does.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import gguf
import numpy as np
from safetensors.numpy import load_file

from metrale_testing.llama_cpp_deepseek2 import DEEPSEEK_TYPES, deepseek2_metadata, split_kv_b
from metrale_testing.llama_cpp_gpt_oss import RawTensor, gpt_oss_tensors
from metrale_testing.llama_cpp_kimi_linear import kimi_linear_metadata, kimi_linear_tensors
from metrale_testing.llama_cpp_qwen3next import qwen3next_metadata, qwen3next_tensors
from metrale_testing.llama_cpp_text_model import Hparams, rope_parameters, text_model_metadata

Q = gguf.GGMLQuantizationType
TensorConversion = Callable[
    [Iterator[tuple[str, np.ndarray]], Hparams], Iterator[tuple[str, np.ndarray | RawTensor]]
]


@attrs.frozen(kw_only=True)
class Vocabulary:
    """A byte-level BPE vocabulary (``TextModel._set_vocab_gpt2``'s keys): its tokens by id and
    merges, which tokens are control tokens, and its special token ids."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]
    control_token_ids: frozenset[int] = frozenset()
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def write(self, writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(list(self.tokens))
        control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
        writer.add_token_types(
            [control if i in self.control_token_ids else normal for i in range(len(self.tokens))]
        )
        writer.add_token_merges(list(self.merges))
        if self.bos_token_id is not None:
            writer.add_bos_token_id(self.bos_token_id)
        if self.eos_token_id is not None:
            writer.add_eos_token_id(self.eos_token_id)
        if self.pad_token_id is not None:
            writer.add_pad_token_id(self.pad_token_id)


@attrs.frozen
class _Family:
    arch: gguf.MODEL_ARCH
    write_metadata: Callable[[gguf.GGUFWriter, Hparams, int], None]
    is_permuted: bool = False
    norm_shift: float = 0.0
    skips_lm_head: bool = False
    extra_tensors: Callable[[Hparams], Iterator[tuple[str, np.ndarray]]] | None = None
    # The blocks written: the stack, and the MTP layers after it (glm4_moe).
    num_blocks: Callable[[Hparams], int] = lambda hparams: hparams["num_hidden_layers"]
    # The checkpoint's tensors -> the tensors written (DeepSeek's kv_b_proj split, gpt-oss's
    # experts).
    convert_tensors: TensorConversion | None = None


def convert_to_gguf(
    checkpoint_dir: Path,
    out_path: Path,
    qtype: Q = Q.F32,
    *,
    legacy_mla: bool = False,
    vocab: Vocabulary | None = None,
) -> Path:
    """Write ``checkpoint_dir``'s model to ``out_path`` as llama.cpp's converter would with
    ``--outtype`` ``qtype`` (F32, F16 or Q8_0); DeepSeek's with ``legacy_mla`` as the converter
    did before its MLA change (April 2025); with ``vocab``'s tokens and special ids (what
    ``set_vocab`` writes from a tokenizer's files) when given."""
    hparams = json.loads((checkpoint_dir / "config.json").read_text(encoding="utf-8"))
    model_type = hparams["model_type"]
    if model_type in DEEPSEEK_TYPES:
        family = _deepseek2_family(legacy_mla)
    else:
        family = _FAMILIES[model_type]
    num_blocks = family.num_blocks(hparams)
    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[family.arch])
    family.write_metadata(writer, hparams, num_blocks)
    writer.add_file_type(_FILE_TYPES[qtype])
    if vocab is not None:
        vocab.write(writer)
    name_map = gguf.get_tensor_name_map(family.arch, num_blocks)
    tensors: Iterator[tuple[str, np.ndarray | RawTensor]]
    tensors = _stacked_experts(_checkpoint_tensors(checkpoint_dir))
    if family.convert_tensors is not None:
        tensors = family.convert_tensors(tensors, hparams)
    for name, data in tensors:
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if family.skips_lm_head and name == "lm_head.weight":
            continue
        if (layer := _LAYER.match(name)) is not None and int(layer[1]) >= num_blocks:
            continue
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{name} has no llama.cpp name")
        if isinstance(data, RawTensor):
            writer.add_tensor(gguf_name, data.data, raw_dtype=data.qtype)
            continue
        data = data.astype(np.float32)
        if family.is_permuted:
            data = _permuted(data, name, hparams)
        if family.norm_shift and name.endswith("norm.weight"):
            data = data + np.float32(family.norm_shift)
        _add_tensor(writer, gguf_name, data, qtype)
    if family.extra_tensors is not None:
        for name, data in family.extra_tensors(hparams):
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _checkpoint_tensors(checkpoint_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    for file in sorted(checkpoint_dir.glob("*.safetensors")):
        yield from load_file(file).items()


_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT = re.compile(
    r"(?P<layer>model\.layers\.\d+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight"
)


def _stacked_experts(
    tensors: Iterator[tuple[str, np.ndarray]],
) -> Iterator[tuple[str, np.ndarray]]:
    """Per-expert projections stacked over experts, one tensor per layer and projection
    (``MOE_HF_MLP``: ``...mlp.experts.gate_proj.weight``, ``(experts, rows, cols)``)."""
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, data in tensors:
        if (match := _EXPERT.fullmatch(name)) is None:
            yield name, data
            continue
        stacked_name = f"{match['layer']}.{match['proj']}.weight"
        experts.setdefault(stacked_name, {})[int(match["expert"])] = data
    for name, by_expert in experts.items():
        yield name, np.stack([by_expert[e] for e in range(len(by_expert))])


def _add_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: Q) -> None:
    # The converter keeps 1-D tensors, biases, norms, routers and conv1d kernels in float32.
    is_float32 = data.ndim <= 1 or not name.endswith(".weight")
    always_float32 = ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight")
    is_float32 = is_float32 or name.endswith(always_float32)
    if is_float32 or qtype == Q.F32:
        writer.add_tensor(name, data)
    elif qtype == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        try:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        except gguf.QuantError:
            writer.add_tensor(name, data.astype(np.float16))


def llama_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """``LlamaModel.permute``: each head's two rotary halves interleaved, row by row."""
    pairs = weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2)).reshape(weights.shape)


def _permuted(data: np.ndarray, name: str, hparams: Hparams) -> np.ndarray:
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return llama_permute(data, hparams["num_attention_heads"])
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return llama_permute(data, hparams["num_key_value_heads"])
    return data


def _llama_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``LlamaModel.set_gguf_parameters``."""
    text_model_metadata(writer, hparams, num_layers)
    writer.add_vocab_size(hparams["vocab_size"])
    head_dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_rope_dimension_count(head_dim)


def _granite_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``GraniteModel.set_gguf_parameters``: llama's without ``head_dim``, and the multipliers
    (each only when set and non-zero)."""
    _llama_metadata(writer, {**hparams, "head_dim": None}, num_layers)
    if value := hparams.get("attention_multiplier"):
        writer.add_attention_scale(value)
    if value := hparams.get("embedding_multiplier"):
        writer.add_embedding_scale(value)
    if value := hparams.get("residual_multiplier"):
        writer.add_residual_scale(value)
    if value := hparams.get("logits_scaling"):
        writer.add_logit_scale(value)


def _gemma2_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``Gemma2Model.set_gguf_parameters`` (no ``TextModel`` keys: no RoPE base)."""
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(num_layers)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams.get("num_key_value_heads", hparams["num_attention_heads"]))
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_key_length(hparams["head_dim"])
    writer.add_value_length(hparams["head_dim"])
    writer.add_attn_logit_softcapping(hparams["attn_logit_softcapping"])
    writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
    writer.add_sliding_window(hparams["sliding_window"])


def _gemma3_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``Gemma3Model.set_gguf_parameters``: ``TextModel``'s, then its own (the repeated keys
    overwrite the same values)."""
    text_model_metadata(writer, hparams, num_layers)
    assert hparams.get("attn_logit_softcapping") is None
    if final_softcap := hparams.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(final_softcap)
    if hparams.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(hparams["sliding_window"])


def _olmo2_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``Olmo2Model.set_gguf_parameters``: ``TextModel``'s (a sliding window is Olmo 3's)."""
    text_model_metadata(writer, hparams, num_layers)
    assert hparams.get("sliding_window") is None


def _phi3_rope_dims(hparams: Hparams) -> int:
    rope = rope_parameters(hparams)
    partial = rope.get("partial_rotary_factor", hparams.get("partial_rotary_factor", 1.0))
    return int(partial * hparams["hidden_size"]) // hparams["num_attention_heads"]


def _phi3_original_context(hparams: Hparams) -> int:
    original: int = (
        rope_parameters(hparams).get("original_max_position_embeddings")
        or hparams["original_max_position_embeddings"]
    )
    return original


def _phi3_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``Phi3MiniModel.set_gguf_parameters`` (no ``TextModel`` keys: no rope scaling type)."""
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_rope_scaling_orig_ctx_len(_phi3_original_context(hparams))
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_block_count(num_layers)
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_rope_dimension_count(_phi3_rope_dims(hparams))
    writer.add_rope_freq_base(rope_parameters(hparams)["rope_theta"])
    writer.add_sliding_window(hparams.get("sliding_window") or 0)


def _phi3_rope_factors(hparams: Hparams) -> Iterator[tuple[str, np.ndarray]]:
    """``Phi3MiniModel.generate_extra_tensors`` (its attention factor goes to the metadata in
    ``_phi3_longrope_metadata``)."""
    rope = rope_parameters(hparams)
    if not rope.get("long_factor"):
        return
    yield "rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32)
    yield "rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32)


def _phi3_longrope_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    _phi3_metadata(writer, hparams, num_layers)
    rope = rope_parameters(hparams)
    if not rope.get("long_factor"):
        return
    original = _phi3_original_context(hparams)
    scale = hparams["max_position_embeddings"] / original
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    writer.add_rope_scaling_attn_factors(attn_factor)


def _glm4_moe_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_blocks: int) -> None:
    """``Glm4MoeModel.set_gguf_parameters``: ``TextModel``'s (its expert and group counts
    too), the rotated dims, the MoE keys and the MTP layer count."""
    text_model_metadata(writer, hparams, num_blocks)
    writer.add_expert_count(hparams["n_routed_experts"])
    writer.add_expert_used_count(hparams["num_experts_per_tok"])
    writer.add_expert_group_count(hparams["n_group"])
    writer.add_expert_group_used_count(hparams["topk_group"])
    head_dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    partial = rope_parameters(hparams).get("partial_rotary_factor", 0.5)
    writer.add_rope_dimension_count(int(head_dim * partial))
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_count(hparams["n_shared_experts"])
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_weights_norm(hparams["norm_topk_prob"])
    writer.add_nextn_predict_layers(hparams["num_nextn_predict_layers"])


def _deepseek2_family(legacy_mla: bool) -> _Family:
    def write_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_blocks: int) -> None:
        deepseek2_metadata(writer, hparams, num_blocks, legacy_mla=legacy_mla)

    return _Family(
        gguf.MODEL_ARCH.DEEPSEEK2,
        write_metadata,
        convert_tensors=None if legacy_mla else split_kv_b,
    )


def _gpt_oss_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_blocks: int) -> None:
    """``GptOssModel.set_gguf_parameters``: ``TextModel``'s (YaRN with its betas; the expert
    counts), the sliding window and the experts' width."""
    text_model_metadata(writer, hparams, num_blocks)
    writer.add_expert_count(hparams["num_local_experts"])
    writer.add_expert_used_count(hparams["num_experts_per_tok"])
    writer.add_sliding_window(hparams["sliding_window"])
    writer.add_expert_feed_forward_length(hparams["intermediate_size"])


def _qwen2vl_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_layers: int) -> None:
    """``Qwen2VLModel.set_gguf_parameters``: ``TextModel``'s, and the M-RoPE sections padded
    to four with zeros."""
    text_model_metadata(writer, hparams, num_layers)
    sections = list(rope_parameters(hparams)["mrope_section"])
    writer.add_rope_dimension_sections(sections + [0] * max(0, 4 - len(sections)))


_FILE_TYPES = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
}
_FAMILIES = {
    "kimi_linear": _Family(
        gguf.MODEL_ARCH.KIMI_LINEAR, kimi_linear_metadata, convert_tensors=kimi_linear_tensors
    ),
    "qwen3_next": _Family(
        gguf.MODEL_ARCH.QWEN3NEXT, qwen3next_metadata, convert_tensors=qwen3next_tensors
    ),
    "gpt_oss": _Family(
        gguf.MODEL_ARCH.GPT_OSS,
        _gpt_oss_metadata,
        convert_tensors=lambda tensors, hparams: gpt_oss_tensors(tensors),
    ),
    "gemma2": _Family(gguf.MODEL_ARCH.GEMMA2, _gemma2_metadata, norm_shift=1.0, skips_lm_head=True),
    "gemma3_text": _Family(gguf.MODEL_ARCH.GEMMA3, _gemma3_metadata, norm_shift=1.0),
    "phi3": _Family(
        gguf.MODEL_ARCH.PHI3, _phi3_longrope_metadata, extra_tensors=_phi3_rope_factors
    ),
    "olmo2": _Family(gguf.MODEL_ARCH.OLMO2, _olmo2_metadata),
    "qwen2_5_vl": _Family(gguf.MODEL_ARCH.QWEN2VL, _qwen2vl_metadata),
    "granite": _Family(gguf.MODEL_ARCH.GRANITE, _granite_metadata, is_permuted=True),
    "smollm3": _Family(gguf.MODEL_ARCH.SMOLLM3, _llama_metadata, is_permuted=True),
    "glm4_moe": _Family(
        gguf.MODEL_ARCH.GLM4_MOE,
        _glm4_moe_metadata,
        num_blocks=lambda hparams: (
            hparams["num_hidden_layers"] + hparams.get("num_nextn_predict_layers", 0)
        ),
    ),
}
