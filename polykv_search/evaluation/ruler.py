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
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache
from typing import Any, Callable, ClassVar, Sequence

from polykv_search.evaluation.base import SampleCheckError, Task, as_texts, check_request, sample_rng
from polykv_search.evaluation.metrics import ruler_postprocess, string_match_all
from polykv_search.evaluation.samples import Sample, grow_to_fit, prompt_length

# RULER's insertion depths: 40 evenly spaced percentages.
DEPTHS = [round(i * 100 / 39) for i in range(40)]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

ADJECTIVES = (
    "abundant adorable agreeable amused ancient angry anxious arrogant ashamed average bewildered "
    "bitter blue brave breezy bright broad bumpy calm careful cheerful chilly clever clumsy cold "
    "colossal cool crooked cruel curious damp dark delightful dizzy drab dry eager early elegant "
    "empty faint fancy fierce filthy flat fluffy foolish fragile frantic gentle gifted gigantic "
    "glamorous gleaming glorious graceful grumpy handsome happy harsh helpful helpless hollow "
    "huge humble hungry icy itchy jealous jolly juicy kind large lazy little lively lonely long "
    "loud lucky magnificent massive mighty misty modern narrow nervous noisy obedient odd old "
    "orange plain plastic polite precious proud purple quaint quick quiet rapid rare red rich "
    "round rustic salty scary shallow sharp shiny short silly skinny slow small smooth soft "
    "sparkling spicy square steep sticky stormy strange strong sturdy swift tall tame tender "
    "thirsty tiny tough ugly vast violet warm wide wild witty wooden yellow young zealous"
).split()

NOUNS = (
    "acorn anchor apple arch badge bakery balloon banjo barn basket beacon bell bicycle blanket "
    "boat bonnet bottle bracelet bridge brush bucket button cabin cactus camel candle canoe "
    "canyon carpet castle cello chimney circus cliff clock cloud comet compass cottage crayon "
    "crown cushion daisy desert diamond dolphin dragon drum eagle easel engine falcon feather "
    "fence fiddle forest fountain garden giraffe glacier glove goblet harbor harp hammock helmet "
    "island jacket jungle kettle kite ladder lagoon lantern lemon lighthouse lizard magnet "
    "mango meadow mirror mitten monkey mountain needle nest oasis orchard otter paddle palace "
    "parrot pebble pencil piano pillow planet pocket puddle pumpkin quilt rabbit raft ribbon "
    "river rocket saddle sailboat scarf shell shovel spoon squirrel statue stream sunflower "
    "teapot temple thimble tiger tower tractor trumpet tulip tunnel turtle umbrella valley "
    "violin wagon walrus whistle window yacht zebra"
).split()

_SENT_END = re.compile(r"[.!?][\"')\]]*$")
_NEEDLE_KV = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.")
_PASSKEY = re.compile(r"The special magic number is (\d+)\.")
_VT_STMT = re.compile(r"VAR ([A-Z]+) = (?:VAR ([A-Z]+)|(\d+))")


# ============================================================================ haystack helpers
class Haystack:
    """Haystack words with sentence boundaries; slices wrap around the text."""

    def __init__(self, texts: Sequence[str]):
        words = " ".join(texts).split()
        if not words:
            raise ValueError("the haystack text is empty")
        self.words = words
        starts = [0] + [i + 1 for i, w in enumerate(words[:-1]) if _SENT_END.search(w)]
        self.sentence_starts = starts

    def random_start(self, rng) -> int:
        return rng.choice(self.sentence_starts)

    def take(self, start: int, n: int) -> list[str]:
        words, total = self.words, len(self.words)
        out: list[str] = []
        i = start % total
        while len(out) < n:
            chunk = words[i : i + n - len(out)]
            out.extend(chunk)
            i = 0
        return out


@lru_cache(maxsize=4)
def haystack_of(texts: tuple[str, ...]) -> Haystack:
    """:class:`Haystack` of ``texts``, cached (generators are called once per task and seed)."""
    return Haystack(texts)


def split_sentences(words: Sequence[str]) -> list[str]:
    sentences, current = [], []
    for w in words:
        current.append(w)
        if _SENT_END.search(w):
            sentences.append(" ".join(current))
            current = []
    if current:
        sentences.append(" ".join(current))
    return sentences


def insert_at_depths(sentences: list[str], needles: Sequence[str], depths: Sequence[int]) -> str:
    """RULER's insertion: needle i goes after ``int(len(sentences) * depth_i / 100)`` sentences."""
    positions = [0] + sorted(int(len(sentences) * d / 100) for d in depths) + [len(sentences)]
    parts = []
    for i in range(1, len(positions)):
        chunk = " ".join(sentences[positions[i - 1] : positions[i]])
        if chunk:
            parts.append(chunk)
        if i - 1 < len(needles):
            parts.append(needles[i - 1])
    return " ".join(parts)


def random_number(rng, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def random_key(rng) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


#: Below this context length (tokens) vt and cwe leave out RULER's solved example, which alone
#: takes a few hundred tokens.
FEWSHOT_MIN_LEN = 1024


def use_fewshot(setting: bool | None, context_len: int) -> bool:
    return context_len >= FEWSHOT_MIN_LEN if setting is None else bool(setting)


# ================================================================================ base class
class RulerTask(Task):
    suite: ClassVar[str] = "ruler"
    metric: ClassVar[str] = "string_match_all"
    #: Tokens per haystack unit (word, noise line, list word), a guess for the first size probe.
    _unit_tokens_guess: ClassVar[float] = 1.5

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        shared = self._prepare(as_texts(haystack_texts), context_len)
        samples = []
        for index in range(n_samples):
            rng = sample_rng(seed, self.name, index)
            build = self._builder(rng, shared, index, seed, context_len)
            measure = lambda s: prompt_length(tokenizer, s)  # noqa: E731
            guess = int(context_len / self._unit_tokens_guess) + 1
            sample, size = grow_to_fit(build, measure, context_len, self._min_size, guess)
            sample.meta["haystack_size"] = size
            sample.meta["prompt_tokens"] = measure(sample)
            sample.meta["context_len"] = context_len
            self.check(sample)
            samples.append(sample)
        return samples

    _min_size: ClassVar[int] = 1

    def _prepare(self, texts: list[str], context_len: int) -> Any:
        """State shared by all samples of one generation (default: the haystack)."""
        return haystack_of(tuple(texts))

    def _builder(self, rng, shared: Any, index: int, seed: int, context_len: int) -> Callable[[int], Sample]:
        """Draw the sample's random choices from ``rng``; return ``size -> Sample``."""
        raise NotImplementedError

    def _sample(self, index: int, seed: int, **fields: Any) -> Sample:
        fields.setdefault("max_new_tokens", self.max_new_tokens)
        return Sample(id=f"{self.name}:{seed}:{index}", task=self.name, **fields)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> float:
        return string_match_all([ruler_postprocess(p) for p in predictions], [s.answers for s in samples])


# ====================================================================================== NIAH
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

    def _builder(self, rng, hay, index, seed, context_len):
        keys: list[str] = []
        while len(keys) < self.num_keys:
            k = random_key(rng)
            if k not in keys:
                keys.append(k)
        values: list[list[str]] = []
        seen: set[str] = set()
        needles = []
        for key in keys:
            vals = []
            while len(vals) < self.num_values:
                v = random_number(rng, 7)
                if v not in seen:
                    seen.add(v)
                    vals.append(v)
                    needles.append(f"One of the special magic numbers for {key} is: {v}.")
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


# ======================================================================== variable tracking
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
        names: list[str] = []
        while len(names) < count:
            v = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(k))
            if v not in taken:
                taken.add(v)
                names.append(v)
        return names

    def _chains(self, rng, taken: set[str], value_taken: set[str]):
        chains, variables = [], []
        for _ in range(self.num_chains):
            names = self._names(rng, self.num_hops + 1, taken)
            while True:
                value = str(rng.randint(10000, 99999))
                if value not in value_taken:
                    value_taken.add(value)
                    break
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
                VT_CONTEXT + self._noise_context(rng, icl_chains, 5) + "\n"
                + VT_QUESTION.format(query=icl_value)
                + VT_PREFIX.format(num_v=self.num_hops + 1, query=icl_value)
                + " ".join(icl_vars[0]) + "\n"
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


# ==================================================================== common words extraction
CWE_CONTEXT = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
CWE_QUESTION = "Question: What are the {num_cw} most common words in the above list?"
CWE_PREFIX = " Answer: The top {num_cw} words that appear most often in the list are:"
_CWE_WORD = re.compile(r"^[a-z]{3,12}$")
_CWE_ITEM = re.compile(r"(\d+)\. ([a-z]+)")


_PSEUDO: list[str] = []


def pseudo_words(count: int) -> list[str]:
    """The first ``count`` of a fixed sequence of pronounceable made-up words (CVCV...)."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    if len(_PSEUDO) < count:
        rng = random.Random(20240406)
        seen: set[str] = set()
        _PSEUDO.clear()
        while len(_PSEUDO) < count:
            w = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))
            if w not in seen:
                seen.add(w)
                _PSEUDO.append(w)
    return _PSEUDO[:count]


@lru_cache(maxsize=4)
def _vocabulary(texts: tuple[str, ...]) -> tuple[str, ...]:
    words = {w for t in texts for w in t.split() if _CWE_WORD.match(w)}
    words.update(w for w in ADJECTIVES + NOUNS if _CWE_WORD.match(w))
    return tuple(sorted(words))


class CommonWordsExtraction(RulerTask):
    """Numbered word list where 10 words repeat most often; name them (RULER cwe)."""

    name = "ruler/cwe"
    description = "common words extraction: the 10 most frequent words of a numbered list"
    max_new_tokens = 120
    num_cw: ClassVar[int] = 10
    freq_cw: ClassVar[int] = 30
    freq_ucw: ClassVar[int] = 3
    #: RULER's settings below 4096 tokens: (common, uncommon) repeats 6 and 1.
    short_freq: ClassVar[tuple[int, int]] = (6, 1)
    short_threshold: ClassVar[int] = 4096
    #: RULER prepends one solved example; ``None`` does so from ``FEWSHOT_MIN_LEN`` tokens up.
    fewshot: ClassVar[bool | None] = None
    _unit_tokens_guess = 4.0

    @property
    def _min_size(self) -> int:  # type: ignore[override]
        return self.num_cw + 1

    @staticmethod
    def vocabulary(texts: Sequence[str]) -> list[str]:
        """Lowercase words (3-12 letters) of the haystack plus the built-in word lists, sorted."""
        return list(_vocabulary(tuple(texts)))

    def _example(self, rng, vocab: list[str], num_words: int, common_reps: int, uncommon_reps: int):
        if num_words <= len(vocab):
            chosen = rng.sample(vocab, num_words)
        else:  # vocabulary too small: made-up words fill the uncommon tail
            known = set(vocab)
            extra = [w for w in pseudo_words(2 * num_words) if w not in known][: num_words - len(vocab)]
            chosen = rng.sample(vocab, len(vocab)) + extra
        common, uncommon = chosen[: self.num_cw], chosen[self.num_cw :]
        word_list = common * common_reps + uncommon * uncommon_reps
        rng.shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def _prepare(self, texts, context_len):
        return self.vocabulary(texts)

    def _builder(self, rng, vocab, index, seed, context_len):
        question = CWE_QUESTION.format(num_cw=self.num_cw)
        prefix = CWE_PREFIX.format(num_cw=self.num_cw)
        short = context_len < self.short_threshold
        reps = self.short_freq if short else (self.freq_cw, self.freq_ucw)
        state = rng.getstate()

        def build(n: int) -> Sample:
            local = random.Random()
            local.setstate(state)
            shots = ""
            if use_fewshot(self.fewshot, context_len):  # one solved example, smaller below 4096
                ctx, ans = self._example(local, vocab, 20, 3, 1) if short else self._example(local, vocab, 40, 10, 3)
                shots = (
                    CWE_CONTEXT + ctx + "\n" + question + prefix + " "
                    + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ans)) + "\n"
                )
            ctx, answers = self._example(local, vocab, n, *reps)
            return self._sample(
                index,
                seed,
                context=shots + CWE_CONTEXT + ctx + "\n",
                question=question,
                answer_prefix=prefix,
                answers=list(answers),
                meta={"repeats": list(reps), "fewshot": bool(shots)},
            )

        return build

    def check(self, sample: Sample) -> None:
        main = sample.context[sample.context.rfind(CWE_CONTEXT) + len(CWE_CONTEXT) :]
        items = _CWE_ITEM.findall(main)
        if [int(i) for i, _ in items] != list(range(1, len(items) + 1)):
            raise SampleCheckError(f"{sample.id}: list numbering is broken")
        counts = Counter(w for _, w in items).most_common()
        if len(counts) <= self.num_cw:
            raise SampleCheckError(f"{sample.id}: too few distinct words")
        top = counts[: self.num_cw]
        if top[-1][1] <= counts[self.num_cw][1]:
            raise SampleCheckError(f"{sample.id}: no clear top {self.num_cw}")
        if sorted(w for w, _ in top) != sorted(sample.answers):
            raise SampleCheckError(f"{sample.id}: context gives {top}, answers are {sample.answers}")


RULER_TASKS: tuple[type[RulerTask], ...] = (
    NiahSingle,
    NiahMultiKey,
    NiahMultiValue,
    NiahMultiQuery,
    VariableTracking,
    CommonWordsExtraction,
)
