"""``--format json``: the canonical strategy file (schema ``polykv-strategy``, version 1, or 2 with head groups).

The file is exactly what :meth:`Strategy.save` writes: validated, normalized, two-space indented.
Its documented JSON Schema (draft 2020-12) ships with the package as
``strategies/schema/strategy.schema.json`` (:func:`schema_path`, :func:`load_schema`). The schema
describes the structure, the pattern names and each pattern's parameters; the constraints JSON
Schema cannot state (Σ_l b_l ≤ L·B per phase, b ≥ b_min) are checked by :meth:`Strategy.validate`.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from strategies.exporters import Export, ExportOptions
from strategies.strategy import Strategy

SCHEMA_FILE = "strategy.schema.json"


def schema_path() -> Path:
    """Where the JSON Schema of the canonical strategy file is installed."""
    return Path(str(resources.files("strategies") / "schema" / SCHEMA_FILE))


def load_schema() -> dict[str, Any]:
    return json.loads(schema_path().read_text())


class JSONExporter:
    name: ClassVar[str] = "json"
    description: ClassVar[str] = "the canonical polykv-strategy JSON (its JSON Schema ships with the package)"
    suffix: ClassVar[str | None] = ".json"
    uses: ClassVar[frozenset[str]] = frozenset()
    head_groups_refusal: ClassVar[str | None] = None  # the file carries head groups as they are

    def render(self, strategy: Strategy, out: Path, options: ExportOptions) -> Export:
        return Export({out: strategy.dumps()}, notes=[f"JSON Schema: {schema_path()}"])
