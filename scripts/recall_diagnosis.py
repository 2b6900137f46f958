"""Where do a decoding plan's prompt facts go? Kept fact tokens per layer and KV head on calibration recall samples.

For ``decode/recall`` samples drawn from the calibration split (never the evaluation one), FullKV generates
``--generate-len`` tokens; every plan is then teacher-forced along them (as the decode suite does), and after
the prefill and at a few generated steps the script records, per layer and KV head, which of the asked fact's
value tokens (the digits of its number), its name tokens, its whole statement and the other facts' tokens are
still cached. Then the question follows and the plan answers. Writes a JSON file and prints a table. Besides the
registered patterns it runs the diagnosis-only plans ``oracle_facts``, ``oracle_values`` and ``surprisal`` (the
question-free scores of ``scripts/surprisal_scores.py``; docs/decode.md, "Keeping the facts").

    python scripts/recall_diagnosis.py --samples 4 --budget 128 --generate-len 256 \\
        --plan "kvzip[allocation=model,evidence=0.5]" --plan evidence --out diag.json
    python scripts/recall_diagnosis.py --first 4 --samples 4 --threads 1 \\
        --plan "surprisal[unit=sentence,word=rest,sinks=4,share=0.75]" --out carry.json
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polykv_search.cli.arg_types import non_negative_int, positive_int  # noqa: E402
from polykv_search.cli.baselines import baseline  # noqa: E402
from polykv_search.data import load_corpus, split_corpus  # noqa: E402
from polykv_search.evaluation import get_task  # noqa: E402
from polykv_search.evaluation.base import split_seed  # noqa: E402
from polykv_search.evaluation.runner import _Caller, eos_token_ids  # noqa: E402
from polykv_search.evaluation.samples import encode_prompt  # noqa: E402
from polykv_search.evaluation.trajectory import TrajectoryMeter, answer, full_trajectory  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.models import load_model  # noqa: E402
from polykv_search.patterns import PATTERNS  # noqa: E402
from polykv_search.patterns.evidence import Evidence  # noqa: E402
from polykv_search.runtime import apply_strategy  # noqa: E402
from scripts.surprisal_scores import (  # noqa: E402
    carried,
    prompt_surprisal,
    rank_of,
    sentence_ids,
    token_kinds,
    word_ids,
    word_sums,
)

#: The prompt slots of the facts, for the diagnostic ``oracle_facts`` plan (an upper bound, not a pattern to ship),
#: and of the facts' numbers alone, for ``oracle_values``.
FACTS: set[int] = set()
VALUES: set[int] = set()


@dataclass(frozen=True)
class OracleFacts(Evidence):
    """Diagnosis only: the ``evidence`` share scored 1 on the facts' tokens and 0 elsewhere (what a perfect score
    would keep), so a plan that keeps the facts in every head can be told apart from one that loses them."""

    name: ClassVar[str] = "oracle_facts"

    def post_kernel(self, layer, state, query) -> None:
        first = "evidence" not in state.token
        super().post_kernel(layer, state, query)
        if first:
            mark = torch.zeros_like(state.token["evidence"])
            mark[..., sorted(self.marked())] = 1.0
            state.token["evidence"] = mark

    def marked(self) -> set[int]:
        return FACTS


@dataclass(frozen=True)
class OracleValues(OracleFacts):
    """Diagnosis only: as ``oracle_facts``, the share scored 1 on the four facts' numbers alone (their names and
    "The secret number of ... is" left to the rule), to tell whether a kept number answers without its statement."""

    name: ClassVar[str] = "oracle_values"

    def marked(self) -> set[int]:
        return VALUES


PATTERNS["oracle_facts"] = OracleFacts
PATTERNS["oracle_values"] = OracleValues

#: FullKV's next-token loss of every prompt token (nats; the first token 0) and the prompt's word starts, for the
#: diagnostic ``surprisal`` plans (question-free; diagnosis only until a model-level hook hands the logits over).
SURPRISAL: dict[str, torch.Tensor] = {}


@dataclass(frozen=True)
class Surprisal(Evidence):
    """Diagnosis only: the ``evidence`` share scored by FullKV's surprisal of each prompt token (``unit="token"``),
    by its word's summed surprisal (``unit="word"``; Li et al., EMNLP 2023, https://arxiv.org/abs/2310.06201), or
    by the highest word score of its sentence (``unit="sentence"``; ``word``: ``sum``, ``tail``, the word's
    tokens after its first, or ``rest``, after its first visible one), the first ``sinks`` tokens ranked first;
    the same ranking in every head."""

    name: ClassVar[str] = "surprisal"
    unit: str = "token"
    word: str = "sum"
    sinks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.unit not in ("token", "word", "sentence"):
            raise ValueError(f"unit must be token, word or sentence, got {self.unit!r}")
        if self.word not in ("sum", "tail", "rest"):
            raise ValueError(f"word must be sum, tail or rest, got {self.word!r}")
        if self.unit != "sentence" and (self.word != "sum" or self.sinks):
            raise ValueError("word and sinks apply to unit=sentence only")

    def prompt_score(self) -> torch.Tensor:
        """This plan's score of every prompt token, from :data:`SURPRISAL`."""
        per_token, words = SURPRISAL["token"], SURPRISAL["words"]
        if self.unit == "token":
            return per_token
        if self.unit == "word":
            return word_sums(per_token, words)
        return carried(per_token, words, SURPRISAL["sentences"], self.word, self.sinks, SURPRISAL["kinds"])

    def post_kernel(self, layer, state, query) -> None:
        first = "evidence" not in state.token
        super().post_kernel(layer, state, query)
        if first:
            mark = state.token["evidence"]
            score = self.prompt_score().to(mark)[: mark.shape[-1]]
            state.token["evidence"] = score.expand_as(mark).masked_fill(~layer.valid, 0.0)


PATTERNS["surprisal"] = Surprisal


def fact_spans(tokenizer, ids: list[int], facts: list[str], asked: str, answer_text: str) -> dict[str, list[int]]:
    """Token indices of the asked fact's number, its name, and every fact's tokens (by character offsets)."""
    text, starts = "", []
    for i in ids:
        starts.append(len(text))
        text += tokenizer.decode([i])
    ends = starts[1:] + [len(text)]

    def tokens(lo: int, hi: int) -> list[int]:
        return [k for k, (a, b) in enumerate(zip(starts, ends)) if a < hi and b > lo]

    out = {"value": [], "name": [], "statement": [], "facts": [], "values": []}
    for fact in facts:
        at = text.find(fact)
        if at < 0:
            raise ValueError(f"fact {fact!r} not found in the decoded prompt")
        out["facts"] += tokens(at, at + len(fact))
        number = fact.rsplit(" ", 1)[-1].rstrip(".")
        v = fact.rindex(number)
        out["values"] += tokens(at + v, at + v + len(number))
        if f" {asked} " in fact:
            v = fact.index(answer_text)
            out["value"] = tokens(at + v, at + v + len(answer_text))
            n = fact.index(asked)
            out["name"] = tokens(at + n, at + n + len(asked))
            out["statement"] = tokens(at, at + len(fact))
    return out


def kept_positions(cache) -> list[list[set[int]]]:
    """Per layer, per KV head, the absolute positions of the cached tokens (row 0)."""
    out = []
    for layer in cache.layers:
        heads: dict[int, set[int]] = {}
        for cell, which in layer.cells():  # a pooled layer is one head group per KV head
            pos, valid = cell.positions[0], cell.valid[0]
            for h in range(pos.shape[0]):
                heads[h if which is None else which[h]] = set(pos[h][valid[h]].tolist())
        out.append([heads[h] for h in sorted(heads)])
    return out


def survival(kept: list[list[set[int]]], spans: dict[str, list[int]], prompt_len: int) -> dict:
    """Shares of the spans' tokens kept, per layer (mean over heads), and the heads keeping the whole number."""
    per_layer = {k: [] for k in spans}
    whole, stated = [], []
    prompt = []
    for heads in kept:
        for k, idx in spans.items():
            per_layer[k].append(sum(len(set(idx) & h) / max(1, len(idx)) for h in heads) / len(heads))
        whole.append(sum(set(spans["value"]) <= h for h in heads))
        stated.append(sum(set(spans["statement"]) <= h for h in heads))
        prompt.append(sum(sum(p < prompt_len for p in h) for h in heads) / len(heads))
    return {
        **{f"{k}_kept": [round(v, 3) for v in vals] for k, vals in per_layer.items()},
        "heads_with_whole_value": whole,
        "heads_with_whole_statement": stated,
        "prompt_tokens_per_head": [round(v, 1) for v in prompt],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--samples", type=positive_int, default=4)
    p.add_argument("--first", type=non_negative_int, default=0, help="first calibration sample index")
    p.add_argument("--context-len", type=int, default=512)
    p.add_argument("--generate-len", type=int, default=256)
    p.add_argument("--budget", type=float, default=128)
    p.add_argument("--plan", action="append", required=True, help="a pattern spec, used uniformly")
    p.add_argument("--steps", default="0,64,128,256", help="generated steps at which the cache is inspected")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="decode/recall")
    p.add_argument("--prefill-only", action="store_true", help="inspect the cache after the prefill alone (cheap)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (1 wastes less CPU on a busy machine)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    steps = sorted({int(s) for s in args.steps.split(",")})
    torch.set_num_threads(args.threads)
    model, tok = load_model()
    L = model.config.num_hidden_layers
    texts = [d.text for d in split_corpus(load_corpus("austen"), "calib")]
    task = get_task(args.task, generate_len=args.generate_len)
    seed = split_seed(args.seed, "calib")
    samples = task.generate(tok, texts, args.first + args.samples, args.context_len, seed)[args.first :]
    caller = _Caller(model)
    banned = frozenset(eos_token_ids(model, tok))
    entries = [baseline(f"uniform:{plan}", L, args.budget) for plan in args.plan]
    results = []
    for sample in samples:
        context_ids, question_ids = encode_prompt(tok, sample, None)
        spans = fact_spans(tok, context_ids, sample.meta["facts"], sample.meta["asked"], sample.answers[0])
        ranks = {}
        if any(plan.startswith("surprisal") for plan in args.plan):
            SURPRISAL["token"] = prompt_surprisal(model, context_ids)
            SURPRISAL["words"] = word_ids(tok, context_ids)
            SURPRISAL["sentences"] = sentence_ids(tok, context_ids)
            SURPRISAL["kinds"] = token_kinds(tok, context_ids)
            per_token, words, sentences = SURPRISAL["token"], SURPRISAL["words"], SURPRISAL["sentences"]
            ranks = {
                "surprisal": [round(float(SURPRISAL["token"][k]), 3) for k in spans["value"]],
                "rank_token": rank_of(SURPRISAL["token"], spans["value"]),
                "rank_word": rank_of(word_sums(per_token, words), spans["value"]),
                **{  # the last of the asked statement's tokens to enter the share, with the 4 sinks protected
                    f"statement_rank_sentence_{w}": max(
                        rank_of(carried(per_token, words, sentences, w, 4, SURPRISAL["kinds"]), spans["statement"])
                    )
                    for w in ("sum", "tail", "rest")
                },
            }
            print(f"{sample.id}: the asked number's tokens (ranks of {len(context_ids)}, 0 = most surprising) {ranks}")
        t0 = time.perf_counter()
        if args.prefill_only:
            rec = {"id": sample.id, "prompt_len": len(context_ids), "spans": spans, "surprisal": ranks, "plans": {}}
            for entry in entries:
                FACTS.clear()
                FACTS.update(spans["facts"])
                VALUES.clear()
                VALUES.update(spans["values"])
                with apply_strategy(model, entry.strategy), torch.inference_mode():
                    cache = caller.prefill(context_ids).cache
                    snap = survival(kept_positions(cache), spans, len(context_ids))
                rec["plans"][entry.name] = {"steps": {0: snap}}
                print(
                    f"  {entry.name}: value kept per layer {[round(v, 2) for v in snap['value_kept']]}; "
                    f"facts kept (mean) {sum(snap['facts_kept']) / L:.2f}; whole value in "
                    f"{sum(snap['heads_with_whole_value'])} heads"
                )
            results.append(rec)
            write_json(args.out, {"args": vars(args), "samples": results})
            continue
        saved = Path(args.out).with_name(f"traj-{sample.id.replace('/', '_').replace(':', '_')}-{args.generate_len}.pt")
        if saved.exists():  # FullKV's trajectory of this calibration sample, from an earlier run
            traj = torch.load(saved, weights_only=False)
        else:
            traj = full_trajectory(caller, context_ids, args.generate_len, banned, question_ids, task.max_new_tokens)
            traj.cache = None
            torch.save(traj, saved)
        rec = {
            "id": sample.id,
            "prompt_len": len(context_ids),
            "spans": spans,
            "truth": sample.answers[0],
            "full": tok.decode(traj.answer_ids, skip_special_tokens=True),
            "surprisal": ranks,
            "plans": {},
        }
        print(f"{sample.id}: FullKV {rec['full']!r} (truth {sample.answers[0]}) {time.perf_counter() - t0:.0f}s")
        for entry in entries:
            FACTS.clear()
            FACTS.update(spans["facts"])
            VALUES.clear()
            VALUES.update(spans["values"])
            snaps = {}
            meter = TrajectoryMeter(traj, 1, banned)  # the trajectory's KL(FullKV || plan), as the decode suite's
            with apply_strategy(model, entry.strategy), torch.inference_mode():
                out = caller.prefill(context_ids)
                cache = out.cache
                meter.add(0, out.logits[:, -1])
                if 0 in steps:
                    snaps[0] = survival(kept_positions(cache), spans, len(context_ids))
                for t in range(1, args.generate_len + 1):
                    logits = caller.extend([traj.tokens[t - 1]], cache).logits[:, -1]
                    if t < args.generate_len:
                        meter.add(t, logits)
                    if t in steps:
                        snaps[t] = survival(kept_positions(cache), spans, len(context_ids))
                step = lambda ids: caller.extend(ids, cache).logits[:, -1]  # noqa: E731
                ids = answer(step, question_ids, logits, task.max_new_tokens, banned)
            said = tok.decode(ids, skip_special_tokens=True)
            kl = meter.outcome(0)["kl"]
            hit = task.number(said) == sample.answers[0]
            rec["plans"][entry.name] = {"answer": said, "hit": hit, "kl": kl, "steps": snaps}
            last = snaps[max(snaps)]
            print(
                f"  {entry.name}: {said!r} (hit {hit}, trajectory KL {kl:.4f}); value kept (mean over layers) "
                + ", ".join(f"t={t}: {sum(s['value_kept']) / L:.2f}" for t, s in snaps.items())
                + f"; heads with whole value at end {sum(last['heads_with_whole_value'])}"
            )
        results.append(rec)
        write_json(args.out, {"args": vars(args), "samples": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
