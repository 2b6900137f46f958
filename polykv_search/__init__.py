"""polykv-search: find, apply and export layer-wise KV-cache eviction strategies (PolyKV)."""

__version__ = "0.1.0"
