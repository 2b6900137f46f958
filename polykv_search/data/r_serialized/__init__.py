"""A small pure-Python reader for R's serialized data (RDS files and lazy-load databases).

R packages ship data as ``.rds`` files (a gzip/bzip2/xz-compressed serialization stream) and as
lazy-load databases: ``NAME.rdx`` (an RDS index) next to ``NAME.rdb`` (concatenated records, each a
compressed serialization stream). The stream format is the one written by R's ``serialize()``
(``src/main/serialize.c``), XDR (big-endian) flavour, versions 2 and 3.

Only the subset needed for data packages is decoded: NULL, atomic vectors (logical, integer,
double, complex, character, raw), lists, pairlists, symbols, environments, attributes and the
common ALTREP classes (compact sequences, wrappers, deferred strings). Closures and byte code are
read as opaque objects where the format allows and rejected otherwise.

Modules: :mod:`~.objects` (:class:`RObject`, :class:`RDataError`), :mod:`~.stream` (the stream
decoder, :func:`unserialize`), :mod:`~.files` (``.rds`` files and lazy-load databases).
"""

from polykv_search.data.r_serialized.files import read_lazyload_db, read_lazyload_record, read_rds
from polykv_search.data.r_serialized.objects import RDataError, RObject
from polykv_search.data.r_serialized.stream import unserialize

__all__ = ["RDataError", "RObject", "read_lazyload_db", "read_lazyload_record", "read_rds", "unserialize"]
