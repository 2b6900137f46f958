"""Where polykv-search keeps downloaded and derived files."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The user cache directory (``$POLYKV_CACHE`` or ``~/.cache/polykv-search``), created on demand."""
    root = os.environ.get("POLYKV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polykv-search"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
