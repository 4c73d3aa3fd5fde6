"""The terminal dashboard of ``met serve`` and ``met top``, and the ``met chat`` client."""
