"""metrale-model-arch."""

__all__: list[str] = []
