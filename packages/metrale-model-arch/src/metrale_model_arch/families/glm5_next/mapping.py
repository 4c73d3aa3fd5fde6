"""Checkpoint names of GLM-5.3 -> the parameters of :class:`.model.Glm5NextForCausalLM`.

Checkpoints name the text stack ``model.language_model.`` (a multimodal save), ``model.`` (a
flat text-only save) or nothing (a ``Glm5NextTextModel`` save); all map to ``model.``. The
vision tower (``model.visual.``) loads into ``model.visual.`` when the config declares one (its
gate/up pairs fused as the text stack's), else is skipped; MTP layer ``k``
(``layers.<num_hidden_layers + k>``) loads into ``model.mtp_layers.k`` (its copies of the
embedding and LM head skipped) for ``k`` below the config's MTP layer count, else is skipped.
Per-expert projections stack into the experts' tensors, ``q/k/v_conv1d`` into one depthwise
convolution, ``gate/up_proj`` into ``gate_up_proj``; routers, score-correction biases, the
hyper-connections' ``base``/``scale`` and KDA's convolution, ``dt_bias`` and ``A_log`` stay
float32 (as the weight plan counts them).
"""

from __future__ import annotations

import re

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget

_PREFIX = re.compile(
    r"^(?:model\.language_model\.|model\.(?!visual\.)|(?=layers\.|embed_tokens\.|norm\.))"
)
_VISION = re.compile(r"^(?:model\.)?visual\.")
_VISION_GATE_UP = re.compile(
    r"(?P<module>blocks\.\d+\.mlp|merger)\.(?P<part>gate|up)_proj\.(?P<kind>weight|bias)"
)
_LAYER = re.compile(r"layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_HC = re.compile(r"hc_(?P<which>attn|ffn)_(?P<part>fn|base|scale)")
_EXPERT = re.compile(
    r"mlp\.experts\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight"
)
_CONV = re.compile(r"self_attn\.(?P<part>[qkv])_conv1d\.weight")
_GATE_UP = re.compile(r"(?P<module>mlp|mlp\.shared_experts)\.(?P<part>gate|up)_proj\.weight")
_FORGET = re.compile(r"self_attn\.(?P<name>f_a_proj\.weight|f_b_proj\.weight|dt_bias|A_log)")
_KEEP_FLOAT32 = re.compile(
    r"(?:mlp\.gate\.(?:weight|e_score_correction_bias)|(?:attn|ffn)_hc\.(?:base|scale)"
    r"|self_attn\.conv1d|self_attn\.forget_gate\.(?:dt_bias|A_log))"
)
_MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def glm5_next_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    assert config.moe is not None
    assert config.linear_attention is not None
    num_layers = config.num_hidden_layers
    num_mtp = config.mtp.num_layers if config.mtp is not None else 0
    expert_rows = config.moe.moe_intermediate_size
    conv_rows = config.linear_attention.num_heads * config.linear_attention.head_dim

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if vision := _VISION.match(name):
            if config.vision is None:
                return Skip("the config declares no vision tower")
            return _vision_target(name[vision.end() :], shape)
        match = _PREFIX.match(name)
        if match is None:
            return TensorTarget(name) if name == "lm_head.weight" else None
        short = name[match.end() :]
        layer = _LAYER.fullmatch(short)
        if layer is None:
            return TensorTarget(f"model.{short}")
        index, rest = int(layer["layer"]), layer["rest"]
        if index >= num_layers + num_mtp:
            return Skip(f"MTP layer {index}: beyond the config's {num_mtp} MTP layer(s)")
        if index >= num_layers and rest in _MTP_COPIES:
            return Skip(f"MTP layer {index}: a copy of the target's embedding or LM head")
        prefix = (
            f"model.layers.{index}."
            if index < num_layers
            else f"model.mtp_layers.{index - num_layers}."
        )
        return layer_target(prefix, rest, shape, expert_rows, conv_rows)

    return target


def _vision_target(short: str, shape: tuple[int, ...]) -> TensorTarget:
    if match := _VISION_GATE_UP.fullmatch(short):
        rows = shape[0]
        half = slice(0, rows) if match["part"] == "gate" else slice(rows, 2 * rows)
        return TensorTarget(f"model.visual.{match['module']}.gate_up_proj.{match['kind']}", (half,))
    return TensorTarget(f"model.visual.{short}")


def layer_target(
    prefix: str, rest: str, shape: tuple[int, ...], expert_rows: int, conv_rows: int
) -> TensorTarget:
    """A decoder layer's tensor ``rest`` under ``prefix`` (the module's layer): also Kimi
    Linear's, whose KDA and MoE share these names."""
    if match := _HC.fullmatch(rest):
        rest = f"{match['which']}_hc.{match['part']}"
    elif match := _EXPERT.fullmatch(rest):
        expert, proj = int(match["expert"]), match["proj"]
        if proj == "down_proj":
            return TensorTarget(f"{prefix}mlp.experts.down_proj", (expert,))
        half = slice(0, expert_rows) if proj == "gate_proj" else slice(expert_rows, None)
        return TensorTarget(f"{prefix}mlp.experts.gate_up_proj", (expert, half))
    elif match := _CONV.fullmatch(rest):
        part = "qkv".index(match["part"])
        channels = slice(part * conv_rows, (part + 1) * conv_rows)
        return TensorTarget(f"{prefix}self_attn.conv1d", (channels,), keep_float32=True)
    elif match := _GATE_UP.fullmatch(rest):
        rows = shape[0]
        half = slice(0, rows) if match["part"] == "gate" else slice(rows, 2 * rows)
        return TensorTarget(f"{prefix}{match['module']}.gate_up_proj.weight", (half,))
    elif match := _FORGET.fullmatch(rest):
        rest = f"self_attn.forget_gate.{match['name']}"
    elif rest == "self_attn.o_norm.weight":
        rest = "self_attn.o_norm"
    elif rest == "self_attn.conv1d.weight":
        rest = "self_attn.conv1d"
    return TensorTarget(f"{prefix}{rest}", keep_float32=bool(_KEEP_FLOAT32.fullmatch(rest)))
