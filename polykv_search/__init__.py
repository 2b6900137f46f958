"""polykv-search: find, apply and export layer-wise KV-cache eviction strategies (PolyKV).

Layers, imports pointing down only (``tests/test_layering.py``): ``strategies`` (types, schema, I/O,
exporters) <- this core (models, data, patterns, runtime, evaluation, scoring, compare) <- ``signals``
<- ``solvers`` <- the CLI (:mod:`polykv_search.cli`, the only module that imports everything).
"""

from strategies.catalog import register_pattern_catalog

__version__ = "0.1.0"


def _pattern_class(name: str):
    """The eviction pattern ``name`` (``polykv_search.patterns``), for the strategies layer below."""
    from polykv_search.patterns import get_pattern_class  # torch: imported on first use (CLI start-up)

    return get_pattern_class(name)


# strategies checks pattern names and parameters against the core's registry (strategies.catalog)
register_pattern_catalog(_pattern_class)
