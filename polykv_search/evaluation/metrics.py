"""Answer metrics: RULER's string match and LongBench's metrics, dependency-free.

RULER (``scripts/eval/synthetic/constants.py``): predictions are stripped and control characters
become newlines; ``string_match_all`` is the fraction of reference strings found (case-insensitive
substring) in the prediction, averaged over samples; ``string_match_part`` scores 1 when any
reference is found. Both return 0-100.

LongBench (``metrics.py`` and ``eval.py`` of THUDM/LongBench, English datasets): per-sample scores
in [0, 1], the max over the sample's reference answers, averaged and scaled to 0-100. Two metrics
that LongBench takes from third-party packages are re-implemented here with the same definitions:

* ``rouge_l_score``: ROUGE-L F of the ``rouge`` package (pltrdy) as LongBench calls it: texts are
  split into sentences on ``"."``, words on single spaces, summary-level union LCS with *exclusive*
  (set) counting, F = 2PR / (P + R + 1e-8); an empty hypothesis or reference scores 0 (LongBench
  catches the package's exception). Unlike the package, long sentences never hit Python's
  recursion limit (the package's recursive LCS back-trace then raises and LongBench scores 0).
* ``code_sim_score``: ``fuzz.ratio`` as computed by rapidfuzz or by fuzzywuzzy with
  python-Levenshtein: the normalized Indel similarity 2·LCS(a, b) / (|a| + |b|) of the two
  strings, here not rounded to an integer percent (fuzzywuzzy rounds; fuzzywuzzy *without*
  python-Levenshtein uses difflib's matching-blocks ratio instead, which can differ slightly).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

# ====================================================================================== RULER
_CONTROL = re.compile(r"[\x00-\x1f]")


def ruler_postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean over samples of the fraction of references contained in the prediction (0-100)."""
    _check_lengths(predictions, references)
    if not predictions:
        return 0.0
    total = 0.0
    for pred, refs in zip(predictions, references):
        p = pred.lower()
        total += sum(1.0 for r in refs if r.lower() in p) / len(refs) if refs else 0.0
    return 100.0 * total / len(predictions)


def string_match_part(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean over samples of 1 if any reference is contained in the prediction (0-100)."""
    _check_lengths(predictions, references)
    if not predictions:
        return 0.0
    total = 0.0
    for pred, refs in zip(predictions, references):
        p = pred.lower()
        total += max((1.0 if r.lower() in p else 0.0 for r in refs), default=0.0)
    return 100.0 * total / len(predictions)


def _check_lengths(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b):
        raise ValueError(f"{len(a)} predictions for {len(b)} samples")


# ================================================================================== LongBench
def normalize_answer(s: str) -> str:
    """SQuAD/LongBench normalization: lower, drop punctuation, articles, extra whitespace."""
    s = s.lower()
    exclude = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in exclude)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_tokens(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    common = Counter(prediction) & Counter(ground_truth)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(prediction)
    recall = same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_) -> float:
    """Token F1 after :func:`normalize_answer` (LongBench ``qa_f1_score``)."""
    return f1_tokens(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def count_score(prediction: str, ground_truth: str, **_) -> float:
    """Fraction of the numbers in the prediction equal to the answer (LongBench ``count_score``)."""
    numbers = re.findall(r"\d+", prediction)
    if not numbers:
        return 0.0
    return sum(1 for n in numbers if n == str(ground_truth)) / len(numbers)


def retrieval_score(prediction: str, ground_truth: str, **_) -> float:
    """``Paragraph N`` retrieval (LongBench ``retrieval_score``)."""
    match = re.findall(r"Paragraph (\d+)", ground_truth)
    if not match:
        return 0.0
    numbers = re.findall(r"\d+", prediction)
    if not numbers:
        return 0.0
    return sum(1 for n in numbers if n == match[0]) / len(numbers)


def classification_score(prediction: str, ground_truth: str, *, all_classes: Sequence[str] = (), **_) -> float:
    """LongBench ``classification_score``: 1/k when the truth is among the k classes named.

    Classes that are substrings of the truth (and not the truth) are dropped from the matches,
    with LongBench's exact loop (it removes from the list it iterates over, so of two such
    adjacent matches only the first is dropped); scores stay identical to LongBench's.
    """
    matches = [c for c in all_classes if c in prediction]
    for term in matches:  # mutating while iterating, exactly as LongBench does
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence (bit-parallel, Hyyrö 2004), any hashable items."""
    if len(a) < len(b):
        a, b = b, a
    n = len(a)
    if n == 0 or not b:
        return 0
    masks: dict = {}
    for i, item in enumerate(a):
        masks[item] = masks.get(item, 0) | (1 << i)
    full = (1 << n) - 1
    v = full
    for item in b:
        u = v & masks.get(item, 0)
        v = ((v + u) | (v - u)) & full
    return n - bin(v).count("1")


def indel_ratio(a: str, b: str) -> float:
    """Normalized Indel similarity in [0, 1] (rapidfuzz ``fuzz.ratio`` / 100)."""
    if not a and not b:
        return 1.0
    return 2.0 * lcs_length(a, b) / (len(a) + len(b))


def code_sim_score(prediction: str, ground_truth: str, **_) -> float:
    """LongBench ``code_sim_score``: first line without ``` ` ``, ``#`` or ``//``, vs. the truth."""
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    if line == ground_truth:
        return 1.0
    if not line or not ground_truth:
        return 0.0
    return indel_ratio(line, ground_truth)


def _rouge_sentences(text: str) -> list[str]:
    return [" ".join(part.split()) for part in text.split(".") if len(part) > 0]


def _lcs_items(x: Sequence[str], y: Sequence[str]) -> list[str]:
    """The LCS of ``x`` and ``y`` as the ``rouge`` package reconstructs it (same tie-breaking)."""
    n, m = len(x), len(y)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        xi, row, prev = x[i - 1], table[i], table[i - 1]
        for j in range(1, m + 1):
            row[j] = prev[j - 1] + 1 if xi == y[j - 1] else max(prev[j], row[j - 1])
    out = []
    i, j = n, m
    while i > 0 and j > 0:
        if x[i - 1] == y[j - 1]:
            out.append(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def rouge_l_score(prediction: str, ground_truth: str, **_) -> float:
    """ROUGE-L F as LongBench computes it with the ``rouge`` package (see the module docstring)."""
    hyp = _rouge_sentences(prediction)
    ref = _rouge_sentences(ground_truth)
    if not hyp or not ref:
        return 0.0
    ref_words = [w for s in ref for w in s.split(" ")]
    hyp_words = [w for s in hyp for w in s.split(" ")]
    m, n = len(set(ref_words)), len(set(hyp_words))
    union: set[str] = set()
    for r in ref:
        r_words = r.split(" ")
        for h in hyp:
            union.update(_lcs_items(r_words, h.split(" ")))
    llcs = len(union)
    r_lcs, p_lcs = llcs / m, llcs / n
    return 2.0 * (p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8)


#: LongBench dataset -> per-sample metric (English datasets).
LONGBENCH_METRICS = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "gov_report": rouge_l_score,
    "qmsum": rouge_l_score,
    "multi_news": rouge_l_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_l_score,
    "passage_retrieval_en": retrieval_score,
    "passage_count": count_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

#: Datasets whose prediction is cut to its first line before scoring (LongBench ``eval.py``).
FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def longbench_score(
    dataset: str,
    predictions: Sequence[str],
    answers: Sequence[Sequence[str]],
    all_classes: Iterable[Sequence[str] | None] | Sequence[str] | None = None,
) -> float:
    """LongBench's ``scorer``: mean over samples of the best score over references, 0-100.

    ``all_classes`` is one list for the whole dataset (as LongBench passes it) or one per sample.
    """
    if dataset not in LONGBENCH_METRICS:
        raise ValueError(f"no LongBench metric for dataset {dataset!r}; known: {sorted(LONGBENCH_METRICS)}")
    _check_lengths(predictions, answers)
    if not predictions:
        return 0.0
    metric = LONGBENCH_METRICS[dataset]
    per_sample = _per_sample_classes(all_classes, len(predictions))
    total = 0.0
    for pred, truths, classes in zip(predictions, answers, per_sample):
        if dataset in FIRST_LINE_DATASETS:
            pred = pred.lstrip("\n").split("\n")[0]
        total += max((metric(pred, t, all_classes=classes or ()) for t in truths), default=0.0)
    return 100.0 * total / len(predictions)


def _per_sample_classes(all_classes, n: int) -> list:
    if all_classes is None:
        return [None] * n
    all_classes = list(all_classes)
    if not all_classes:
        return [()] * n
    if all(isinstance(c, str) for c in all_classes):
        return [all_classes] * n
    if len(all_classes) != n:
        raise ValueError("all_classes must be one list of classes or one list per sample")
    return all_classes
