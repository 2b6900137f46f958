"""Give the process's freed heap memory back to the system between samples.

A scoring run allocates and frees tensors of ever-changing sizes (each sample's prompt, caches and
batches). glibc's allocator keeps freed chunks in its arenas for reuse, and with sizes that never
repeat exactly the process's resident memory grows sample after sample (a 300-sample ruler study at
1,024 tokens reached 11–13 GB). ``malloc_trim(0)`` hands the free pages back (measured in
``docs/scoring.md``, "Memory"); elsewhere (macOS, musl, Windows) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return free heap pages to the system (glibc ``malloc_trim(0)``); False where there is no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
