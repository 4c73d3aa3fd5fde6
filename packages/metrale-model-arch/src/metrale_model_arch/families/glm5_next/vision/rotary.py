"""The tower's axial 2D rotary, shared by the vision families
(:mod:`metrale_model_arch.families.vision.rotary`), under GLM-5.3's name."""

from metrale_model_arch.families.vision.rotary import (
    apply_rotary,
    patch_positions,
    rotary_cos_sin,
)

__all__ = ["apply_rotary", "patch_positions", "rotary_cos_sin"]
