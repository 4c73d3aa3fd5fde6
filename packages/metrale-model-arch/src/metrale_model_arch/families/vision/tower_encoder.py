"""What every family's :class:`~metrale_model_arch.prepared_image.ImageEncoder` holds: the
model, its loaded tower, the checkpoint's preprocessing, the image token and the text width.
A family's encoder adds its own ``prepare``, ``encode`` and ``embed_tokens``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.vision.processor_fields import checkpoint_directory

if TYPE_CHECKING:
    from metrale_model_arch.load import LoadedModel
    from metrale_model_arch.prepared_image import PreparedImage
    from metrale_model_arch.prompt_positions import PromptPositions


class ImageTokenConfig(Protocol):
    @property
    def image_token_id(self) -> int: ...


ModelT = TypeVar("ModelT", bound=CausalLM)
VisualT = TypeVar("VisualT")
ProcessorT = TypeVar("ProcessorT")
VisionT = TypeVar("VisionT", bound=ImageTokenConfig)


class TowerImageEncoder(Generic[ModelT, VisualT, ProcessorT]):
    """Image tokens stand one per image in the prompt text and attend causally; positions are
    token indices (a family overrides what differs)."""

    placeholder_text: str | None = None
    text_expansion: str | None = None
    whole_images = False

    def __init__(
        self,
        model: ModelT,
        visual: VisualT | None,
        vision: ImageTokenConfig | None,
        processor: ProcessorT,
    ) -> None:
        if visual is None or vision is None:
            raise ValueError(f"{model.config.source}: the model was loaded without its tower")
        self._model = model
        self._visual: VisualT = visual
        self._processor = processor
        self.image_token_id = vision.image_token_id
        self.hidden_size = model.config.hidden_size

    def rope_positions(
        self, token_ids: Sequence[int], images: Sequence[PreparedImage]
    ) -> PromptPositions | None:
        del token_ids, images  # every token at its index
        return None


def loaded_parts(
    loaded: LoadedModel,
    model_class: type[ModelT],
    vision: VisionT | None,
    read_processor: Callable[[Path | None, VisionT], ProcessorT],
) -> tuple[ModelT, VisionT, ProcessorT]:
    """A loaded model as ``model_class``, its tower's config and its preprocessing, read from
    the checkpoint directory's ``preprocessor_config.json`` (an mmproj's fields; defaults
    without either)."""
    model = loaded.model
    assert isinstance(model, model_class)
    assert vision is not None
    return model, vision, read_processor(checkpoint_directory(loaded), vision)
