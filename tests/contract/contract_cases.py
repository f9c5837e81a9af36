"""The contract cases: the differential join cases and the random pipelines, as one kind.

A :class:`Case` is a pipeline description (``pipeline_oracle`` nodes: a single join is a
one-join pipeline), a change stream drawn up front (it depends only on the integrated
inputs, never on the engine, so every execution path gets the very same stream), and an
oracle computing every output from the integrated inputs.

* Join cases come from ``tests/test_differential.py``: every :class:`JoinCase` (plain bags
  with colliding column names, a dimension keyed by its unique key, a fact with a unique
  id, two-column keys declared out of schema order, int16 against int64 keys) under every
  join type, their streams drawn by its :class:`SideModel` (inserts, deletes, duplicates,
  NULL keys, updates, insert+delete of a row in one batch, illegal batches); the oracle is
  ``tests/oracle.py``'s nested-loop join.
* Pipeline cases come from ``tests/test_pipeline_random.py``'s :class:`RandomPipeline`
  (2-4 sources, 2-6 operators of every kind, outer joins, aggregates, unions, N-way
  joins); their streams from ``pipeline_oracle.ChangeGen``; the oracle is DuckDB.

A stream is a list of :class:`Step`: one ``load`` first (inserts only: what population
loads as a snapshot, what other paths push), then ``change`` steps (one source, sometimes
two at once), ``reject`` steps (a legal batch plus one violation: an over-retraction, a
phantom delete, a repeated unique key; the path must refuse it whole) and one ``reopen``
(close the store and attach again) in some streams.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pipeline_oracle as po
from oracle import JOIN_TYPES, join_oracle
from test_differential import (
    CASES,
    HYPOTHESIS_PAYLOADS,
    JoinCase,
    SideModel,
    hypothesis_case,
    interpret_op,
)
from test_pipeline_random import RandomPipeline

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import pyarrow as pa

Row = tuple[Any, ...]
Entry = tuple[Row, int]
StepKind = Literal["load", "change", "reject", "reopen"]
JOIN_OUTPUT = "out"
"""The output name of a join case (the pipeline paths name their one output so)."""


@dataclass(frozen=True)
class Step:
    """One step of a stream: entries per source (empty for ``reopen``)."""

    kind: StepKind
    changes: Mapping[str, list[Entry]] = field(default_factory=dict)


@dataclass
class Case:
    """A description, its stream and its oracle (see the module docstring)."""

    id: str
    kind: Literal["join", "pipeline"]
    outputs: dict[str, po.Node]
    steps: list[Step]
    oracle: Callable[[Mapping[str, Counter[Row]]], dict[str, Counter[Row]]]
    join: tuple[JoinCase, str] | None = None
    """For a join case: the differential case and the join type (to build a Join)."""
    share_indexes: bool = True

    @property
    def sources(self) -> dict[str, po.Source]:
        """Every source the outputs read, by name."""
        return po.sources_of(self.outputs)

    def describe(self) -> str:
        """The description, readable (for failure messages)."""
        return f"case {self.id}\n{po.describe(self.outputs)}"


# ---- join cases ------------------------------------------------------------------------------


def join_outputs(case: JoinCase, how: str) -> dict[str, po.Node]:
    """The join as a one-join pipeline description over sources ``left`` and ``right``."""
    left = po.Source("left", case.left.schema,
                     [case.left.unique_key] if case.left.unique_key else None)
    right = po.Source("right", case.right.schema,
                      [case.right.unique_key] if case.right.unique_key else None)
    on = list(zip(case.left.key, case.right.key, strict=True))
    return {JOIN_OUTPUT: po.Join(left, right, on=on, how=how)}


def join_case(case: JoinCase, how: str, seed: int, pushes: int = 14,
              reject_rate: float = 0.15) -> Case:
    """A differential join case's stream: a load of both sides, then ``pushes`` steps."""
    rng = random.Random(f"contract/{case.name}/{how}/{seed}")
    models = {"left": SideModel(case.left), "right": SideModel(case.right)}
    load: dict[str, list[Entry]] = {}
    for side, model in models.items():
        entries: list[Entry] = []
        for _ in range(2):
            batch = model.legal_batch(rng)
            model.apply(batch)
            entries += batch
        load[side] = entries
    steps = [Step("load", load)]
    for i in range(pushes):
        if i == pushes // 2:
            steps.append(Step("reopen"))
        side = rng.choice(("left", "right"))
        if rng.random() < reject_rate:
            steps.append(Step("reject", {side: models[side].illegal_batch(rng)}))
            continue
        sides = [side] if rng.random() < 0.8 else ["left", "right"]
        changes = {}
        for s in sides:
            changes[s] = models[s].legal_batch(rng)
            models[s].apply(changes[s])
        steps.append(Step("change", changes))
    return Case(f"{case.name}-{how}-{seed}", "join", join_outputs(case, how), steps,
                _join_oracle(case, how), join=(case, how))


def _join_oracle(case: JoinCase, how: str
                 ) -> Callable[[Mapping[str, Counter[Row]]], dict[str, Counter[Row]]]:
    def oracle(inputs: Mapping[str, Counter[Row]]) -> dict[str, Counter[Row]]:
        return {JOIN_OUTPUT: join_oracle(
            inputs["left"], inputs["right"], case.left.key_idx, case.right.key_idx, how,
            len(case.left.names), len(case.right.names))}
    return oracle


def drawn_join_case(how: str, left_type: pa.DataType, right_type: pa.DataType,
                    ops: Sequence[tuple[str, list[tuple[Any, int, int]], list[int], bool]]
                    ) -> Case:
    """A join case from a hypothesis-drawn stream (``test_differential.OPS``): key widths
    of either side, the first op the load (both sides; deletes of nothing are dropped)."""
    case = hypothesis_case(left_type, right_type)
    models = {"left": SideModel(case.left), "right": SideModel(case.right)}
    steps: list[Step] = []
    for i, (side, inserts, deletes, reopen) in enumerate(ops):
        if reopen and i:
            steps.append(Step("reopen"))
        entries = interpret_op(models[side], HYPOTHESIS_PAYLOADS[side], inserts, deletes)
        models[side].apply(entries)
        if i == 0:
            steps.append(Step("load", {"left": [], "right": [], side: entries}))
        else:
            steps.append(Step("change", {side: entries}))
    return Case(f"{case.name}-{how}-drawn", "join", join_outputs(case, how), steps,
                _join_oracle(case, how), join=(case, how))


@dataclass(frozen=True)
class CaseRef:
    """A case not drawn yet (drawing every stream at collection would cost seconds)."""

    kind: Literal["join", "pipeline"]
    id: str
    make: Callable[[], Case]

    def __repr__(self) -> str:
        return self.id


def join_cases(seeds: range | tuple[int, ...] = (0,)) -> list[CaseRef]:
    """Every differential case under every join type, one stream per seed."""
    return [CaseRef("join", f"{c.name}-{how}-{seed}",
                    functools.partial(join_case, c, how, seed))
            for seed in seeds for c in CASES for how in JOIN_TYPES]


# ---- pipeline cases --------------------------------------------------------------------------


def pipeline_case(seed: int, pushes: int = 6, reject_rate: float = 0.15) -> Case:
    """Random pipeline ``seed``: a load of every source, then ``pushes`` steps."""
    rp = RandomPipeline(seed)
    rng = random.Random(f"contract/pipeline/{seed}")
    share = rng.random() < 0.7
    reopen_at = rng.randrange(pushes) if rng.random() < 0.3 else -1
    sources = po.sources_of(rp.outputs)
    order = [n for n in rp.gens if n in sources]
    current: dict[str, Counter[Row]] = {s: Counter() for s in order}

    def take(source: str, entries: list[Entry]) -> list[Entry]:
        current[source] = po.zadd(current[source], po.consolidate(entries))
        return entries

    steps = [Step("load", {s: take(s, rp.gens[s].delta(rng, current[s], 8, inserts_only=True))
                           for s in order})]
    for i in range(pushes):
        if i == reopen_at:
            steps.append(Step("reopen"))
        source = rng.choice(order)
        if rng.random() < reject_rate:
            steps.append(Step("reject", {source: _illegal(rp.gens[source], rng,
                                                          current[source])}))
            continue
        changed = [source] if rng.random() < 0.8 else order
        steps.append(Step("change", {s: take(s, rp.gens[s].delta(rng, current[s], 5))
                                     for s in changed}))
    outputs = dict(rp.outputs)
    return Case(f"seed-{seed}", "pipeline", outputs, steps,
                lambda inputs: po.evaluate(outputs, inputs), share_indexes=share)


def _illegal(gen: po.ChangeGen, rng: random.Random, current: Counter[Row]) -> list[Entry]:
    """A legal change plus one retraction the source does not hold (too many copies of a
    row it has, or a row it never had)."""
    entries = gen.delta(rng, current, 4)
    net = po.zadd(current, po.consolidate(entries))
    if net and rng.random() < 0.7:
        row = rng.choice(sorted(net, key=repr))
        entries.append((row, -(net[row] + 1)))
    else:
        for _ in range(100):
            row = gen.row(rng, rng.choice(gen.key_domain) if gen.uk_idx else None)
            if row not in net:
                entries.append((row, -1))
                break
        else:
            raise AssertionError(f"no row outside {net} to retract: widen the value domain")
    rng.shuffle(entries)
    return entries


def pipeline_cases(seeds: range | tuple[int, ...]) -> list[CaseRef]:
    """The random pipelines of ``seeds``."""
    return [CaseRef("pipeline", f"seed-{seed}", functools.partial(pipeline_case, seed))
            for seed in seeds]
