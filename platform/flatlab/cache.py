"""flatlab's cache folder on this machine: generated data sets and checkpoints fetched from MLflow."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$FLATLAB_CACHE`` or ``$XDG_CACHE_HOME/flatlab`` or ``~/.cache/flatlab``, as an absolute path."""
    env = os.environ.get("FLATLAB_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    return (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flatlab").resolve()
