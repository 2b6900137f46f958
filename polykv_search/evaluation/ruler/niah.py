"""Needle in a haystack: the passkey, multi-key, multi-value and multi-query forms."""

from __future__ import annotations

import re
from typing import ClassVar

from polykv_search.evaluation.base import SampleCheckError
from polykv_search.evaluation.ruler.base import RulerTask
from polykv_search.evaluation.ruler.haystack import (
    DEPTHS,
    KEY_POPULATION,
    NUMBER_POPULATION,
    draw_distinct,
    insert_at_depths,
    random_key,
    random_number,
    split_sentences,
)
from polykv_search.evaluation.samples import Sample

_NEEDLE_KV = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.")
_PASSKEY = re.compile(r"The special magic number is (\d+)\.")

NIAH_PREAMBLE = {
    True: "Some special magic {t}s are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {t}s afterwards.\n",
    False: "A special magic {t} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {t} afterwards.\n",
}


class NiahTask(RulerTask):
    """Needle(s) "One of the special magic numbers for KEY is: VALUE." in an essay haystack."""

    num_keys: ClassVar[int] = 1
    num_values: ClassVar[int] = 1
    num_queries: ClassVar[int] = 1
    _min_size = 1

    def _check_feasible(self) -> None:
        keys, values, queries = self.num_keys, self.num_values, self.num_queries
        if min(keys, values, queries) < 1 or queries > keys:
            raise ValueError(
                f"{self.name}: needs 1 <= queries <= keys and values >= 1, got {keys}, {values}, {queries}"
            )
        if keys > KEY_POPULATION:
            raise ValueError(f"{self.name}: {keys} keys, but only {KEY_POPULATION} distinct keys exist")
        if keys * values > len(DEPTHS):
            raise ValueError(f"{self.name}: {keys * values} needles, but only {len(DEPTHS)} insertion depths")

    def _builder(self, rng, hay, index, seed, context_len):
        keys = draw_distinct(lambda: random_key(rng), self.num_keys, set(), "keys", KEY_POPULATION)
        values: list[list[str]] = []
        seen: set[str] = set()
        needles = []
        for key in keys:
            vals = draw_distinct(lambda: random_number(rng, 7), self.num_values, seen, "values", NUMBER_POPULATION)
            needles += [f"One of the special magic numbers for {key} is: {v}." for v in vals]
            values.append(vals)
        rng.shuffle(needles)
        depths = rng.sample(DEPTHS, len(needles))
        queried = rng.sample(range(self.num_keys), self.num_queries)
        queries = [keys[i] for i in queried]
        answers = [v for i in queried for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        plural = self.num_queries * self.num_values > 1
        if plural:
            question = f"What are all the special magic numbers for {query} mentioned in the provided text?"
            prefix = f" The special magic numbers for {query} mentioned in the provided text are"
        else:
            question = f"What is the special magic number for {query} mentioned in the provided text?"
            prefix = f" The special magic number for {query} mentioned in the provided text is"
        preamble = NIAH_PREAMBLE[plural].format(t="number")
        start = hay.random_start(rng)

        def build(n: int) -> Sample:
            text = insert_at_depths(split_sentences(hay.take(start, n)), needles, depths)
            return self._sample(
                index,
                seed,
                context=preamble + text + "\n",
                question=question,
                answer_prefix=prefix,
                answers=list(answers),
                meta={"keys": keys, "values": values, "queries": queries, "depths": sorted(depths)},
            )

        return build

    def check(self, sample: Sample) -> None:
        found: dict[str, list[str]] = {}
        for key, value in _NEEDLE_KV.findall(sample.context):
            found.setdefault(key, []).append(value)
        if sample.context.count("special magic number") - 1 != sum(len(v) for v in found.values()):
            raise SampleCheckError(f"{sample.id}: stray or malformed needle text in the context")
        queries = sample.meta["queries"]
        for q in queries:
            if q not in sample.question:
                raise SampleCheckError(f"{sample.id}: query {q!r} missing from the question")
        recovered = [v for q in queries for v in sorted(found.get(q, []))]
        if sorted(recovered) != sorted(sample.answers) or len(set(recovered)) != len(recovered):
            raise SampleCheckError(f"{sample.id}: context gives {recovered}, answers are {sample.answers}")
        if len(found) != self.num_keys:
            raise SampleCheckError(f"{sample.id}: {len(found)} keys in the context, expected {self.num_keys}")


class NiahSingle(RulerTask):
    """Passkey: "The special magic number is N." (5-7 digits) hidden once in the haystack."""

    name = "ruler/niah_single"
    description = "passkey: one 5-7 digit 'special magic number' needle in a text haystack"
    max_new_tokens = 16

    def _builder(self, rng, hay, index, seed, context_len):
        value = random_number(rng, rng.randint(5, 7))
        needle = f"The special magic number is {value}."
        depth = rng.choice(DEPTHS)
        start = hay.random_start(rng)
        preamble = NIAH_PREAMBLE[False].format(t="number")

        def build(n: int) -> Sample:
            text = insert_at_depths(split_sentences(hay.take(start, n)), [needle], [depth])
            return self._sample(
                index,
                seed,
                context=preamble + text + "\n",
                question="What is the special magic number mentioned in the provided text?",
                answer_prefix=" The special magic number mentioned in the provided text is",
                answers=[value],
                meta={"depth": depth},
            )

        return build

    def check(self, sample: Sample) -> None:
        found = _PASSKEY.findall(sample.context)
        if len(found) != 1 or sample.context.count("special magic number") != 2:
            raise SampleCheckError(f"{sample.id}: expected exactly one needle, found {found}")
        if found != sample.answers or not 5 <= len(found[0]) <= 7:
            raise SampleCheckError(f"{sample.id}: context gives {found}, answers are {sample.answers}")


class NiahMultiKey(NiahTask):
    name = "ruler/niah_multikey"
    description = "4 keyed needles in a text haystack, one key queried"
    num_keys = 4
    max_new_tokens = 24


class NiahMultiValue(NiahTask):
    name = "ruler/niah_multivalue"
    description = "one key with 4 values hidden in a text haystack, all values asked"
    num_values = 4
    max_new_tokens = 64


class NiahMultiQuery(NiahTask):
    name = "ruler/niah_multiquery"
    description = "4 keyed needles in a text haystack, all 4 keys queried"
    num_keys = 4
    num_queries = 4
    max_new_tokens = 64
