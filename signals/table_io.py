"""Reading and writing a signal table file: JSON text, atomic saves, content digests, one-line errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polykv_search.io import atomic_write_text, read_text
from signals.table_codec import SignalTableError
from signals.table_json import table_from_json, table_to_json

if TYPE_CHECKING:  # pragma: no cover
    from signals.table import SignalTable


class TableFileMixin:
    """File and JSON methods of :class:`~signals.table.SignalTable` (the document is :mod:`signals.table_json`)."""

    # ------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        return table_to_json(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write atomically (readers see the old file or the new one, never half)."""
        try:
            text = self.dumps()
        except (TypeError, ValueError) as err:
            raise SignalTableError(f"provenance: not JSON-serializable ({err})") from None
        return atomic_write_text(path, text)

    def digest(self) -> str:
        """A short content hash of the grid and every value (provenance excluded)."""
        body = self.to_json()
        body.pop("provenance")
        return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: Any) -> SignalTable:
        return table_from_json(cls, data)

    @classmethod
    def loads(cls, text: str) -> SignalTable:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SignalTableError(f"signals: not valid JSON ({err})") from None
        return cls.from_json(data)

    @classmethod
    def load(cls, path: str | Path) -> SignalTable:
        """Read and validate a signal table file (``.json``, ``.json.xz`` or ``.json.gz``); every problem is a
        one-line :class:`SignalTableError`."""
        path = Path(path)
        try:
            text = read_text(path)
        except OSError as err:
            raise SignalTableError(f"signals: cannot read {path}: {err.strerror}") from None
        except UnicodeDecodeError:
            raise SignalTableError(f"signals: {path} is not a UTF-8 text file") from None
        try:
            return cls.loads(text)
        except SignalTableError as err:  # the file is named in every message (after the field it names)
            message = str(err)
            raise SignalTableError(message if str(path) in message else f"{message} (in {path})") from None
