"""``python -m metrale_bench``: the ``bench`` command group."""

from metrale_bench.cli import main

main()
