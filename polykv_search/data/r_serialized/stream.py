"""The serialization stream: R's ``serialize()`` format (XDR, versions 2 and 3) decoded item by item."""

from __future__ import annotations

import math
import struct

from polykv_search.data.r_serialized.objects import RDataError, RObject

# SEXP type codes (Rinternals.h) and the pseudo types used only in streams (serialize.c).
_TYPE_NAMES = {
    0: "NULL",
    1: "symbol",
    2: "pairlist",
    3: "closure",
    4: "environment",
    5: "promise",
    6: "language",
    7: "special",
    8: "builtin",
    9: "char",
    10: "logical",
    13: "integer",
    14: "double",
    15: "complex",
    16: "character",
    17: "...",
    19: "list",
    20: "expression",
    21: "bytecode",
    22: "externalptr",
    23: "weakref",
    24: "raw",
    25: "S4",
}
_PAIRLIKE = {2, 3, 5, 6, 17}  # LISTSXP, CLOSXP, PROMSXP, LANGSXP, DOTSXP
_REFSXP, _NILVALUE_SXP, _GLOBALENV_SXP, _UNBOUNDVALUE_SXP = 255, 254, 253, 252
_MISSINGARG_SXP, _BASENAMESPACE_SXP, _NAMESPACESXP, _PACKAGESXP = 251, 250, 249, 248
_PERSISTSXP, _EMPTYENV_SXP, _BASEENV_SXP, _ALTREP_SXP = 247, 242, 241, 238
_CONSTANTS = {
    _GLOBALENV_SXP: "R_GlobalEnv",
    _UNBOUNDVALUE_SXP: "R_UnboundValue",
    _MISSINGARG_SXP: "R_MissingArg",
    _BASENAMESPACE_SXP: "R_BaseNamespace",
    _EMPTYENV_SXP: "R_EmptyEnv",
    _BASEENV_SXP: "R_BaseEnv",
}
_NA_INTEGER = -(2**31)
_NA_REAL_LOW_WORD = 1954  # R's NA_real_ is the NaN whose low word is 1954
_UTF8_MASK, _LATIN1_MASK, _BYTES_MASK, _ASCII_MASK = 1 << 3, 1 << 2, 1 << 1, 1 << 6


class _Reader:
    """Decodes one XDR serialization stream (``serialize.c``'s ``ReadItem``)."""

    def __init__(self, data: bytes, *, what: str = "stream") -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.what = what
        self.refs: list[RObject] = []
        self.native_encoding = "utf-8"

    # -- primitives -------------------------------------------------------------------------
    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise RDataError(f"{self.what}: truncated R serialized data at byte {self.pos}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def length(self) -> int:
        n = self.int()
        if n == -1:  # long vector: two more ints
            hi, lo = struct.unpack(">II", self._take(8))
            n = (hi << 32) + lo
        if n < 0:
            raise RDataError(f"{self.what}: negative vector length {n}")
        return n

    # -- header -----------------------------------------------------------------------------
    def header(self) -> int:
        magic = bytes(self._take(2))
        if magic != b"X\n":
            if magic in (b"A\n", b"B\n"):
                raise RDataError(f"{self.what}: only XDR R serialization is supported, not {magic!r}")
            raise RDataError(f"{self.what}: not R serialized data (starts with {magic!r})")
        version = self.int()
        self.int()  # writer's R version
        self.int()  # minimal reader version
        if version == 3:
            self.native_encoding = bytes(self._take(self.int())).decode("ascii", "replace") or "utf-8"
        elif version != 2:
            raise RDataError(f"{self.what}: unsupported R serialization version {version}")
        return version

    # -- items ------------------------------------------------------------------------------
    def item(self, flags: int | None = None) -> RObject:
        if flags is None:
            flags = self.int()
        sxp = flags & 0xFF
        levels = flags >> 12
        has_attr = bool(flags & (1 << 9))

        if sxp == _NILVALUE_SXP:
            return RObject("NULL")
        if sxp in _CONSTANTS:
            return RObject("environment", _CONSTANTS[sxp])
        if sxp == _REFSXP:
            index = flags >> 8 or self.int()
            if not 0 < index <= len(self.refs):
                raise RDataError(f"{self.what}: bad reference index {index}")
            return self.refs[index - 1]
        if sxp == _PERSISTSXP:
            obj = RObject("persistent", self._string_vec())
            self.refs.append(obj)
            return obj
        if sxp == 1:  # SYMSXP
            obj = RObject("symbol", self.item().value)
            self.refs.append(obj)
            return obj
        if sxp in (_PACKAGESXP, _NAMESPACESXP):
            obj = RObject(
                "environment",
                ("package:" if sxp == _PACKAGESXP else "namespace:") + ":".join(s or "" for s in self._string_vec()),
            )
            self.refs.append(obj)
            return obj
        if sxp == 4:  # ENVSXP
            locked = self.int()
            obj = RObject("environment", {"locked": bool(locked)})
            self.refs.append(obj)
            obj.value["enclos"] = self.item()
            obj.value["frame"] = self.item()
            obj.value["hashtab"] = self.item()
            obj.attributes = self._attributes(self.item())
            return obj
        if sxp in _PAIRLIKE:
            return self._pairlist(flags)
        if sxp == _ALTREP_SXP:
            return self._altrep()
        return self._vector(sxp, levels, has_attr)

    def _string_vec(self) -> list[str | None]:
        if self.int() != 0:
            raise RDataError(f"{self.what}: bad string vector in a persistent/namespace reference")
        return [self.item().value for _ in range(self.int())]

    def _pairlist(self, flags: int) -> RObject:
        """A LISTSXP/LANGSXP/... chain, read iteratively (long pairlists must not recurse)."""
        head_type = _TYPE_NAMES[flags & 0xFF]
        nodes: list[tuple[str | None, RObject]] = []
        attributes: dict[str, RObject] = {}
        first = True
        while True:
            sxp = flags & 0xFF
            attr = self.item() if flags & (1 << 9) else None
            tag = self.item() if flags & (1 << 10) else None
            if first and attr is not None:
                attributes = self._attributes(attr)
            first = False
            car = self.item()
            nodes.append((tag.value if tag is not None and tag.type == "symbol" else None, car))
            flags = self.int()
            if (flags & 0xFF) != sxp or sxp not in _PAIRLIKE:
                tail = self.item(flags)
                if tail.type != "NULL":  # dotted pair / closure body: keep it as a final node
                    nodes.append((None, tail))
                break
        return RObject(head_type, nodes, attributes)

    def _attributes(self, attr: RObject) -> dict[str, RObject]:
        if attr.type == "NULL":
            return {}
        if attr.type != "pairlist":
            raise RDataError(f"{self.what}: attributes are a {attr.type}, not a pairlist")
        return {tag: value for tag, value in attr.value if tag is not None}

    def _charsxp(self, levels: int) -> str | None:
        n = self.int()
        if n == -1:
            return None  # NA_character_
        raw = bytes(self._take(n))
        if levels & (_UTF8_MASK | _ASCII_MASK):
            return raw.decode("utf-8", "replace")
        if levels & _LATIN1_MASK:
            return raw.decode("latin-1")
        if levels & _BYTES_MASK:
            return raw.decode("latin-1")
        try:
            return raw.decode(self.native_encoding)
        except (LookupError, UnicodeDecodeError):
            return raw.decode("utf-8", "replace")

    def _vector(self, sxp: int, levels: int, has_attr: bool) -> RObject:
        name = _TYPE_NAMES.get(sxp)
        if sxp == 9:  # CHARSXP
            value = self._charsxp(levels)
            if has_attr:
                self.item()
            return RObject("char", value)
        if sxp in (10, 13):  # LGLSXP, INTSXP
            n = self.length()
            ints = struct.unpack(f">{n}i", self._take(4 * n))
            if sxp == 10:
                value = [None if v == _NA_INTEGER else bool(v) for v in ints]
            else:
                value = [None if v == _NA_INTEGER else v for v in ints]
        elif sxp == 14:  # REALSXP
            n = self.length()
            raw = self._take(8 * n)
            value = [_real(raw[8 * i : 8 * i + 8]) for i in range(n)]
        elif sxp == 15:  # CPLXSXP
            n = self.length()
            raw = self._take(16 * n)
            value = [
                None
                if (re := _real(raw[16 * i : 16 * i + 8])) is None
                or (im := _real(raw[16 * i + 8 : 16 * i + 16])) is None
                else complex(re, im)
                for i in range(n)
            ]
        elif sxp == 16:  # STRSXP
            n = self.length()
            value = []
            for _ in range(n):
                flags = self.int()
                if flags & 0xFF != 9:
                    raise RDataError(f"{self.what}: a character vector holds a non-string item")
                value.append(self._charsxp(flags >> 12))
        elif sxp in (19, 20):  # VECSXP, EXPRSXP
            value = [self.item() for _ in range(self.length())]
        elif sxp == 24:  # RAWSXP
            value = bytes(self._take(self.length()))
        elif sxp in (7, 8):  # SPECIALSXP, BUILTINSXP
            value = bytes(self._take(self.int())).decode("ascii", "replace")
        elif sxp in (22, 23):  # EXTPTRSXP, WEAKREFSXP: referenced before their content
            obj = RObject(name)
            self.refs.append(obj)
            if sxp == 22:
                obj.value = (self.item(), self.item())
            if has_attr:
                obj.attributes = self._attributes(self.item())
            return obj
        elif sxp == 25:  # S4SXP
            value = None
        else:
            raise RDataError(f"{self.what}: unsupported R object type {name or sxp}")
        obj = RObject(name, value)
        if has_attr:
            obj.attributes = self._attributes(self.item())
        return obj

    def _altrep(self) -> RObject:
        info = self.item()
        state = self.item()
        attr = self.item()
        cls = info.value[0][1].value if info.type == "pairlist" and info.value else None
        if cls in ("compact_intseq", "compact_realseq"):
            n, start, step = state.value
            n = int(n)
            if cls == "compact_intseq":
                obj = RObject("integer", [int(start) + i * int(step) for i in range(n)])
            else:
                obj = RObject("double", [start + i * step for i in range(n)])
        elif cls is not None and cls.startswith("wrap_"):
            obj = RObject(state.value[0].type, state.value[0].value, dict(state.value[0].attributes))
        elif cls == "deferred_string":
            source = state.value[0][1] if state.type == "pairlist" else state
            obj = RObject("character", [None if v is None else _format_number(v) for v in source.value])
        else:
            raise RDataError(f"{self.what}: unsupported ALTREP class {cls!r}")
        obj.attributes.update(self._attributes(attr))
        return obj


def _real(b: memoryview) -> float | None:
    value = struct.unpack(">d", b)[0]
    if math.isnan(value) and struct.unpack(">I", b[4:8])[0] == _NA_REAL_LOW_WORD:
        return None
    return value


def _format_number(v: float | int) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def unserialize(data: bytes, *, what: str = "stream") -> RObject:
    """Decode one uncompressed R serialization stream (``serialize(x, NULL)`` bytes).

    Parameters
    ----------
    data : bytes
        The stream, starting with the ``X\\n`` format marker.
    what : str
        A label for error messages.

    Returns
    -------
    RObject
        The top-level object.
    """
    reader = _Reader(data, what=what)
    reader.header()
    return reader.item()
