"""RULER-style exact-retrieval tasks, generated in-process over haystack text.

After RULER (Hsieh et al., 2024, arXiv 2404.06654, ``scripts/data/synthetic``): the same templates,
needles, answer prefixes and metrics, with these deliberate differences:

* ``niah_single`` is the passkey form: one needle "The special magic number is N." with N of 5-7
  digits, no key (RULER's niah_single_1..3 query a keyed needle).
* Haystack text comes from the caller (Austen by default in the CLI); each sample starts at a
  seeded random sentence of it and wraps around when the text is short. Sentences are split with a
  small regex instead of nltk.
* Keys are adjective-noun pairs from built-in lists (RULER uses the ``wonderwords`` lists); the
  common-words vocabulary is the lowercase words of the haystack and those lists, with
  pronounceable made-up words filling in only when they run out.
* ``context_len`` is the prompt length in tokens of the model's tokenizer (context, question,
  chat template and answer prefix included, generated tokens excluded); the haystack size is the
  largest that fits, found by binary search as RULER does.

Every sample is checked on generation (:meth:`RulerTask.check`): its answer is recovered from the
context text alone, by parsing, and must equal the stored answer.

Modules: :mod:`~.haystack` (text, word lists, needle insertion), :mod:`~.base` (:class:`RulerTask`),
:mod:`~.niah`, :mod:`~.variable_tracking`, :mod:`~.common_words` (one task family each).
"""

from __future__ import annotations

from polykv_search.evaluation.ruler.base import FEWSHOT_MIN_LEN, RulerTask, use_fewshot
from polykv_search.evaluation.ruler.common_words import (
    CWE_CONTEXT,
    CWE_PREFIX,
    CWE_QUESTION,
    CommonWordsExtraction,
    pseudo_words,
)
from polykv_search.evaluation.ruler.haystack import (
    ADJECTIVES,
    DEPTHS,
    NOISE,
    NOUNS,
    Haystack,
    haystack_of,
    insert_at_depths,
    random_key,
    random_number,
    split_sentences,
)
from polykv_search.evaluation.ruler.niah import (
    NIAH_PREAMBLE,
    NiahMultiKey,
    NiahMultiQuery,
    NiahMultiValue,
    NiahSingle,
    NiahTask,
)
from polykv_search.evaluation.ruler.variable_tracking import VT_CONTEXT, VT_PREFIX, VT_QUESTION, VariableTracking

RULER_TASKS: tuple[type[RulerTask], ...] = (
    NiahSingle,
    NiahMultiKey,
    NiahMultiValue,
    NiahMultiQuery,
    VariableTracking,
    CommonWordsExtraction,
)

__all__ = [
    "ADJECTIVES",
    "CWE_CONTEXT",
    "CWE_PREFIX",
    "CWE_QUESTION",
    "DEPTHS",
    "FEWSHOT_MIN_LEN",
    "NIAH_PREAMBLE",
    "NOISE",
    "NOUNS",
    "RULER_TASKS",
    "VT_CONTEXT",
    "VT_PREFIX",
    "VT_QUESTION",
    "CommonWordsExtraction",
    "Haystack",
    "NiahMultiKey",
    "NiahMultiQuery",
    "NiahMultiValue",
    "NiahSingle",
    "NiahTask",
    "RulerTask",
    "VariableTracking",
    "haystack_of",
    "insert_at_depths",
    "pseudo_words",
    "random_key",
    "random_number",
    "split_sentences",
    "use_fewshot",
]
