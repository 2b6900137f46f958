"""The one exception type the data layer raises for bad specs, files and corpora."""

from __future__ import annotations


class DataError(ValueError):
    """A corpus spec, file or sampling request that cannot be satisfied (one-line message)."""
