"""The GLM-5.3 (``glm5_next``) text stack's shape, from the config alone: no weights, no device.

Which layers carry a DSA (MLA + sparse indexer) mixer and which KDA linear attention, which run
a dense MLP and which the MoE, and which DSA layers own an indexer. The memory math asks this
skeleton, never the torch model, so it works before anything is loaded.
"""

from __future__ import annotations

import enum

import attrs

from metrale_config import LINEAR_ATTENTION, SPARSE_ATTENTION, ModelConfig

GLM5_NEXT_MODEL_TYPES = ("glm5_next", "glm5_next_text")


class Mixer(enum.Enum):
    DSA = "dsa"
    LINEAR = "linear"


class Ffn(enum.Enum):
    DENSE = "dense"
    MOE = "moe"


@attrs.frozen(kw_only=True)
class SkeletonLayer:
    index: int
    mixer: Mixer
    ffn: Ffn
    # Only DSA layers: True when the layer computes its own top-k ("full"), False when it reuses
    # the previous indexer's selection ("shared").
    has_own_indexer: bool


@attrs.frozen(kw_only=True)
class Glm5NextTextSkeleton:
    layers: tuple[SkeletonLayer, ...]

    @classmethod
    def from_config(cls, config: ModelConfig) -> Glm5NextTextSkeleton:
        """Raises ``ValueError`` for a config that is not ``glm5_next`` or lacks its sections."""
        if config.model_type not in GLM5_NEXT_MODEL_TYPES:
            raise ValueError(f"{config.source}: model_type {config.model_type!r} is not glm5_next")
        if config.moe is None or config.dsa is None or config.mla is None:
            raise ValueError(f"{config.source}: a glm5_next config needs MoE, MLA and DSA fields")
        layers = []
        for index, kind in enumerate(config.layer_types):
            if kind not in (SPARSE_ATTENTION, LINEAR_ATTENTION):
                raise ValueError(f"{config.source}: glm5_next layer {index} has type {kind!r}")
            mixer = Mixer.DSA if kind == SPARSE_ATTENTION else Mixer.LINEAR
            ffn = Ffn.MOE if config.moe.mlp_layer_types[index] == "sparse" else Ffn.DENSE
            own = mixer is Mixer.DSA and config.dsa.indexer_types[index] == "full"
            layers.append(SkeletonLayer(index=index, mixer=mixer, ffn=ffn, has_own_indexer=own))
        return cls(layers=tuple(layers))

    def num_layers_with(self, mixer: Mixer) -> int:
        return sum(1 for layer in self.layers if layer.mixer is mixer)
