"""Retrieval-aware calibration: the evidence generator, its held-out-ness from ruler, and collecting with a mix."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch
from tiny import tiny_model

from polykv_search.data import Corpus, DataError, Document, encode_document, make_samples, split_corpus
from polykv_search.data import evidence as ev
from polykv_search.data.evidence import (
    FORMATS,
    KINDS,
    EvidenceSample,
    describe_evidence,
    make_calibration_samples,
    parse_retrieval_mix,
    query_text,
    scored_span,
    statement_text,
)
from polykv_search.evaluation import ruler
from signals import SignalTable
from signals.collect import collect_signals

N, M = 400, 56  # context / continuation tokens (characters, with the char-level tokenizer)


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def char_tokenizer():
    """Every character one token (ids < 128, as the tiny models' vocabulary); decodes losslessly."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(chars)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


MARKERS = ("amber", "birch", "coral", "dune", "ember", "fjord", "grove", "heath")


def toy_corpus() -> Corpus:
    """Eight documents, each with a marker word of its own, so that any text can be traced to one."""
    docs = []
    for marker in MARKERS:
        sentences = [
            f"The {marker} path went on for mile {i} or so. Nobody there said much of {marker} {i}!" for i in range(60)
        ]
        docs.append(Document(id=f"doc-{marker}", title=marker, text=" ".join(sentences)))
    return Corpus(name="toy", documents=docs)


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def corpus():
    return toy_corpus()


def evidence_of(samples):
    return [s for s in samples if isinstance(s, EvidenceSample)]


# ------------------------------------------------------------------------------ the generator
def test_generator_is_deterministic_per_seed(tok, corpus):
    mix = parse_retrieval_mix("0.5")
    kw = dict(n_samples=6, context_len=N, continuation_len=M, mix=mix)
    a = make_calibration_samples(tok, corpus, seed=3, **kw)
    b = make_calibration_samples(tok, corpus, seed=3, **kw)
    c = make_calibration_samples(tok, corpus, seed=4, **kw)
    assert a == b and len(evidence_of(a)) == 3
    assert describe_evidence(a, mix) == describe_evidence(b, mix)
    assert [s.statements for s in evidence_of(a)] != [s.statements for s in evidence_of(c)]
    # the prose samples are make_samples's own leading windows; with no mix the two are the same
    plain = make_samples(tok, corpus, n_samples=6, context_len=N, continuation_len=M, seed=3)
    assert a[:3] == plain[:3] and make_calibration_samples(tok, corpus, seed=3, **{**kw, "mix": None}) == plain
    assert {s.kind for s in evidence_of(a)} == set(KINDS)  # the kinds are cycled
    for s in a:
        assert len(s.context_ids) == N and len(s.continuation_ids) == M


def test_only_calibration_split_text(tok, corpus):
    samples = make_calibration_samples(
        tok, corpus, n_samples=8, context_len=N, continuation_len=M, seed=0, mix=parse_retrieval_mix(8)
    )
    calib = {d.id: d for d in split_corpus(corpus, "calib")}
    held_out = [d.title for d in split_corpus(corpus, "eval")]
    assert calib and held_out
    for s in samples:
        assert s.doc_id in calib
        doc_ids = encode_document(tok, calib[s.doc_id].text)
        prose = s.prose_ids()
        # the prose is consecutive tokens of the calibration document, from the window's offset
        assert prose == doc_ids[s.offset : s.offset + len(prose)]
        assert len(prose) == s.prose_context + M - s.filler_start
        text = tok.decode(s.context_ids + s.continuation_ids)
        assert not any(marker in text for marker in held_out)


def test_answer_is_in_the_continuation_and_only_in_the_evidence(tok, corpus):
    samples = make_calibration_samples(
        tok, corpus, n_samples=9, context_len=N, continuation_len=M, seed=1, mix=parse_retrieval_mix("1.0")
    )
    assert len(samples) == 9
    for s in samples:
        a, b = scored_span(s)
        answer_ids = s.continuation_ids[a:b]
        assert tok.decode(answer_ids) == f" {s.answer}" and tok.decode(s.continuation_ids[:a]) == query_text(
            s.kind, s.key
        )
        ctx = s.context_ids
        hits = [i for i in range(len(ctx)) if ctx[i : i + len(answer_ids)] == answer_ids]
        q0, q1 = s.evidence_spans[s.queried]
        assert len(hits) == 1 and q0 <= hits[0] < q1  # once, inside the queried statement
        assert tok.decode(ctx[q0:q1]) == " " + statement_text(s.kind, s.key, s.answer)
        # without the evidence the answer (and the queried key) is nowhere in the sample's prose
        prose = tok.decode(s.prose_ids())
        assert s.answer.casefold() not in prose.casefold() and s.key.casefold() not in prose.casefold()
        assert s.answer not in tok.decode(s.continuation_ids[:a])
        # the key names exactly one statement, and the distractors' answers differ
        keys = [k for k, _ in s.statements]
        assert keys.count(s.key) == 1 and [v for _, v in s.statements].count(s.answer) == 1
    prose = make_calibration_samples(tok, corpus, n_samples=2, context_len=N, continuation_len=M, seed=1)
    assert scored_span(prose[0]) == (0, M)


def _rendered(count: int = 300) -> list[str]:
    """Statements and queries of many draws of every kind."""
    import random

    rng = random.Random(0)
    out = []
    for kind in KINDS:
        for _ in range(count):
            key, value = ev.draw_pair(kind, rng)
            out += [statement_text(kind, key, value), query_text(kind, key) + f" {value}."]
    return out


def ruler_modules() -> list:
    """The ruler generator module, or every module of the package it became."""
    import importlib
    import pkgutil

    mods = [ruler]
    if hasattr(ruler, "__path__"):
        mods += [importlib.import_module(f"{ruler.__name__}.{m.name}") for m in pkgutil.iter_modules(ruler.__path__)]
    return mods


def ruler_constant(name: str):
    found = [vars(m)[name] for m in ruler_modules() if name in vars(m)]
    assert found, f"ruler's {name} moved: update this test"
    return found[0]


def test_no_template_key_format_or_vocabulary_shared_with_ruler():
    texts = _rendered()
    # ruler's needle / passkey / variable / word-list formats, and its key and value shapes, match nothing we write
    formats = [ruler_constant(n) for n in ("_NEEDLE_KV", "_PASSKEY", "_VT_STMT", "_CWE_ITEM")]
    formats += [re.compile(r"\b[a-z]+-[a-z]+\b"), re.compile(r"\b\d{5,7}\b"), re.compile(r"\b[A-Z]{5}\b")]
    for pattern in formats:
        assert not any(pattern.search(t) for t in texts), pattern.pattern
    # no shared vocabulary: none of ruler's key words (adjectives, nouns) in our word lists or texts
    ours = {
        w.casefold()
        for lst in (ev.COMMODITIES, ev.QUALIFIERS, ev.BUILDINGS, ev.FIRST_NAMES, ev.SURNAMES, ev.TOWNS)
        for w in lst
    }
    theirs = {w.casefold() for w in (*ruler_constant("ADJECTIVES"), *ruler_constant("NOUNS"))}
    assert len(theirs) > 100 and not ours & theirs
    words = {w.casefold() for t in texts for w in re.findall(r"[A-Za-z]+", t)}
    assert not words & theirs
    # no shared template text: no 3-word run of any of ruler's string constants (templates, preambles,
    # noise) appears in our texts, and none of our fixed phrases appears anywhere in ruler's source
    templates = []
    for mod in ruler_modules():
        for name, value in vars(mod).items():
            if name.lstrip("_")[:1].isupper():
                values = value.values() if isinstance(value, dict) else [value]
                templates += [v for v in values if isinstance(v, str)]
    assert any("special magic" in t for t in templates) and len(templates) >= 8
    ours_text = "\n".join(texts).casefold()
    for template in templates:
        tw = re.findall(r"[a-z]+", template.casefold())
        for k in range(len(tw) - 2):
            assert " ".join(tw[k : k + 3]) not in ours_text, template
    source = "".join(inspect.getsource(m) for m in ruler_modules()).casefold()
    for f in FORMATS.values():
        for phrase in (f.prefix.strip(), f.relation.strip()):
            if len(phrase) > 3:
                assert phrase.casefold() not in source, phrase


def test_mix_parsing_and_errors():
    assert parse_retrieval_mix("0") is None and parse_retrieval_mix(None) is None and parse_retrieval_mix("0.0") is None
    assert parse_retrieval_mix("0.5").evidence_samples(8) == 4 and parse_retrieval_mix("3").evidence_samples(8) == 3
    assert parse_retrieval_mix("25%").evidence_samples(8) == 2 and parse_retrieval_mix("1.0").evidence_samples(3) == 3
    assert parse_retrieval_mix("0.5").evidence_samples(3) == 2  # round half up
    for bad, words in [
        ("-1", "must not be negative"),
        ("1.5", "[0, 1]"),
        ("abc", "expected a count"),
        ("nan", "[0, 1]"),
        ("inf", "[0, 1]"),
    ]:
        with pytest.raises(DataError, match=re.escape(words)) as err:
            parse_retrieval_mix(bad)
        assert repr(bad) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="only 2 samples"):
        parse_retrieval_mix("3").evidence_samples(2)
    with pytest.raises(DataError, match="rounds to 0"):
        parse_retrieval_mix("0.1").evidence_samples(2)


def test_too_short_lengths_are_one_line_errors(tok, corpus):
    mix = parse_retrieval_mix(1)
    with pytest.raises(DataError, match="continuation_len 8 is too short"):
        make_calibration_samples(tok, corpus, n_samples=1, context_len=N, continuation_len=8, seed=0, mix=mix)
    with pytest.raises(DataError, match="context_len 100 is too short"):
        make_calibration_samples(tok, corpus, n_samples=1, context_len=100, continuation_len=M, seed=0, mix=mix)


# ------------------------------------------------------------------------------ collection
KW = dict(patterns=["snapkv", "streaming_llm"], budgets=[16, 64], journal=False)


@pytest.fixture(scope="module")
def tables(tok, corpus):
    model = tiny_model("llama", layers=2)
    mix = parse_retrieval_mix("0.5")
    prose = make_calibration_samples(tok, corpus, n_samples=4, context_len=N, continuation_len=M, seed=0)
    mixed = make_calibration_samples(tok, corpus, n_samples=4, context_len=N, continuation_len=M, seed=0, mix=mix)
    with torch.no_grad():
        t_prose = collect_signals(model, prose, **KW)
        t_mixed = collect_signals(model, mixed, provenance={"retrieval": describe_evidence(mixed, mix)}, **KW)
    return model, prose, mixed, t_prose, t_mixed


def test_collect_with_a_mix_records_it_and_changes_the_evidence_cells(tables):
    model, prose, mixed, t_prose, t_mixed = tables
    r = t_mixed.retrieval
    assert r["mix"] == "0.5" and r["evidence_samples"] == 2 and r["prose_samples"] == 2
    assert [s["index"] for s in r["samples"]] == [2, 3] and r["samples"][0]["scored"] == list(mixed[2].scored)
    key = t_mixed.provenance["collect_key"]
    assert key["scored"][:2] == [[0, M], [0, M]] and key["scored"][2] == list(mixed[2].scored)
    assert key["calibration"] != t_prose.provenance["collect_key"]["calibration"]
    assert t_prose.retrieval["evidence_samples"] == 0 and "scored" not in t_prose.provenance["collect_key"]
    # the prose samples' per-sample values are the same; the evidence samples' differ, and so do the cells
    for name in ("cosine", "dppl", "kl"):
        a, b = t_prose.per_sample_array(name), t_mixed.per_sample_array(name)
        np.testing.assert_allclose(a[..., :2], b[..., :2], rtol=1e-9, atol=1e-12)
        assert not np.allclose(a[..., 2:], b[..., 2:])
        assert not np.allclose(t_prose.signal_array(name), t_mixed.signal_array(name))
    assert t_mixed.is_complete() and t_mixed.has_uncertainty
    # the table is an ordinary table: it round-trips (version 2) with the mix in its provenance
    again = SignalTable.loads(t_mixed.dumps())
    assert again == t_mixed and again.retrieval == r


def test_parallel_tasks_score_the_same_positions(tables):
    model, _, mixed, _, t_mixed = tables
    with torch.no_grad():
        fanned = collect_signals(model, mixed, jobs=2, backend="sequential", **KW)
    for name in ("cosine", "dppl", "kl"):
        np.testing.assert_allclose(fanned.per_sample_array(name), t_mixed.per_sample_array(name), rtol=1e-9, atol=1e-9)
    assert fanned.provenance["collect_key"] == t_mixed.provenance["collect_key"]


def test_evidence_samples_are_scored_on_the_answer_tokens_exactly(tables):
    """Per-sample values and FullKV PPL equal an independent computation on the answer positions only."""
    from signals.naive import NaiveReference, naive_cell

    model, _, mixed, _, t_mixed = tables
    nll_full = []
    for s in mixed:
        a, b = scored_span(s)
        ids = torch.tensor([s.context_ids + s.continuation_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        targets = torch.tensor(s.continuation_ids)
        nll = -logp[N - 1 : N - 1 + M].gather(1, targets[:, None])[:, 0]
        nll_full.append(float(nll[a:b].mean()))
    assert t_mixed.full_ppl == pytest.approx(math.exp(np.mean(nll_full)), rel=1e-5)
    s = mixed[3]
    a, b = scored_span(s)
    ref = NaiveReference(model, s.context_ids, s.continuation_ids)
    for phase, layer in (("prefill", 0), ("decoding", 1)):
        cos, nll, kl = naive_cell(model, ref, s.context_ids, s.continuation_ids, layer, phase, "snapkv", 16)
        idx = (layer, t_mixed.phase_index(phase), t_mixed.pattern_index("snapkv"), t_mixed.budget_index(16), 3)
        assert t_mixed.per_sample_array("kl")[idx] == pytest.approx(float(kl[a:b].mean()), abs=1e-5)
        assert t_mixed.per_sample_array("cosine")[idx] == pytest.approx(float(cos[a:b].mean()), abs=1e-5)
        expected = math.exp(float(nll[a:b].mean())) - math.exp(float(ref.nll[a:b].mean()))
        assert t_mixed.per_sample_array("dppl")[idx] == pytest.approx(expected, rel=1e-4, abs=1e-4 * t_mixed.full_ppl)
    # the standard errors' units: min(4 blocks, scored tokens) per sample
    assert t_mixed.se_dof == sum(min(4, b - a) for a, b in map(scored_span, mixed)) - 1


def test_a_table_without_the_record_reads_as_prose_only(tables):
    t_prose = tables[3]
    data = t_prose.to_json()
    data["provenance"].pop("retrieval")
    old = SignalTable.from_json(data)
    assert old.retrieval["evidence_samples"] == 0 and old.retrieval["mix"] == "0"
