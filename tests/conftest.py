"""Shared test set-up.

``strategies`` is the bottom layer: it learns the eviction patterns from the catalog that the core
registers when ``polykv_search`` is imported (see :mod:`strategies.catalog`). Import it here so that
a test module using only ``strategies`` works when run on its own.
"""

import polykv_search  # noqa: F401  (registers the pattern catalog)
