"""What the runtime reports: per-layer cache lengths and the KV bytes actually held."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LayerReport:
    layer: int
    seen: int
    kept: int
    kv_bytes: int
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
    def full_kv_bytes(self) -> int:
        return sum(r.full_kv_bytes for r in self.layers)

    @property
    def lengths(self) -> list[int]:
        return [r.kept for r in self.layers]

    def to_json(self) -> dict:
        return {
            "kv_bytes": self.kv_bytes,
            "full_kv_bytes": self.full_kv_bytes,
            "ratio": self.kv_bytes / self.full_kv_bytes if self.full_kv_bytes else None,
            "layers": [asdict(r) for r in self.layers],
        }
