"""Atomic writes, JSON and reading (compressed) text, re-exported from :mod:`strategies.io` (the bottom layer,
where they live).

Kept so that ``from polykv_search.io import atomic_write_text`` goes on working everywhere.
"""

from strategies.io import (
    atomic_write_bytes,
    atomic_write_files,
    atomic_write_text,
    read_text,
    remove_stale_temporaries,
    stale_temporaries,
    write_json,
)

__all__ = [
    "atomic_write_bytes",
    "atomic_write_files",
    "atomic_write_text",
    "read_text",
    "remove_stale_temporaries",
    "stale_temporaries",
    "write_json",
]
