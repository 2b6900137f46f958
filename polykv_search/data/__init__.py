"""Offline text data: corpus providers behind one spec string, splits and calibration samples.

>>> corpus = load_corpus("austen")            # or debian-faq, pydoc, a path, hf:NAME
>>> samples = make_samples(tok, corpus, n_samples=8, context_len=512, continuation_len=64, seed=0)
>>> record = describe_samples(samples, corpus, role="calib", seed=0)
"""

from .austen import CALIB_TITLES, EVAL_TITLES, NOVELS
from .corpus import Corpus, Document, fingerprint_documents
from .debian_packages import AptUnavailable
from .errors import DataError
from .load import DEFAULT_CORPUS, NAMED_CORPORA, load_corpus
from .r_serialized import RDataError, RObject, read_lazyload_db, read_rds, unserialize
from .samples import Sample, describe_samples, encode_document, make_samples, samples_fingerprint
from .splits import ROLES, describe_split, split_corpus

__all__ = [
    "AptUnavailable",
    "CALIB_TITLES",
    "Corpus",
    "DEFAULT_CORPUS",
    "DataError",
    "Document",
    "EVAL_TITLES",
    "NAMED_CORPORA",
    "NOVELS",
    "RDataError",
    "RObject",
    "ROLES",
    "Sample",
    "describe_samples",
    "describe_split",
    "encode_document",
    "fingerprint_documents",
    "load_corpus",
    "make_samples",
    "read_lazyload_db",
    "read_rds",
    "samples_fingerprint",
    "split_corpus",
    "unserialize",
]
