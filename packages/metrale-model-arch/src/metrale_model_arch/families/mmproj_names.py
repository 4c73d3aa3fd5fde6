"""llama.cpp mmproj tensor names -> checkpoint (Hugging Face) names, per projector type.

The converter (``Gemma3VisionModel``, ``Qwen2VLVisionModel``) names the tower ``v.*`` and the
projector ``mm.*`` and stores most tensors as the checkpoint has them; the exceptions are
described by :class:`MmprojTensor`: Gemma 3's ``soft_emb_norm`` stored ``+ 1``, Qwen2.5-VL's
fused ``qkv`` split into ``attn_q`` / ``attn_k`` / ``attn_v`` and its Conv3D patch embedding
split into its two frames (``v.patch_embd.weight`` and ``v.patch_embd.weight.1``). Gemma 3's
``mm_input_projection_weight`` keeps its ``(vision, text)`` layout (clip.cpp transposes it).
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

# Which part of a checkpoint tensor an mmproj tensor holds: a third of a fused qkv, or one
# frame of a Conv3D patch embedding.
MmprojPart = Literal["q", "k", "v", "frame0", "frame1"]
QKV_PARTS: tuple[MmprojPart, ...] = ("q", "k", "v")
FRAME_PARTS: tuple[MmprojPart, ...] = ("frame0", "frame1")


@attrs.frozen(kw_only=True)
class MmprojTensor:
    """Where one mmproj tensor goes: ``hf_name``, all of it (``part`` ``None``) or one part;
    ``stored_shift`` is what the converter added to its values."""

    hf_name: str
    part: MmprojPart | None = None
    stored_shift: float = 0.0


class UnknownMmprojTensorError(KeyError):
    """An mmproj tensor name with no checkpoint counterpart for its projector."""

    def __str__(self) -> str:
        return str(self.args[0])


_BLOCK = re.compile(r"v\.blk\.(?P<layer>\d+)\.(?P<part>\w+)\.(?P<kind>weight|bias)")

_SIGLIP_TOWER = "vision_tower.vision_model"
_GEMMA3_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_GEMMA3_TOP_LEVEL = {
    "v.patch_embd.weight": MmprojTensor(
        hf_name=f"{_SIGLIP_TOWER}.embeddings.patch_embedding.weight"
    ),
    "v.patch_embd.bias": MmprojTensor(hf_name=f"{_SIGLIP_TOWER}.embeddings.patch_embedding.bias"),
    "v.position_embd.weight": MmprojTensor(
        hf_name=f"{_SIGLIP_TOWER}.embeddings.position_embedding.weight"
    ),
    "v.post_ln.weight": MmprojTensor(hf_name=f"{_SIGLIP_TOWER}.post_layernorm.weight"),
    "v.post_ln.bias": MmprojTensor(hf_name=f"{_SIGLIP_TOWER}.post_layernorm.bias"),
    "mm.input_projection.weight": MmprojTensor(
        hf_name="multi_modal_projector.mm_input_projection_weight"
    ),
    "mm.soft_emb_norm.weight": MmprojTensor(
        hf_name="multi_modal_projector.mm_soft_emb_norm.weight", stored_shift=1.0
    ),
}

_QKV_THIRDS: dict[str, MmprojPart] = {"attn_q": "q", "attn_k": "k", "attn_v": "v"}
_QWEN_BLOCK_NAMES = {
    "attn_out": "attn.proj",
    "ln1": "norm1",
    "ln2": "norm2",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QWEN_TOP_LEVEL = {
    "v.patch_embd.weight": MmprojTensor(hf_name="visual.patch_embed.proj.weight", part="frame0"),
    "v.patch_embd.weight.1": MmprojTensor(hf_name="visual.patch_embed.proj.weight", part="frame1"),
    "v.post_ln.weight": MmprojTensor(hf_name="visual.merger.ln_q.weight"),
    "mm.0.weight": MmprojTensor(hf_name="visual.merger.mlp.0.weight"),
    "mm.0.bias": MmprojTensor(hf_name="visual.merger.mlp.0.bias"),
    "mm.2.weight": MmprojTensor(hf_name="visual.merger.mlp.2.weight"),
    "mm.2.bias": MmprojTensor(hf_name="visual.merger.mlp.2.bias"),
}


def _gemma3_block(layer: str, part: str, kind: str) -> MmprojTensor | None:
    name = _GEMMA3_BLOCK_NAMES.get(part)
    if name is None:
        return None
    return MmprojTensor(hf_name=f"{_SIGLIP_TOWER}.encoder.layers.{layer}.{name}.{kind}")


def _qwen2_5_vl_block(layer: str, part: str, kind: str) -> MmprojTensor | None:
    prefix = f"visual.blocks.{layer}"
    if (third := _QKV_THIRDS.get(part)) is not None:
        return MmprojTensor(hf_name=f"{prefix}.attn.qkv.{kind}", part=third)
    name = _QWEN_BLOCK_NAMES.get(part)
    return None if name is None else MmprojTensor(hf_name=f"{prefix}.{name}.{kind}")


_TABLES = {
    "gemma3": (_GEMMA3_TOP_LEVEL, _gemma3_block),
    "qwen2.5vl_merger": (_QWEN_TOP_LEVEL, _qwen2_5_vl_block),
}


def mmproj_tensor(projector: str, gguf_name: str) -> MmprojTensor:
    """Where ``gguf_name`` of an mmproj with ``clip.projector_type`` ``projector`` goes.

    Raises ``UnknownMmprojTensorError`` for a name (or projector) this table does not know.
    """
    if projector not in _TABLES:
        raise UnknownMmprojTensorError(f"projector type {projector!r} has no tensor names here")
    top_level, block = _TABLES[projector]
    found = top_level.get(gguf_name)
    if found is None and (match := _BLOCK.fullmatch(gguf_name)) is not None:
        found = block(match["layer"], match["part"], match["kind"])
    if found is None:
        raise UnknownMmprojTensorError(
            f"mmproj tensor {gguf_name!r} has no Hugging Face name ({projector})"
        )
    return found
