"""What the runtime reports: per-layer cache lengths and the KV bytes actually held."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LayerReport:
    layer: int
    seen: int
    kept: int
    kv_bytes: int
    #: the most bytes held between calls since the prompt (the prompt's own prefill call excluded)
    peak_kv_bytes: int
    full_kv_bytes: int
    prefill_budget: int | None
    decoding_budget: int | None


@dataclass(frozen=True)
class CacheReport:
    layers: list[LayerReport]

    @property
    def kv_bytes(self) -> int:
        return sum(r.kv_bytes for r in self.layers)

    @property
    def peak_kv_bytes(self) -> int:
        """Sum of the layers' peaks (an upper bound of the whole cache's peak)."""
        return sum(r.peak_kv_bytes for r in self.layers)

    @property
    def full_kv_bytes(self) -> int:
        return sum(r.full_kv_bytes for r in self.layers)

    @property
    def lengths(self) -> list[int]:
        return [r.kept for r in self.layers]

    def to_json(self) -> dict:
        return {
            "kv_bytes": self.kv_bytes,
            "peak_kv_bytes": self.peak_kv_bytes,
            "full_kv_bytes": self.full_kv_bytes,
            "ratio": self.kv_bytes / self.full_kv_bytes if self.full_kv_bytes else None,
            "layers": [asdict(r) for r in self.layers],
        }


def layer_report(layer) -> LayerReport:
    """What one cache layer holds now (its own ``layer_report``: a layer of head groups sums its groups)."""
    return layer.layer_report()


def report_of(layer, plans: dict) -> LayerReport:
    """What a layer of one store holds now, with its ``(prefill, decoding)`` ``plans`` by phase."""
    return LayerReport(
        layer=layer.layer_idx,
        seen=layer.seen,
        kept=_kept(layer),
        kv_bytes=layer.kv_bytes(),
        peak_kv_bytes=_peak_bytes(layer),
        full_kv_bytes=_full_bytes(layer),
        prefill_budget=plans["prefill"].budget,
        decoding_budget=plans["decoding"].budget,
    )


def cache_report(layers) -> CacheReport:
    """Per-layer lengths and KV bytes of a sequence of cache layers (one per model layer)."""
    return CacheReport([layer_report(layer) for layer in layers])


def _kept(layer) -> int:
    """Tokens held per KV head: the slots, or for a layer whose heads differ in length (a pooled allocation)
    the mean over rows and KV heads of the real tokens."""
    if not layer.ragged or layer.valid is None or not layer.valid.numel():
        return layer.length
    return round(layer.valid.sum().item() / (layer.valid.shape[0] * layer.valid.shape[1]))


def _full_bytes(layer) -> int:
    """Bytes the layer would hold under FullKV: every token seen, for every batch row and KV head."""
    if layer.keys is None:
        return 0
    b, h, _, d = layer.keys.shape
    dv = layer.values.shape[-1]  # the value head size may differ from the key's
    return b * h * layer.seen * (d * layer.keys.element_size() + dv * layer.values.element_size())


def _peak_bytes(layer) -> int:
    if layer.keys is None or not layer.length:
        return 0
    return layer.kv_bytes() * max(layer.peak_length, layer.length) // layer.length
