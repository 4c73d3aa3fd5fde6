"""The ``met`` command line: one module per command."""
