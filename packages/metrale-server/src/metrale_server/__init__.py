"""metrale-server."""

__all__: list[str] = []
