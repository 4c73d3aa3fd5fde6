"""Where ``met bench`` keeps its records unless ``--records-dir`` or ``$METRALE_BENCH_DIR``
says otherwise: the user's data directory, so a run never leaves files in the current one.

Records are results to compare later, not a cache that may be deleted: they go to the XDG
data directory, not the cache.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

RECORDS_DIR_ENV = "METRALE_BENCH_DIR"
DEFAULT_RECORDS_DIR_HELP = "$XDG_DATA_HOME/metrale/bench, else ~/.local/share/metrale/bench"


def default_records_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/metrale/bench``; ``~/.local/share/metrale/bench`` when that variable is
    unset, empty or a relative path (the XDG base directory rule)."""
    environ = os.environ if environ is None else environ
    data_home = environ.get("XDG_DATA_HOME", "")
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"
    return base / "metrale" / "bench"
