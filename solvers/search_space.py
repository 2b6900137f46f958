"""The whole-model search's space: a strategy's optimized phases as budget *slots*, and the moves between them.

Slots
    A layer-level phase has one slot per layer: ``(pattern, budget)``, the pattern as ``(name, params as JSON)``
    exactly as the strategy writes it (an unchanged slot is written back unchanged). A phase where any layer has
    head groups (a head-level strategy) has one slot per (layer, KV head), the layer's budget being the mean of
    its heads' (each capped at the strategy's ``context_len``, as :mod:`strategies.head_groups` counts it). In
    both, the phase's total ``Σ_l b_l`` is the sum of the slot budgets divided by the slots per layer, so moving
    whole tokens between slots keeps the total exactly. ``full`` slots (keep-all heads) are never moved.

Moves (EvolKV-style, over ``blocks`` contiguous groups of layers: a low-dimensional parametrization)
    * ``budget``: every movable slot of block A gives ``step`` tokens (never going below ``b_min`` for a layer,
      1 for a head), and the tokens taken are shared evenly by block B's movable slots (capped at
      ``max_budget`` / the context length); a move between pooled slots only (``kvzip[allocation=model]``,
      one ranking at the sum of their budgets) changes nothing and is skipped;
    * ``fill``: budget left unused (``floor(L·B)`` minus the phase's sum) is shared by block B's slots;
    * ``pattern``: block A's movable slots with pattern X take pattern P, budgets unchanged (in a layer-level
      phase, the layers of A that use X; in a head-level one, those heads, so a block's other heads keep theirs).
    * ``weight`` / ``floor`` / ``cap`` (only with ``priors``; pool priors, issue 59): block A's slots in a
      model-wide pool (``kvzip[allocation=model]``) multiply their ``weight`` by 2 or 1/2 (3 significant digits,
      within [1/64, 64]; a per-head tuple, each value), move their ``floor`` by ``step`` tokens up or down (within
      [0, b], at most a cap), or tighten or loosen their ``cap`` (per KV head, along the ladder *none, b, b − step,
      b − 2·step, ...*, never below the head's floor or 1: tightening sets a head with no cap to its budget ``b``,
      then takes ``step`` tokens; loosening gives ``step`` back up to ``b``, and lifts a cap of ``b`` or more). The
      slots keep the pool (:meth:`~polykv_search.patterns.base.Pattern.pool_identity`) and their budgets; a slot
      whose prior moved is no longer matched by ``pattern`` moves (its spec is another).

Every move keeps ``Σ_l b_l <= floor(L·B)`` and ``b_l >= b_min`` by construction; :func:`check_budgets` checks
it on every strategy the search builds. Phases that follow another phase (head-level plans,
``phases_following``) are rebuilt from it; phases that are not searched keep the start's choices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from polykv_search.patterns import PATTERNS, canonical_spec, checked_params, make_pattern, pattern_spec
from solvers.problem import Problem, layer_budgets
from solvers.settings import SolverError
from strategies.head_groups import group_heads
from strategies.pattern_spec import spec_label
from strategies.strategy import PHASES, LayerChoice, Strategy

Key = tuple[str, str]  #: (pattern name, its params as sorted JSON)
#: The pool priors the search may move (``priors``).
PRIOR_MOVES = ("weight", "floor", "cap")
Slot = tuple[Key, int]  #: (pattern, budget)
Slots = tuple[tuple[Slot, ...], ...]  #: per layer, one slot (layer level) or one per KV head


@dataclass(frozen=True)
class Move:
    """One change of the searched strategy (module docstring)."""

    kind: str  #: "budget", "fill", "pattern", "weight", "floor" or "cap"
    phase: str
    target: int  #: block that receives budget, or takes the pattern
    source: int | None = None  #: block that gives budget ("budget")
    pattern: str | None = None  #: the pattern taken ("pattern")
    replaces: str | None = None  #: the pattern it replaces ("pattern")
    #: the weight's factor ("weight"), the floor's change in tokens ("floor"), or the cap's (< 0: tighter; "cap")
    amount: float | None = None

    def label(self, blocks: Sequence[range]) -> str:
        def name(b: int) -> str:
            r = blocks[b]
            return f"layers {r.start}-{r.stop - 1}" if len(r) > 1 else f"layer {r.start}"

        if self.kind == "budget":
            # a budget move has a source block (Move.kind says which fields are set)
            return f"{self.phase}: budget {name(self.source)} -> {name(self.target)}"  # type: ignore[arg-type]
        if self.kind == "fill":
            return f"{self.phase}: unused budget -> {name(self.target)}"
        if self.kind == "weight":
            return f"{self.phase}: {name(self.target)} pool weight x{self.amount:g}"
        if self.kind in ("floor", "cap"):
            return f"{self.phase}: {name(self.target)} pool {self.kind} {self.amount:+g}"
        return f"{self.phase}: {name(self.target)} {self.replaces} -> {self.pattern}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def layer_blocks(num_layers: int, blocks: int) -> list[range]:
    """``blocks`` contiguous groups of layers (sizes differ by at most one; at most one layer per block)."""
    k = max(1, min(blocks, num_layers))
    edges = [round(i * num_layers / k) for i in range(k + 1)]
    return [range(a, b) for a, b in zip(edges, edges[1:])]


def _budget(choice: LayerChoice) -> int:
    """A layer-level choice's budget (every layer of a strategy with a global budget has one; Strategy checks it)."""
    if choice.budget is None:
        raise SolverError(f"search: internal error, a {choice.pattern} layer without a budget")
    return int(choice.budget)


def _key(pattern: str, params: Mapping[str, Any]) -> Key:
    return pattern, json.dumps(dict(params), sort_keys=True)


@functools.cache
def _canon(key: Key) -> str:
    """The canonical spec of a slot's pattern (``kvzip[allocation=model]``; defaults dropped)."""
    return canonical_spec(spec_label(key[0], json.loads(key[1])))


def _full(key: Key) -> bool:
    return key[0] == "full"


def _alone(name: str, params: Mapping[str, Any]) -> bool:
    """Heads given a pooled pattern (``kvzip[allocation=model]``) get a group each (as :mod:`solvers.heads`)."""
    return name in PATTERNS and make_pattern(name, **params).pooled is not None


class SearchSpace:
    """Slots and moves of the searched phases of strategies sharing ``start``'s shape (module docstring)."""

    def __init__(
        self,
        problem: Problem,
        start: Strategy,
        *,
        blocks: int,
        step: int,
        patterns: Sequence[str],
        priors: Sequence[str] = (),
    ):
        if step < 1:
            raise SolverError(f"step: moves at least 1 token, got {step}")
        if set(priors) - set(PRIOR_MOVES):
            raise SolverError(f"priors: moves of {', '.join(PRIOR_MOVES)} only, got {', '.join(priors)}")
        self.priors = tuple(priors)
        self.problem = problem
        self.start = start
        self.follows = dict(start.provenance.get("phases_following") or {})
        self.phases = tuple(p for p in problem.phases if p not in self.follows)
        self.blocks = layer_blocks(start.num_layers, blocks)
        self.step = int(step)
        self.headwise = {p: any(c.has_head_groups for c in start.phase(p)) for p in self.phases}
        self.heads = int(start.num_kv_heads or 1)
        seen = [k for p in self.phases for row in self.slots(start, p) for k, _ in row if not _full(k)]
        self.literal: dict[str, Key] = {}  #: canonical spec -> the pattern as the start writes it
        for k in [*seen, *(_key(*pattern_spec(p)) for p in patterns)]:
            self.literal.setdefault(_canon(k), k)
        canon = [*(canonical_spec(p) for p in patterns), *(_canon(k) for k in seen)]
        self.patterns = tuple(dict.fromkeys(canon))  #: canonical specs

    # ------------------------------------------------------------------ slots
    def per_layer(self, phase: str) -> int:
        return self.heads if self.headwise[phase] else 1

    def cap(self, phase: str) -> int | None:
        caps = [c for c in (self.problem.max_budget, self.start.context_len if self.headwise[phase] else None) if c]
        return min(caps) if caps else None

    def slots(self, strategy: Strategy, phase: str) -> Slots:
        rows: list[tuple[Slot, ...]] = []
        for c in strategy.phase(phase):
            if not self.headwise.get(phase, False):
                rows.append(((_key(c.pattern, c.params), _budget(c)),))
            elif c.head_groups is None:
                rows.append(((_key(c.pattern, c.params), _budget(c)),) * self.heads)
            else:
                owner = {h: g for g in c.head_groups for h in g.heads}
                row = (owner[h] for h in range(self.heads))
                rows.append(tuple((_key(g.pattern, g.params), g.budget) for g in row))
        return tuple(rows)

    def build(self, slots: Mapping[str, Slots]) -> Strategy:
        """The strategy with ``slots`` in the searched phases (followers copy their source; others: the start's)."""
        per_phase = {p: list(self.start.phase(p)) for p in PHASES}
        for phase, rows in slots.items():
            if self.headwise[phase]:
                per_phase[phase] = [self._grouped(phase, layer, row) for layer, row in enumerate(rows)]
            else:
                per_phase[phase] = [LayerChoice(*_choice(*row[0])) for row in rows]
        for phase, source in self.follows.items():
            per_phase[phase] = list(per_phase[source])
        s = self.start
        return Strategy(
            per_phase["prefill"], per_phase["decoding"], s.global_budget, s.b_min, {}, s.context_len, s.num_kv_heads
        )

    def _grouped(self, phase: str, layer: int, row: tuple[Slot, ...]) -> LayerChoice:
        """A head-level layer's choice; one the start made at layer level stays so while its heads agree."""
        if self.start.phase(phase)[layer].head_groups is None and len(set(row)) == 1:
            return LayerChoice(*_choice(*row[0]))
        return LayerChoice.grouped(group_heads([_choice(*x) for x in row], alone=_alone))

    def state(self, strategy: Strategy) -> dict[str, Slots]:
        return {p: self.slots(strategy, p) for p in self.phases}

    # ------------------------------------------------------------------ moves
    def moves(self, strategy: Strategy) -> list[Move]:
        """Every move of the space, in a fixed order (the search shuffles them with its seed)."""
        k = range(len(self.blocks))
        out: list[Move] = []
        for phase in self.phases:
            out += [Move("budget", phase, b, source=a) for a in k for b in k if a != b]
            out += [Move("fill", phase, b) for b in k]
            pairs = [(x, p) for x in self.patterns for p in self.patterns if x != p]
            out += [Move("pattern", phase, b, pattern=p, replaces=x) for b in k for x, p in pairs]
            steps = {"weight": (2.0, 0.5), "floor": (self.step, -self.step), "cap": (-self.step, self.step)}
            out += [Move(kind, phase, b, amount=a) for kind in self.priors for b in k for a in steps[kind]]
        return out

    def apply(self, strategy: Strategy, move: Move) -> Strategy | None:
        """``strategy`` after ``move``, or None when the move changes nothing there."""
        state = self.state(strategy)
        rows = [list(r) for r in state[move.phase]]
        moves = {"budget": self._shift, "fill": self._fill, "pattern": self._swap}
        changed = moves.get(move.kind, self._prior)(move, rows)
        if not changed or (move.kind == "budget" and _within_the_pool(state[move.phase], rows)):
            return None
        state[move.phase] = tuple(tuple(r) for r in rows)
        return self.build(state)

    def _movable(self, block: int, rows) -> list[tuple[int, int]]:
        return [(l, i) for l in self.blocks[block] for i, (k, _) in enumerate(rows[l]) if not _full(k)]

    def _give(self, move: Move, rows, tokens: int) -> int:
        """Share ``tokens`` evenly over the target block's movable slots (capped); returns the tokens given."""
        cap = self.cap(move.phase)
        slots = self._movable(move.target, rows)
        given = 0
        while tokens > given and slots:
            share, extra = divmod(tokens - given, len(slots))
            room = []
            for j, (l, i) in enumerate(slots):
                s, b = rows[l][i]
                add = share + (j < extra)
                if cap is not None:
                    add = min(add, max(0, cap - b))
                rows[l][i] = (s, b + add)
                given += add
                if cap is None or b + add < cap:
                    room.append((l, i))
            if len(room) == len(slots):
                break
            slots = room
        return given

    def _shift(self, move: Move, rows) -> bool:
        n = self.per_layer(move.phase)
        taken = 0
        # a budget move has a source block (Move.kind says which fields are set)
        for l in self.blocks[move.source]:  # type: ignore[index]
            row = list(rows[l])
            floor = 1 if n > 1 else self.problem.b_min
            cut = [0 if _full(k) else min(self.step, b - floor) for k, b in row]
            after = sum(min(b - c, self._count_cap(move.phase, b - c)) for (_, b), c in zip(row, cut))
            if Fraction(after, n) < self.problem.b_min:
                continue  # this layer would go below b_min: it gives nothing
            rows[l] = [(s, b - c) for (s, b), c in zip(row, cut)]
            taken += sum(cut)
        if taken == 0:
            return False
        given = self._give(move, rows, taken)
        return given > 0

    def _fill(self, move: Move, rows) -> bool:
        n = self.per_layer(move.phase)
        used = sum(self._count_cap(move.phase, b) for row in rows for _, b in row)
        left = self.problem.total * n - used
        return left > 0 and self._give(move, rows, left) > 0

    def _swap(self, move: Move, rows) -> bool:
        changed = False
        for l, i in self._movable(move.target, rows):
            s, b = rows[l][i]
            if _canon(s) == move.replaces:
                # a pattern move carries its pattern (Move.kind says which fields are set)
                rows[l][i] = (self.literal[move.pattern], b)  # type: ignore[index]
                changed = True
        return changed

    def _prior(self, move: Move, rows) -> bool:
        """Move the weight or the floor of the target block's slots in a model-wide pool (module docstring)."""
        changed = False
        for l, i in self._movable(move.target, rows):
            (name, text), b = rows[l][i]
            params = json.loads(text)
            if name not in PATTERNS or make_pattern(name, **params).pooled != "model":
                continue
            moved = _moved_prior(make_pattern(name, **params), move, b)
            if moved is not None:
                rows[l][i] = (_key(name, checked_params(name, {**params, move.kind: moved})), b)
                changed = True
        return changed

    def _count_cap(self, phase: str, b: int) -> int:
        ctx = self.start.context_len if self.headwise[phase] else None
        return min(b, ctx) if ctx else b


def _moved_prior(pattern, move: Move, budget: int):
    """The pattern's ``weight``, ``floor`` or ``cap`` after ``move`` (per head when it, the floor or the cap is), or
    None if unchanged."""
    if move.kind == "weight":
        values = _each(pattern.weight)
        new = tuple(min(64.0, max(1 / 64, float(f"{w * move.amount:.3g}"))) for w in values)
    else:
        floors, caps = _each(pattern.floor), _each(pattern.cap)
        n = max(len(floors), len(caps))
        floors, caps = (floors * n if len(floors) == 1 else floors), (caps * n if len(caps) == 1 else caps)
        # a floor or cap move carries its amount (Move.kind says which fields are set)
        step = int(move.amount)  # type: ignore[arg-type]
        if move.kind == "floor":
            values = floors
            new = tuple(max(0, min(f + step, budget, c or budget)) for f, c in zip(floors, caps))
        else:
            values = caps
            new = tuple(_moved_cap(c, f, step, budget) for f, c in zip(floors, caps))
    if new == values:
        return None
    return new if len(new) > 1 else new[0]


def _moved_cap(cap: int, floor: int, step: int, budget: int) -> int:
    """One KV head's cap (0: none) after a ``step`` of tokens (< 0: tighter) along the ladder of the module
    docstring: none, ``budget``, ``budget - |step|``, ... down to ``max(floor, 1)``."""
    if step < 0:
        return max(floor, 1, budget if cap == 0 else cap + step)
    if cap == 0 or cap >= budget:
        return 0
    return min(cap + step, budget)


def _each(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _within_the_pool(before: Slots, after) -> bool:
    """True when only pooled slots changed budget and nothing per head depends on it: the pool ranks its tokens at
    the sum of its heads' budgets, so tokens moved inside it change nothing the runtime does
    (:mod:`polykv_search.runtime.pooled`), unless a head's own share does (kvzip's ``floor`` and ``evidence``
    count ``min(floor, b)`` and ``floor(evidence * b)`` tokens; its sinks and boundary up to ``b``)."""
    changed = [
        (old, new) for old_row, new_row in zip(before, after) for old, new in zip(old_row, new_row) if old != new
    ]
    return all(_budget_free(new[0], old[1], new[1]) for old, new in changed)


def _budget_free(key: Key, old: int, new: int) -> bool:
    """Whether a pooled slot's heads keep the same per-head tokens at budget ``old`` and ``new``."""
    name, params = key[0], json.loads(key[1])
    if not _alone(name, params):
        return False
    pattern = make_pattern(name, **params)
    protected = getattr(pattern, "n_sink", 0) + getattr(pattern, "boundary", 0)
    shares = getattr(pattern, "floor", 0) or getattr(pattern, "evidence", 0)
    return not shares and min(old, new) >= protected


def _choice(key: Key, budget: int) -> tuple[str, int, dict[str, Any]]:
    return key[0], budget, json.loads(key[1])


def check_budgets(strategy: Strategy, problem: Problem) -> None:
    """Raise :class:`SolverError` unless every searched phase keeps ``Σ_l b_l <= floor(L·B)`` and
    ``b_l >= b_min`` (a head-level layer's budget: the capped mean of its heads)."""
    for phase in problem.phases:
        budgets = layer_budgets(strategy, phase)
        total = sum(budgets)
        if total > problem.total or min(budgets) < problem.b_min or not math.isfinite(float(total)):
            raise SolverError(
                f"search: internal error, {phase} budgets break the constraints "
                f"(sum {float(total):g} of {problem.total}, min {float(min(budgets)):g}, b_min {problem.b_min})"
            )
