"""CPU threads for the many small per-row operations (pattern hooks, evictions, cache bookkeeping).

Spreading a tiny op over threads costs more than it gains, and a lot on a loaded machine, where a
thread waiting at a barrier for a descheduled sibling stalls every op; the weight matmuls keep the
process's thread count.
"""

from __future__ import annotations

import contextlib

import torch

#: intra-op threads for small operations
SMALL_OP_THREADS = 1


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run a block with ``n`` intra-op CPU threads (``None``: unchanged)."""
    old = torch.get_num_threads()
    if n is None or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def small_ops():
    """The context for a block of small operations."""
    return cpu_threads(SMALL_OP_THREADS)
