"""Haystack text and needles: sentence-aware slices of the caller's text, insertion depths, keys."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

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


def draw_distinct(draw, count: int, taken: set, what: str, population: int) -> list:
    """``count`` values of ``draw()`` not in ``taken`` (added to it), in a bounded loop.

    ``population`` is how many distinct values ``draw`` can give: a request beyond it (or a run of
    bad luck far beyond any reasonable one) is a ``ValueError`` naming ``what``, never an endless loop."""
    if count > population - len(taken):
        raise ValueError(f"cannot draw {count} distinct {what}: only {population} exist ({len(taken)} taken)")
    out: list = []
    for _ in range(100 * count + 1000):
        if len(out) == count:
            return out
        value = draw()
        if value not in taken:
            taken.add(value)
            out.append(value)
    if len(out) == count:
        return out
    raise ValueError(f"could not draw {count} distinct {what} (drew {len(out)})")


#: distinct values of :func:`random_key` and of 7-digit :func:`random_number`
KEY_POPULATION = len(ADJECTIVES) * len(NOUNS)
NUMBER_POPULATION = 9 * 10**6
