"""Errors raised while parsing configs and the environment."""


class ConfigError(ValueError):
    """A config file or metadata block that cannot describe a supported model."""


class UndeclaredLeverError(ConfigError):
    """A ``METRALE_*`` environment variable that no lever declares."""
