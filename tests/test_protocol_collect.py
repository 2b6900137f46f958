"""The protocols outside `score`: `collect --question-aware` evidence samples (the query inside the
compressed prompt), recorded in the signal table; `reproduce.py --question-aware` plans and files."""

from __future__ import annotations

import json

from test_retrieval_calibration import (
    M,
    N,
    char_tokenizer,
    one_thread,  # noqa: F401  (autouse: one intra-op thread)
    toy_corpus,
)
from test_retrieval_calibration_cli import checkpoint, cli_argv  # noqa: F401  (the tiny model fixture)

from polykv_search.data.evidence import (
    EvidenceSample,
    describe_evidence,
    make_calibration_samples,
    parse_retrieval_mix,
    query_text,
    scored_span,
)
from polykv_search.protocol import AGNOSTIC, AWARE
from signals import SignalTable
from signals.journal import journal_path


def test_question_aware_evidence_closes_the_context_with_its_query():
    tok, corpus, mix = char_tokenizer(), toy_corpus(), parse_retrieval_mix("0.5")
    kw = dict(n_samples=6, context_len=N, continuation_len=M, seed=2, mix=mix)
    agnostic = make_calibration_samples(tok, corpus, **kw)
    aware = make_calibration_samples(tok, corpus, **kw, protocol=AWARE)
    assert aware[:3] == agnostic[:3]  # prose samples have no query: the same
    pairs = [(a, b) for a, b in zip(agnostic, aware) if isinstance(b, EvidenceSample)]
    assert len(pairs) == 3
    for a, b in pairs:
        assert len(b.context_ids) == N and len(b.continuation_ids) == M and b.protocol == AWARE
        assert (a.kind, a.statements, a.queried, a.protocol) == (b.kind, b.statements, b.queried, AGNOSTIC)
        query = tok.decode(a.continuation_ids[: scored_span(a)[0]])
        assert query == query_text(b.kind, b.key) and tok.decode(b.context_ids).endswith(query)
        start, end = scored_span(b)
        assert start == 0 and tok.decode(b.continuation_ids[start:end]) == f" {b.answer}"
        assert b.continuation_ids[start:end] == a.continuation_ids[slice(*scored_span(a))]
        assert b.prose_ids() == a.prose_ids()  # the same prose; only where the query sits moves
        answer = b.continuation_ids[start:end]
        hits = [i for i in range(N) if b.context_ids[i : i + len(answer)] == answer]
        q0, q1 = b.evidence_spans[b.queried]
        assert len(hits) == 1 and q0 <= hits[0] < q1
    assert describe_evidence(aware, mix)["protocol"] == AWARE
    assert describe_evidence(agnostic, mix)["protocol"] == AGNOSTIC
    assert "protocol" not in describe_evidence(agnostic[:3])  # prose only: no query anywhere


def test_cli_collect_question_aware_records_it(checkpoint, tmp_path):  # noqa: F811
    from polykv_search.cli import main

    ckpt, corpus = checkpoint
    tables = {}
    for name, extra in (("agnostic", []), ("aware", ["--question-aware"])):
        out = tmp_path / f"{name}.json"
        assert main(cli_argv(ckpt, corpus, out, "--retrieval-mix", "1", *extra)) == 0
        tables[name] = SignalTable.load(out)
    assert tables["aware"].retrieval["protocol"] == AWARE and tables["agnostic"].retrieval["protocol"] == AGNOSTIC
    scored = [r.retrieval["samples"][0]["scored"] for r in (tables["agnostic"], tables["aware"])]
    assert scored[1][0] == 0 and scored[0][0] > 0 and scored[0][1] - scored[0][0] == scored[1][1] - scored[1][0]
    keys = [t.provenance["collect_key"] for t in tables.values()]
    assert keys[0]["calibration"] != keys[1]["calibration"]  # a journal of one is refused by the other


def test_cli_collect_question_aware_without_evidence_is_one_line_exit_2(checkpoint, tmp_path, capsys):  # noqa: F811
    from polykv_search.cli import main

    ckpt, corpus = checkpoint
    out = tmp_path / "signals.json"
    assert main(cli_argv(ckpt, corpus, out, "--question-aware")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--question-aware" in err[0] and "--retrieval-mix" in err[0]
    assert not out.exists() and not journal_path(out).exists()


def test_reproduce_question_aware_scores_into_files_of_its_own(reproduce, tmp_path):
    args = reproduce.parse_args(["--out", str(tmp_path), "--suite", "ruler", "--budgets", "256", "--question-aware"])
    (score,) = [s for s in reproduce.plan(args) if s.argv[0] == "score"]
    assert "--question-aware" in score.argv and score.target == tmp_path / "results-B256-qa.json"
    assert score.argv[score.argv.index("--out") + 1] == str(score.target)
    compare = reproduce.plan(args)[-1].argv
    assert str(tmp_path / "results-B256-qa.json") in compare and str(tmp_path / "results-B256.json") not in compare
    strategy = tmp_path / "ilp-B256.json"
    settings = {"suite": "ruler", "samples": 16, "context_len": 2048, "seed": 0}
    argv = ["score", "--suite", "ruler", "--samples", "16", "--context-len", "2048", "--seed", "0"]
    for protocol, flags, reused in ((None, [], True), (None, ["--question-aware"], False), (AWARE, [], False)):
        prov = {"settings": settings, **({"protocol": protocol} if protocol else {})}
        score.target.write_text(json.dumps({"entries": [{"source": str(strategy)}], "provenance": prov}))
        assert reproduce._results_cover(score.target, [strategy], [*argv, *flags]) == reused
    prov["protocol"] = AWARE
    score.target.write_text(json.dumps({"entries": [{"source": str(strategy)}], "provenance": prov}))
    assert reproduce._results_cover(score.target, [strategy], [*argv, "--question-aware"])
