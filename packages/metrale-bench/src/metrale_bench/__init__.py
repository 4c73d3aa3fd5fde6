"""metrale-bench."""

__all__: list[str] = []
