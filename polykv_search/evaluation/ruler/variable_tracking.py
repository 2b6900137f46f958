"""Variable tracking: follow chains of ``VAR X = VAR Y`` assignments hidden in noise."""

from __future__ import annotations

import random
import re
from typing import ClassVar

from polykv_search.evaluation.base import SampleCheckError
from polykv_search.evaluation.ruler.base import RulerTask, use_fewshot
from polykv_search.evaluation.ruler.haystack import (
    DEPTHS,
    NOISE,
    draw_distinct,
    haystack_of,
    insert_at_depths,
    split_sentences,
)
from polykv_search.evaluation.samples import Sample

_VALUES = 90000  # distinct five-digit values
_VT_STMT = re.compile(r"VAR ([A-Z]+) = (?:VAR ([A-Z]+)|(\d+))")

VT_CONTEXT = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
    "are assigned the value {query}, they are: "
)


class VariableTracking(RulerTask):
    """A chain VAR A = 12345, VAR B = VAR A, ... hidden among noise sentences (RULER vt)."""

    name = "ruler/vt"
    description = "variable tracking: 1 chain of 4 hops in repeated noise sentences"
    max_new_tokens = 30
    num_chains: ClassVar[int] = 1
    num_hops: ClassVar[int] = 4
    #: "noise" (RULER's default: repeated fixed sentences) or "text" (the caller's haystack).
    haystack: ClassVar[str] = "noise"
    #: RULER prepends one solved example; ``None`` does so from ``FEWSHOT_MIN_LEN`` tokens up.
    fewshot: ClassVar[bool | None] = None
    _unit_tokens_guess = 20.0  # one unit = one noise line

    @staticmethod
    def _names(rng, count: int, taken: set[str], k: int = 5) -> list[str]:
        letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        draw = lambda: "".join(rng.choice(letters) for _ in range(k))  # noqa: E731
        return draw_distinct(draw, count, taken, "variable names", len(letters) ** k)

    def _check_feasible(self) -> None:
        chains, names = self.num_chains, self.num_chains * (self.num_hops + 1)
        if chains < 1 or self.num_hops < 0:
            raise ValueError(f"{self.name}: needs chains >= 1 and hops >= 0, got {chains}, {self.num_hops}")
        if 2 * chains > _VALUES or 2 * names > 26**5:  # twice: the solved example draws its own
            raise ValueError(f"{self.name}: {chains} chains of {self.num_hops} hops need more distinct values or names")
        if self.haystack == "text" and names > len(DEPTHS):
            raise ValueError(f"{self.name}: {names} statements, but only {len(DEPTHS)} insertion depths")

    def _chains(self, rng, taken: set[str], value_taken: set[str]):
        chains, variables = [], []
        for _ in range(self.num_chains):
            names = self._names(rng, self.num_hops + 1, taken)
            (value,) = draw_distinct(lambda: str(rng.randint(10000, 99999)), 1, value_taken, "values", _VALUES)
            chain = [f"VAR {names[0]} = {value}"] + [
                f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(self.num_hops)
            ]
            chains.append(chain)
            variables.append(names)
        return chains, variables

    def _noise_context(self, rng, chains, n: int) -> str:
        sentences = [NOISE] * n
        for chain in chains:
            positions = sorted(rng.sample(range(len(sentences)), len(chain)))
            for j, pos in enumerate(positions):
                sentences.insert(pos + j, chain[j])
        return "\n".join(sentences).replace(". \n", ".\n")

    def _prepare(self, texts, context_len):
        return haystack_of(tuple(texts)) if self.haystack == "text" else None

    def _builder(self, rng, hay, index, seed, context_len):
        taken: set[str] = set()
        values: set[str] = set()
        chains, variables = self._chains(rng, taken, values)
        value = chains[0][0].split("=")[-1].strip()
        icl = ""
        if use_fewshot(self.fewshot, context_len):  # one solved example (other value and names)
            icl_chains, icl_vars = self._chains(rng, taken, values)
            icl_value = icl_chains[0][0].split("=")[-1].strip()
            icl = (
                VT_CONTEXT
                + self._noise_context(rng, icl_chains, 5)
                + "\n"
                + VT_QUESTION.format(query=icl_value)
                + VT_PREFIX.format(num_v=self.num_hops + 1, query=icl_value)
                + " ".join(icl_vars[0])
                + "\n"
            )
        start = hay.random_start(rng) if hay else 0
        depths = rng.sample(DEPTHS, sum(len(c) for c in chains)) if hay else []
        state = rng.getstate()  # every size tried draws the same insertion positions

        def build(n: int) -> Sample:
            if hay is None:
                local = random.Random()
                local.setstate(state)
                context = self._noise_context(local, chains, n)
            else:
                flat = [stmt.strip() + "." for chain in chains for stmt in chain]
                context = insert_at_depths(split_sentences(hay.take(start, n)), flat, depths)
            return self._sample(
                index,
                seed,
                context=icl + VT_CONTEXT + context + "\n",
                question=VT_QUESTION.format(query=value),
                answer_prefix=VT_PREFIX.format(num_v=self.num_hops + 1, query=value),
                answers=list(variables[0]),
                meta={"value": value, "chains": variables, "fewshot": bool(icl)},
            )

        return build

    @property
    def _min_size(self) -> int:  # type: ignore[override]
        return (self.num_hops + 1) * self.num_chains

    @staticmethod
    def resolve(text: str, value: str) -> list[str]:
        """All variables whose chain of assignments in ``text`` ends at ``value``."""
        assign: dict[str, str] = {}
        for name, ref, literal in _VT_STMT.findall(text):
            if name in assign:
                raise SampleCheckError(f"variable {name} assigned twice")
            assign[name] = ref or f"={literal}"

        def final(name: str, depth: int = 0) -> str | None:
            if depth > len(assign):
                raise SampleCheckError("cyclic assignment")
            target = assign.get(name)
            if target is None:
                return None
            return target[1:] if target.startswith("=") else final(target, depth + 1)

        return sorted(n for n in assign if final(n) == value)

    def check(self, sample: Sample) -> None:
        value = sample.meta["value"]
        if value not in sample.question:
            raise SampleCheckError(f"{sample.id}: value missing from the question")
        recovered = self.resolve(sample.context, value)
        if recovered != sorted(sample.answers):
            raise SampleCheckError(f"{sample.id}: context gives {recovered}, answers are {sample.answers}")
