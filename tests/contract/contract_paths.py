"""The execution paths a contract case runs over, each behind one small interface.

A path turns a :class:`~contract_cases.Case` into a :class:`Runner`: ``load`` takes the
stream's first step (inserts only), ``apply`` every later change, each returning the
output change sets it produced (a list of ``{output: table}``: a path that pushes one
source at a time returns one dict per push).  ``reopen`` closes the store and attaches
again; ``state`` is a join's two sides (paths without a join: ``None``).

The paths (``PATHS``):

``push``
    :meth:`joinstate.Join.push` (join cases), change sets in every shape the API takes
    (columns in any order, ``_weight`` omitted when all are +1, RecordBatch, chunked).
``pipeline``
    the :class:`joinstate.Pipeline` runtime over :func:`pipeline_oracle.build_graph`'s
    graph: a one-join pipeline for a join case.
``populate``
    :func:`population.populate` of the load (small ``batch_rows``, so several batches per
    input, the strategy cycling over the target's strategies by case), then pushes.
``recompute``
    :func:`population.apply` with ``strategy="recompute"`` for every change; skipped for a
    target that :func:`population.recompute.unavailable` says has no recompute path.
``distributed``
    the plan of :func:`planner.distribute.plan_distribution` run without Spark by
    ``tests/distsim.py`` (one store per stage and shard, rows routed as the plan says;
    each step one operation).  Not atomic across shards: reject steps are not run.
``spark`` (``contract_spark.py``)
    the real :class:`spark_io.SparkPipeline`.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import pipeline_oracle as po
import pyarrow as pa
import pytest
from contract_cases import JOIN_OUTPUT, Case, Entry, Step
from distsim import Simulator
from test_differential import SUFFIXES, build_delta

import joinstate
import population
from planner.distribute import plan_distribution
from planner.stats import given
from population.recompute import unavailable

if TYPE_CHECKING:
    from pathlib import Path

Outs = dict[str, pa.Table]
NAME = "contract"


class Runner(Protocol):
    """One case's target on one path."""

    def load(self, step: Step) -> list[Outs]:
        """Load the stream's first step; the output change sets it produced."""
        ...

    def apply(self, step: Step) -> list[Outs]:
        """Apply one change step; the output change sets it produced."""
        ...

    def reopen(self) -> None:
        """Close the store(s) and attach again to the same state."""
        ...

    def state(self) -> dict[str, pa.Table] | None:
        """A join's sides' state (``None``: the path has no join)."""
        ...

    def close(self) -> None:
        """Close every store (also after a failure)."""
        ...


@dataclass(frozen=True)
class ExecPath:
    """A path: its name, the case kinds it runs, and what its runners can do."""

    name: str
    kinds: frozenset[str]
    start: Any  # (case, root) -> Runner
    atomic: bool = True
    """Refuses a bad step whole (reject steps run on it)."""
    reopens: bool = True
    exact_types: bool = True
    """Outputs carry the description's Arrow types exactly."""


def delta_of(case: Case, source: str, entries: list[Entry]) -> pa.Table:
    """A change set with ``_weight`` in the source's schema."""
    return po.make_delta(case.sources[source].schema, entries)


def snapshot_of(case: Case, step: Step) -> dict[str, pa.Table]:
    """The load as population takes it: each source's integrated rows, with multiplicity."""
    return {s: delta_of(case, s, sorted(po.consolidate(e).items(), key=repr))
            for s, e in step.changes.items()}


def strategy_for(case: Case, choices: tuple[str, ...]) -> str:
    """A strategy picked by the case's id (stable across runs and processes)."""
    return choices[zlib.crc32(case.id.encode()) % len(choices)]


# ---- Join.push -----------------------------------------------------------------------------


class JoinRunner:
    """A :class:`joinstate.Join` in its own store; ``apply`` is ``push`` or ``population.apply``."""

    def __init__(self, case: Case, root: Path, *, recompute: bool = False,
                 shapes: bool = False) -> None:
        assert case.join is not None
        self.case = case
        self.path = root / "store"
        self.recompute = recompute
        self.rng = random.Random(case.id) if shapes else None
        self.store = joinstate.StateStore(str(self.path))
        self.join = self._attach()

    def _attach(self) -> joinstate.Join:
        jc, how = self.case.join  # type: ignore[misc]
        return self.store.join(NAME, left=jc.left.side(), right=jc.right.side(),
                               how=cast("joinstate.How", how), suffixes=SUFFIXES)

    def _delta(self, side: str, entries: list[Entry]) -> pa.Table | pa.RecordBatch:
        if self.rng is None:
            return delta_of(self.case, side, entries)
        return build_delta(self.rng, self.case.sources[side].schema, entries)

    def load(self, step: Step) -> list[Outs]:
        return self.apply(step)

    def apply(self, step: Step) -> list[Outs]:
        out = []
        for side, entries in step.changes.items():
            delta = self._delta(side, entries)
            if self.recompute:
                got = population.apply(self.join, side, delta, strategy="recompute")
            else:
                got = self.join.push(cast("joinstate.SideName", side), delta)
            assert isinstance(got, pa.Table), f"a join's output is a table, got {type(got)}"
            out.append({JOIN_OUTPUT: got})
        return out

    def reopen(self) -> None:
        self.store.close()
        self.store = joinstate.StateStore(str(self.path))
        self.join = self._attach()

    def state(self) -> dict[str, pa.Table] | None:
        return {side: self.join.state(side) for side in ("left", "right")}

    def close(self) -> None:
        self.store.close()


class PopulatedJoin(JoinRunner):
    """A join whose load goes through :func:`population.populate`."""

    def load(self, step: Step) -> list[Outs]:
        got: list[Outs] = []
        strategy = strategy_for(self.case, ("symmetric", "asymmetric", "bulk", "auto"))
        tables = snapshot_of(self.case, step)
        population.populate(self.join, left=tables["left"], right=tables["right"],
                            strategy=strategy, progress=False, batch_rows=3,
                            sink=lambda t: got.append({JOIN_OUTPUT: t}))
        assert self.join.phase == "live", f"populate ({strategy}) left phase {self.join.phase}"
        return got


# ---- Pipeline ------------------------------------------------------------------------------


class PipelineRunner:
    """A :class:`joinstate.Pipeline` over the case's graph in its own store."""

    def __init__(self, case: Case, root: Path, *, recompute: bool = False,
                 populate: bool = False) -> None:
        self.case = case
        self.path = root / "store"
        self.recompute = recompute
        self.populate = populate
        self.graph = po.build_graph(case.outputs)
        self.store = joinstate.StateStore(str(self.path))
        self.pipe = self._attach()
        if recompute:
            why = unavailable(self.pipe)
            if why is not None:
                self.close()
                pytest.skip(f"population.recompute.unavailable: {why}")

    def _attach(self) -> joinstate.Pipeline:
        return joinstate.Pipeline(self.store, NAME, self.graph,
                                  share_indexes=self.case.share_indexes)

    def load(self, step: Step) -> list[Outs]:
        if not self.populate:
            return self.apply(step)
        got: list[Outs] = []
        strategy = strategy_for(self.case, ("symmetric", "asymmetric", "auto"))
        population.populate(self.pipe, sources=snapshot_of(self.case, step),
                            strategy=strategy, progress=False, batch_rows=3,
                            sink=got.append)
        assert self.pipe.phase == "live", f"populate ({strategy}) left phase {self.pipe.phase}"
        return got

    def apply(self, step: Step) -> list[Outs]:
        out = []
        for source, entries in step.changes.items():
            delta = delta_of(self.case, source, entries)
            if self.recompute:
                got = population.apply(self.pipe, source, delta, strategy="recompute")
            else:
                got = self.pipe.push(source, delta)
            assert isinstance(got, Mapping), f"a pipeline's outputs are a dict, got {type(got)}"
            out.append(dict(got))
        return out

    def reopen(self) -> None:
        self.store.close()
        self.store = joinstate.StateStore(str(self.path))
        self.pipe = self._attach()

    def state(self) -> dict[str, pa.Table] | None:
        return None

    def close(self) -> None:
        self.store.close()


# ---- the distributed plan, without Spark ---------------------------------------------------


class DistributedRunner:
    """The case's graph planned for 2-3 shards and run by ``tests/distsim.py``.

    A failure names the plan (:meth:`describe`): shards, statistics, forced copies.
    """

    def __init__(self, case: Case, root: Path) -> None:
        self.case = case
        self.root = root
        self.graph = po.build_graph(case.outputs)
        rng = random.Random(f"distributed/{case.id}")
        self.shards = rng.choice((2, 3))
        # statistics are hints for the plan (the rows routed are the stream's): sizes
        # that make some sources worth copying, and half the cases force one copy (a
        # single join on its own keys never needs one otherwise)
        self.stats = {s: given(s, rng.choice((10, 1_000, 3_000_000))) for s in case.sources}
        self.given: dict[str, Any] = {}
        if rng.random() < 0.5:
            self.given = {"replicate": {rng.choice(sorted(case.sources)): True}}
        self.sim: Simulator | None = None

    def describe(self) -> str:
        """The plan's choices, for failure messages."""
        return (f"{self.shards} shards, statistics { {s: v.rows for s, v in self.stats.items()} }"
                f", given {self.given}")

    def _changes(self, step: Step) -> dict[str, pa.Table]:
        return {s: delta_of(self.case, s, e) for s, e in step.changes.items()}

    def _run(self, changes: dict[str, pa.Table]) -> list[Outs]:
        assert self.sim is not None
        return [self.sim.apply(changes)]

    def load(self, step: Step) -> list[Outs]:
        plan = plan_distribution(self.graph, self.stats, shards=self.shards, name=NAME,
                                 given=self.given)
        self.plan = plan
        self.sim = Simulator(plan, self.root / "dist", NAME)
        return self._run(self._changes(step))

    def apply(self, step: Step) -> list[Outs]:
        return self._run(self._changes(step))

    def reopen(self) -> None:  # pragma: no cover - ExecPath.reopens is False
        msg = "the simulator keeps its stores open"
        raise NotImplementedError(msg)

    def state(self) -> dict[str, pa.Table] | None:
        return None

    def close(self) -> None:
        if self.sim is not None:
            self.sim.close()


def _start_push(case: Case, root: Path) -> Runner:
    return JoinRunner(case, root, shapes=True)


def _start_pipeline(case: Case, root: Path) -> Runner:
    return PipelineRunner(case, root)


def _start_populate(case: Case, root: Path) -> Runner:
    if case.kind == "join":
        return PopulatedJoin(case, root)
    return PipelineRunner(case, root, populate=True)


def _start_recompute(case: Case, root: Path) -> Runner:
    if case.kind == "join":
        return JoinRunner(case, root, recompute=True)
    return PipelineRunner(case, root, recompute=True)


BOTH = frozenset({"join", "pipeline"})
PATHS: tuple[ExecPath, ...] = (
    ExecPath("push", frozenset({"join"}), _start_push),
    ExecPath("pipeline", BOTH, _start_pipeline),
    ExecPath("populate", BOTH, _start_populate),
    ExecPath("recompute", BOTH, _start_recompute),
    ExecPath("distributed", BOTH, DistributedRunner, atomic=False, reopens=False),
)
