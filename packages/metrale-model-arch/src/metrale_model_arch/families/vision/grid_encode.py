"""The image encoder of a model whose text stack holds a tower over patch grids (GLM-5.3's,
Qwen2.5-VL's): every image's patches encoded in one call with their ``(frames, rows, columns)``
grids, the merged tokens split back per image, in the text embedding's dtype."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import torch
from torch import nn

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.vision.tower_encoder import ImageTokenConfig, TowerImageEncoder
from metrale_model_arch.prepared_image import PreparedImage

GridTower = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ModelT = TypeVar("ModelT", bound=CausalLM)
ProcessorT = TypeVar("ProcessorT")


class TextStackWithTower(Protocol):
    @property
    def embed_tokens(self) -> nn.Embedding: ...

    @property
    def visual(self) -> GridTower | None: ...


class GridImageEncoder(TowerImageEncoder[ModelT, GridTower, ProcessorT]):
    """An encoder whose text stack (``model.model``) holds the grid tower and the text
    embedding the image embeddings stand among."""

    def __init__(
        self,
        model: ModelT,
        text_stack: TextStackWithTower,
        vision: ImageTokenConfig | None,
        processor: ProcessorT,
    ) -> None:
        super().__init__(model, text_stack.visual, vision, processor)
        self._embed_tokens = text_stack.embed_tokens

    def encode(self, images: Sequence[PreparedImage]) -> list[torch.Tensor]:
        pixel_values = torch.cat([image.pixel_values for image in images])
        grid_thw = torch.tensor([image.grid for image in images], dtype=torch.int64)
        features = self._visual(pixel_values, grid_thw).to(self._embed_tokens.weight.dtype)
        return list(torch.split(features, [image.num_tokens for image in images]))

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeds: torch.Tensor = self._embed_tokens(input_ids)
        return embeds
