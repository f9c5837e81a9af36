"""The population driver: load a maintained target's inputs, emit the outputs, go live.

One driver for anything :class:`~joinstate.maintained.Maintained` (a join's two sides, a
pipeline's sources).  Phases: read the inputs' statistics; plan (the planner decides the
load order, small inputs first, the strategy, the memtables and the compaction policy of
every index, from the statistics and the store's recorded history:
:func:`planner.plan.plan_population`; a join whose sides' sizes are unknown is counted in
lockstep and planned again); run the plan (:mod:`population.run`: memtables, every batch
with its progress marker, the compaction policies on the population events, bulk SST
runs for inputs that take them); go live in one write that also hands over what the
target still owes its outputs (a pipeline's global aggregates over inputs that stayed
empty); record what was measured for the planner's next decision.  Whatever happens,
every column family a policy disabled is re-enabled.

Crash safety (see :mod:`population.resume`): every batch commits its input's progress
marker in its own transaction, through the WAL; a batch's output is delivered *before*
its transaction becomes durable (bulk-written batches become durable when their run is
ingested), so a crash can only make outputs be delivered again, from a batch index the
resumed run reports, never lose one.

What differs between a join and a pipeline is only their public face here (the table
:data:`FACES`): how the inputs are passed (``left=``/``right=`` or ``sources=``), which
strategies and orders may be fixed, what a sink receives (a join's output table, a
pipeline's ``{output: table}``) and the report's shape (:class:`Report` per side,
:class:`PipelineReport` per source).  The loop, the plan, the markers, the resume and
the go-live are one.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from compaction import (
    AsymmetricPolicy,
    BulkLoadPolicy,
    CompactionPolicy,
    Guard,
    PopulationEnded,
    RocksDBDefaults,
    guarded,
)
from joinstate.activity import counter_delta, statistics_counters
from planner.history import read_history, record_population
from planner.plan import Plan, plan_population
from planner.stats import SourceStats, gather
from population.bulk import remove_staging
from population.errors import PopulationError
from population.progress import Progress
from population.report import PipelineReport, Report, SideReport, SourceLoad
from population.resume import (
    EMPTY_DIGEST,
    Marker,
    batch_digest,
    completed,
    markers,
    raise_interrupted,
    source_identity,
)
from population.run import Program, Run
from population.sampling import SAMPLE_INTERVAL
from population.schedule import PlannedCompaction, schedules
from population.sources import DEFAULT_BATCH_ROWS, Source, count_small
from population.strategy import CompactionName, Strategy, fixed_choices, from_plan, preset

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import pyarrow as pa

    from joinstate import Join, Pipeline
    from joinstate.maintained import Maintained

__all__ = ["FACES", "ORDERS", "Face", "face_of", "populate"]

log = logging.getLogger(__name__)

Order = Literal["small-first", "interleaved", "as-given"]
ORDERS: tuple[str, ...] = ("small-first", "interleaved", "as-given")

POLICIES: dict[CompactionName, Callable[[], CompactionPolicy]] = {
    "rocksdb": RocksDBDefaults,
    "epsio": AsymmetricPolicy,
    "bulk-load": BulkLoadPolicy,
}
"""The main compaction policy of each ``Strategy.compaction`` (a plan naming one policy);
a plan with a schedule per index runs :class:`PlannedCompaction`.  The guard always runs
too."""


@dataclass(frozen=True)
class Face:
    """What population looks like for one kind of target (see the module docstring).

    ``noun``: what messages call an input; ``strategies``: the names ``strategy=``
    takes (``auto`` too), ``fixed_strategies``: whether a :class:`Strategy` may be given;
    ``orders``: the names ``order=`` takes; ``batch_rows``: the default rows per batch;
    ``value``: what a sink receives of a push's outputs; ``report``: the report builder.
    """

    noun: str
    strategies: tuple[str, ...]
    fixed_strategies: bool
    orders: tuple[str, ...]
    batch_rows: int
    value: Callable[[Maintained, dict[str, pa.Table]], Any]
    report: Callable[[_Outcome], Any]


# ---- the run's outcome and the two report faces -----------------------------------------


@dataclass
class _Outcome:
    """Everything a finished run measured, for the report builders."""

    target: Maintained
    run: Run
    plan: Plan
    strategy_text: str
    found: Mapping[str, Marker]
    redelivered: dict[str, int]
    activity: dict[str, int]
    ingested: int
    wall: float
    operators: dict[str, int]


def _join_report(o: _Outcome) -> Report:
    run, target = o.run, o.target
    ing = run.ingester
    written = (o.activity["wal_bytes"] + o.activity["flush_write_bytes"]
               + o.activity["compaction_write_bytes"] + o.ingested)
    sides = {
        s: SideReport(
            rows=run.rows[s], batches=run.batches[s], seconds=round(run.seconds[s], 4),
            deletes=run.deletes[s], finished_at=run.finished_at.get(s),
            bulk_entries=ing.rows.get(s, 0) if ing is not None else 0,
            sst_files=ing.files.get(s, 0) if ing is not None else 0,
            memtable=run.memtables[s])
        for s in target.inputs if s in run.rows
    }
    store = target.store
    assert store is not None
    return Report(
        join=target.name, strategy=run.strategy.to_dict(), reason=run.strategy.reason,
        order=str(run.program.order), small_side=run.program.small,
        small_side_from=run.program.small_from, sides=sides,
        output_rows=sum(run.output_rows.values()),
        output_weight=sum(run.output_weight.values()), wall_seconds=round(o.wall, 4),
        bytes_written=written, ingested_bytes=o.ingested, rocksdb=o.activity,
        l0_samples=run.sampler.l0_samples(), l0_max=dict(run.sampler.l0_max),
        state_bytes=_dir_bytes(store.path), rss_start=run.sampler.rss_start,
        peak_rss=run.sampler.peak_rss, actions=[dict(vars(a)) for a in run.control.actions],
        phase=target.phase, resumed={s: m.summary() for s, m in o.found.items()},
        redelivered=o.redelivered, plan=o.plan.to_dict(), explain=o.plan.explain())


def _pipeline_report(o: _Outcome) -> PipelineReport:
    run, target = o.run, o.target
    order = list(run.program.sequence)
    return PipelineReport(
        target.name, o.strategy_text, order, seconds=round(o.wall, 4),
        sources=[SourceLoad(s, rows=run.rows[s], batches=run.batches[s],
                            seconds=run.seconds[s], skipped_batches=run.skipped[s])
                 for s in order],
        operators=o.operators,
        indexes=[{"column_family": ix.column_family, "layout": ix.layout, "rows": ix.rows,
                  "entries": ix.entries} for ix in target.indexes()],
        actions=[dict(vars(a)) for a in run.control.actions],
        output_rows=dict(run.output_rows), peak_rss_bytes=run.sampler.peak_rss,
        redelivered={s: i for s, i in o.redelivered.items() if s in run.pushed_after_resume},
        plan=o.plan.to_dict(), explain=o.plan.explain(), samples=run.sampler.samples)


FACES: dict[str, Face] = {
    "join": Face("side", ("symmetric", "asymmetric", "bulk", "auto"), True, ORDERS,
                 DEFAULT_BATCH_ROWS, lambda t, outs: outs[t.name], _join_report),
    "pipeline": Face("source", ("symmetric", "asymmetric", "auto"), False, (), 200_000,
                     lambda t, outs: outs, _pipeline_report),
}
"""The face of population for each kind of target (``target.kind``).  A pipeline's default
batch is bigger than a join's: every push pays the fixed cost of every operator it
reaches."""


# ---- arguments --------------------------------------------------------------------------


def face_of(target: Maintained) -> Face:
    """The :class:`Face` of ``target``'s kind (:class:`PopulationError` if it has none)."""
    face = FACES.get(getattr(target, "kind", ""))
    if face is None:
        raise PopulationError(
            f"population loads a joinstate.Join or a joinstate.Pipeline (anything "
            f"joinstate.maintained.Maintained), got {type(target).__name__}")
    return face


def _inputs(target: Maintained, face: Face, left: Any, right: Any,
            sources: Mapping[str, Any] | None) -> dict[str, Any]:
    """Input name -> data, from ``left=``/``right=`` or ``sources=``."""
    two_sided = target.inputs == ("left", "right")
    if left is not None or right is not None:
        if not two_sided:
            raise PopulationError(
                f"{target.kind} {target.name!r} is populated with sources={{name: data}}; "
                "left= and right= are for a join's two sides")
        if sources is not None:
            msg = "give the inputs either as left=/right= or as sources=, not both"
            raise PopulationError(msg)
        return {"left": left, "right": right}
    data = dict(sources or {})
    unknown = [s for s in data if s not in target.inputs]
    if unknown:
        raise PopulationError(
            f"{target.kind} {target.name!r} has no {face.noun}(s) {unknown} "
            f"({face.noun}s: {list(target.inputs)})")
    if two_sided and set(data) != set(target.inputs):
        # A join loads both sides (an empty one as an empty table or list).
        missing = [s for s in target.inputs if s not in data]
        raise PopulationError(f"{target.kind} {target.name!r}: no input for {missing}; "
                              "give both sides (an empty side as [])")
    return {s: data[s] for s in target.inputs if s in data}


def _check_arguments(target: Maintained, face: Face, strategy: str | Strategy | None,
                     order: str | Sequence[str] | None, sizes: Mapping[str, int] | None,
                     batch_rows: int | None, sample_interval: float) -> None:
    if isinstance(strategy, Strategy):
        if not face.fixed_strategies:
            raise PopulationError(
                f"a {target.kind} takes strategy= as a name: "
                f"{', '.join(repr(s) for s in face.strategies)} (a population.Strategy fixes "
                "a join's small and big side)")
    elif strategy is not None and not isinstance(strategy, str):
        raise PopulationError(f"strategy must be a name or a population.Strategy, got "
                              f"{type(strategy).__name__}")
    elif strategy is not None and strategy not in face.strategies:
        if face.fixed_strategies:
            preset(strategy)  # raises naming the presets
        raise PopulationError(
            f"strategy={strategy!r}: a {target.kind} is populated with one of "
            f"{face.strategies} (bulk SST ingestion needs transactions that never read "
            f"state, and a {target.kind}'s pushes read its aggregates and indexes)")
    if order is not None and order not in face.orders:
        raise PopulationError(
            f"order={order!r} must be one of {face.orders}" if face.orders else
            f"order={order!r}: a {target.kind} loads its {face.noun}s in the order the "
            "planner decides (dimensions first, smallest first); order= is for a join")
    if not sample_interval >= 0:
        raise PopulationError(f"sample_interval={sample_interval!r} must be >= 0 seconds")
    if batch_rows is not None and (isinstance(batch_rows, bool)
                                   or not isinstance(batch_rows, int) or batch_rows < 1):
        raise PopulationError(f"batch_rows={batch_rows!r} must be an int >= 1")
    if sizes is not None:
        bad = [k for k in sizes if k not in target.inputs]
        if bad or any(not isinstance(v, int) or v < 0 for v in sizes.values()):
            raise PopulationError(
                f"sizes={dict(sizes)!r} must map {face.noun}s of {target.kind} "
                f"{target.name!r} ({list(target.inputs)}) to row counts >= 0")


def _conflicts(strategy: str | Strategy | None, order: str | None, batch_rows: int | None,
               rec: Marker) -> list[str]:
    """Explicit arguments of a resumed call that contradict the interrupted run."""
    bad: list[str] = []
    name = rec.strategy.get("name")
    if isinstance(strategy, Strategy):
        mine = {k: v for k, v in strategy.to_dict().items() if k != "reason"}
        theirs = {k: v for k, v in rec.strategy.items() if k != "reason"}
        if mine != theirs:
            bad.append(f"strategy={strategy.name!r} (a Strategy that differs from the "
                       f"interrupted run's {name!r})")
    elif strategy is not None and name is not None and strategy not in ("auto", name):
        bad.append(f"strategy={strategy!r} (the interrupted run used {name!r})")
    if order is not None and rec.order is not None and order != rec.order:
        bad.append(f"order={order!r} (the interrupted run used {rec.order!r})")
    if batch_rows is not None and rec.batch_rows is not None and batch_rows != rec.batch_rows:
        bad.append(f"batch_rows={batch_rows!r} (the interrupted run used {rec.batch_rows})")
    return bad


def _skip(target: Maintained, name: str, source: Source, rec: Marker,
          found: Mapping[str, Marker], identity: dict[str, Any] | None) -> None:
    """Read past the batches ``rec`` says are loaded, checking they are the same ones.

    Raises :class:`~population.PopulationInterruptedError` if the input changed.
    """

    def changed(why: str) -> None:
        raise_interrupted(target, found, f"cannot resume: the input of "
                          f"{target.input_label(name)} changed: it differs from the one the "
                          f"interrupted population loaded ({why})")

    before = rec.source or {}
    if identity and before.get("bytes") is not None and identity.get("bytes") != before["bytes"]:
        changed(f"{before.get('path')} had {before['bytes']} bytes, "
                f"{identity.get('path')} has {identity.get('bytes')}")
    digest, rows = EMPTY_DIGEST, 0
    for i in range(rec.batches):
        b = source.next()
        if b is None:
            changed(f"it ends after {i} batch{'es' if i != 1 else ''}, {rec.batches} were "
                    f"loaded (batch_rows={rec.batch_rows})")
            break
        digest = batch_digest(digest, b)
        rows += b.num_rows
    if rows != rec.rows or digest != rec.digest:
        changed(f"its first {rec.batches} batch{'es' if rec.batches != 1 else ''} hold "
                f"{rows:,} rows with digest {digest}; the loaded ones held {rec.rows:,} rows "
                f"with digest {rec.digest}")
    if rec.done and source.next() is not None:
        changed(f"it has more than the {rec.batches} batches that were loaded in full")


def _stats(target: Maintained, data: Mapping[str, Any], sources: Mapping[str, Source],
           known: Mapping[str, int | None]) -> dict[str, SourceStats]:
    """Statistics of every input: sampled from tables and Parquet files, else their sizes.

    Iterators and readers are never touched here (only their batches are loaded).
    """
    out: dict[str, SourceStats] = {}
    for s, src in sources.items():
        uk = target.input_unique_key(s)
        if src.snapshot:
            st = gather(data[s], s, keys=list(target.input_keys(s)), unique_key=uk)
        else:
            st = SourceStats(s, src.rows, src.rows or 0, None, False, uk, origin="stream")
        if known.get(s) is not None and known[s] != st.rows:
            st = st.replace(rows=known[s], rows_at_least=known[s], origin="given")
        out[s] = st
    return out


def _plan(target: Maintained, stats: Mapping[str, SourceStats], order: Any,
          fixed: Mapping[str, Any]) -> Plan:
    """The planner's decisions for this population (``fixed``: choices not to decide)."""
    store = target.store
    assert store is not None
    return plan_population(target, stats, history=read_history(store, target.owner),
                           order=order, **fixed)


_UNDECIDED = object()


def _program(target: Maintained, plan: Plan, strategy: Strategy, small: str | None,
             small_from: str, batch_rows: int, loading: Sequence[str]) -> Program:
    """The run a plan describes: its order as a sequence, its policies."""
    order = plan.get("order")
    if isinstance(order, str):
        first = small if order in ("small-first", "interleaved") and small else None
        sequence = ([first, *(s for s in target.inputs if s != first)] if first
                    else list(target.inputs))
    else:
        sequence = [s for s in order if s in loading]
    planned = schedules(plan.where("compaction"))
    main: CompactionPolicy
    if planned:
        infos = {ix.column_family: ix for ix in target.indexes()}
        main = PlannedCompaction(planned, sequence, infos)
    else:
        main = POLICIES[strategy.compaction]()
    policies = [main, Guard(strategy.l0_limit, strategy.pending_bytes_limit)]
    return Program(strategy, sequence, order == "interleaved", order, small, small_from,
                   batch_rows, policies)


# ---- populate ---------------------------------------------------------------------------


@overload
def populate(
    join: Pipeline, left: None = None, right: None = None,
    strategy: str | Strategy | None = None, order: Order | str | None = None,
    sink: Callable[..., Any] | None = None, progress: bool = True, *,
    sources: Mapping[str, Any], sizes: Mapping[str, int] | None = None,
    batch_rows: int | None = None, go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL, resume: bool = False,
) -> PipelineReport: ...


@overload
def populate(
    join: Join, left: Any, right: Any,
    strategy: str | Strategy | None = None, order: Order | str | None = None,
    sink: Callable[..., Any] | None = None, progress: bool = True, *,
    sources: None = None, sizes: Mapping[str, int] | None = None,
    batch_rows: int | None = None, go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL, resume: bool = False,
) -> Report: ...


def populate(
    join: Maintained,
    left: Any = None,
    right: Any = None,
    strategy: str | Strategy | None = None,
    order: Order | str | None = None,
    sink: Callable[..., Any] | None = None,
    progress: bool = True,
    *,
    sources: Mapping[str, Any] | None = None,
    sizes: Mapping[str, int] | None = None,
    batch_rows: int | None = None,
    go_live: bool = True,
    sample_interval: float = SAMPLE_INTERVAL,
    resume: bool = False,
) -> Report | PipelineReport:
    """Load the inputs of ``join`` (a join or a pipeline), emit the outputs, go live.

    **A join**: ``left``/``right`` (or ``sources={"left": ..., "right": ...}``), each a
    pyarrow Table, RecordBatch or RecordBatchReader, a Parquet path, or an iterable of
    record batches; returns a :class:`Report`.  **A pipeline**: ``sources={name: data}``
    (sources left out stay empty); returns a :class:`PipelineReport` (per source,
    operator and index).

    ``strategy``: ``"symmetric"``, ``"asymmetric"`` (a join's default), ``"bulk"`` (a
    join only), ``"auto"`` (the planner decides, from the inputs' statistics and what
    earlier runs on this store measured; a pipeline's default) or, for a join, a
    :class:`Strategy`.  Either way the report carries the plan (``report.plan``,
    ``report.explain``): every decision with the figures behind it.  The inputs load
    small first (a pipeline: dimensions first, then the rest, each smallest first).  A
    join's ``order``: ``"small-first"`` (the default) loads the whole small side first;
    ``"interleaved"`` alternates batches as a stream would (the small side finishes
    first); ``"as-given"`` loads left then right.  ``sizes`` (``{input: rows}``) tells
    the driver the row counts when the inputs cannot; a join counts otherwise.  The
    small side is never inferred from its name.  ``batch_rows`` (default 65,536 for a
    join, 200,000 for a pipeline) cuts tables and Parquet files into batches.

    ``sink`` receives every non-empty output (a join's output table, a pipeline's
    ``{output: change set}``); a sink that takes a second argument also gets the
    :class:`~population.OutputBatch` ``(input, index)`` of the input batch it comes from
    (:data:`population.resume.GO_LIVE` for what a pipeline owes its outputs when it goes
    live: the rows its global aggregates have over inputs that stayed empty).  Delivery
    is **at least once, with an exact re-delivery range**: a batch's output is delivered
    before the batch is durable, so a crash never loses an output; a resumed call
    reports in ``report.redelivered`` the first batch index per input whose output it
    delivers again, and delivers every later batch's output once.  Dropping the
    interrupted run's outputs of batches ``>= redelivered[input]`` (or keeping the last
    delivery per ``(input, index)``) gives exactly the output of an uninterrupted run.

    **Interruptions.** Each batch commits its input's progress marker in its own
    transaction (:mod:`population.resume`), so after a crash, a kill -9 or an exception
    the state holds a known prefix of each input.  ``populate`` on such a target raises
    :class:`~population.PopulationInterruptedError` naming each input's progress; with
    ``resume=True`` it continues instead: it reads each input again, skips the batches
    already loaded (checking their digest: a changed input raises
    ``PopulationInterruptedError``), and reuses the interrupted run's strategy, order,
    small side and ``batch_rows`` (an explicit argument that contradicts them is an
    error naming it).  The result (state, summed output with the re-delivered range
    dropped) equals an uninterrupted run's.  ``resume=True`` with no interrupted
    population is an ordinary call.  The other remedy is ``store.drop_join(name)`` (or
    ``store.drop_pipeline``), then create and populate it again.  The markers are
    cleared when the target goes live (a ``go_live=False`` call leaves them, every input
    ``done``, for the next call to clear: it is not an interruption).

    ``go_live`` (default True) moves the target to the live phase at the end, in one
    write with the removal of the markers and the hand-over of what it owes its outputs
    (:meth:`~joinstate.maintained.Maintained.go_live`); ``go_live=False`` leaves it in
    the population phase, for drivers that load the inputs in separate calls (Spark runs
    a join's small side's job, then the big side's).  ``sample_interval`` is the least
    number of seconds between two samples of the L0 file counts, pending compaction
    bytes and RSS; the guard's thresholds are checked at each sample, so 0 checks them
    after every batch.

    The resulting state and the sum of the output deltas do not depend on the strategy
    or the order.  Auto-compaction is re-enabled on every column family on every exit
    path (and a store reopened after a crash starts with it on).
    """
    target = join
    face = face_of(target)
    store = target.store
    if store is None or store.closed:
        raise PopulationError(f"{target.kind} {target.name!r} is bound to a closed state store")
    data = _inputs(target, face, left, right, sources)
    _check_arguments(target, face, strategy, order, sizes, batch_rows, sample_interval)
    if target.phase == "live":
        raise PopulationError(
            f"{target.kind} {target.name!r} in {store.path} is already live; population "
            f"loads a {target.kind} once, live changes go through push()")
    found = markers(target)
    # Inputs loaded by an earlier go_live=False call (a driver loading one side per
    # call): start afresh; this call's figures are not a whole population then, so they
    # are not recorded for the planner.
    preloaded = completed(found, target.inputs)
    if preloaded:
        target.clear_progress()
        found = {}
    if found and not resume:
        raise_interrupted(target, found)
    # Nothing of this target is being ingested now (one writer): staging files are leftovers.
    remove_staging(store.path, target.owner)
    identity = {s: source_identity(d) for s, d in data.items()}
    given_strategy = strategy
    if found:
        rec = next(iter(found.values()))
        for other in found.values():
            if (other.strategy, other.order, other.small, other.batch_rows, other.inputs) != (
                    rec.strategy, rec.order, rec.small, rec.batch_rows, rec.inputs):
                raise_interrupted(target, found, "the progress markers disagree on the run's "
                                  "parameters, so it cannot be resumed")
        bad = _conflicts(strategy, order if isinstance(order, str) else None, batch_rows, rec)
        if bad:
            raise PopulationError(
                f"{target.kind} {target.name!r}: resume=True continues the interrupted "
                f"population with its own parameters; these arguments contradict them: "
                f"{'; '.join(bad)}. Leave them out (or pass the same values)")
        missing = [s for s, m in found.items() if m.batches and s not in data]
        if missing:
            raise_interrupted(target, found, f"cannot resume: no input given for {missing}, "
                              "which the interrupted population loaded from")
        batch_rows = rec.batch_rows or batch_rows or face.batch_rows
        srcs = {s: Source(s, d, batch_rows) for s, d in data.items()}
        for s, m in found.items():
            if s in srcs:
                _skip(target, s, srcs[s], m, found, identity[s])
        known: dict[str, int | None] = {s: srcs[s].rows for s in srcs}
        fixed, strat = _resumed_strategy(target, face, rec, strategy, found)
        # The interrupted run's choices are fixed: the plan records them as given.
        plan = _plan(target, _stats(target, data, srcs, known),
                     rec.order if rec.order is not None else None,
                     {**fixed, **({"small_side": rec.small} if rec.small else {})})
        small, small_from = rec.small, rec.small_from
        if strat is None:
            strat = from_plan(plan, target.name)
        given_strategy = rec.strategy.get("name") if rec.strategy.get("name") else strategy
    else:
        batch_rows = batch_rows or face.batch_rows
        srcs = {s: Source(s, d, batch_rows) for s, d in data.items()}
        known = {s: srcs[s].rows for s in srcs}
        if sizes:
            known.update(sizes)
        if strategy is None and face.fixed_strategies:
            strategy = "asymmetric"
        fixed = _fixed(strategy)
        stats = _stats(target, data, srcs, known)
        plan = _plan(target, stats, order, fixed)
        decided = plan.get("small_side", target.name, _UNDECIDED)
        small_from = "strategy" if fixed.get("small_side") is not None else "sizes"
        if decided is None:  # the plan needs the small side, and no size tells it: count
            counted_small, counted = count_small(srcs)
            known = {s: known[s] if known[s] is not None else counted[s] for s in srcs}
            stats = {s: stats[s].replace(rows=known[s], rows_at_least=max(
                stats[s].rows_at_least, srcs[s].rows_read), origin="counted") for s in srcs}
            plan = _plan(target, stats, order, fixed)
            decided = plan.get("small_side", target.name)
            if decided is None:  # a tie in lockstep: the side that ran out first
                plan = _plan(target, stats, order, {**fixed, "small_side": counted_small})
                decided = counted_small
            small_from = "counted"
        small = None if decided is _UNDECIDED else cast("str | None", decided)
        if decided is _UNDECIDED:
            small_from = ""
        strat = strategy if isinstance(strategy, Strategy) else from_plan(plan, target.name)
    program = _program(target, plan, strat, small, small_from, batch_rows, list(data))
    total = None
    if all(known.get(s) is not None for s in program.sequence):
        total = sum(known[s] or 0 for s in program.sequence)
    bar = Progress(progress, total, f"populate {target.name}")
    run = Run(target, program, srcs, sink, lambda outs: face.value(target, outs), bar,
              sample_interval, identity=identity, go_live=go_live)
    run.resume_from(found)
    # An input without a marker has nothing durable: its outputs all come again.
    redelivered: dict[str, int] = (
        {s: found[s].batches if s in found else 0 for s in program.sequence} if found else {})
    operators_before = target.operator_rows()
    before = statistics_counters(store.statistics())
    log.info("%s %s %s with %s (%s), order %s, small %s (%s)",
             "resuming" if found else "populating", target.kind, target.name, strat.name,
             strat.reason or "given", program.order, small, small_from)
    _execute(run, target, store, go_live, bar)
    after = statistics_counters(store.statistics())
    ingested = run.ingester.bytes if run.ingester is not None else 0
    operators = {k: v - operators_before.get(k, 0) for k, v in target.operator_rows().items()}
    chosen = strat.name
    text = chosen if isinstance(given_strategy, str) and given_strategy != "auto" else (
        f"auto->{chosen}" if not isinstance(given_strategy, Strategy) else chosen)
    outcome = _Outcome(target, run, plan, text, found, redelivered,
                       counter_delta(after, before), ingested,
                       time.perf_counter() - run.t0, operators)
    report = face.report(outcome)
    if not found and not preloaded and go_live:
        # What this run measured, for the planner's next decision on this target (only a
        # whole population in one call: a driver loading one side per call is not one).
        _record(target, run, chosen, outcome.wall, operators)
    log.info("population of %s %s done:\n%s", target.kind, target.name, report.summary())
    return cast("Report | PipelineReport", report)


def _execute(run: Run, target: Maintained, store: Any, go_live: bool, bar: Progress) -> None:
    """Run, settle and go live; every disabled family is re-enabled on every exit path."""
    failed = True
    try:
        with guarded(run.control):
            try:
                run.run()
                run.dispatch(PopulationEnded(failed=False))
                failed = False
            finally:
                if failed:
                    # The markers stay as they are: a resume continues from them.
                    if run.ingester is not None:
                        run.ingester.discard()
                        if not store.closed:
                            # Writes handed to the bulk sink never became durable, but
                            # the in-memory counters and entry maps counted them.
                            target.reload()
                    try:
                        run.dispatch(PopulationEnded(failed=True))
                    except Exception:
                        log.exception("a compaction policy failed while population failed")
                run.restore_write_buffer()
        target.settle()
        if go_live:
            run.hand_over()  # phase, markers and what is owed in one write
    finally:
        bar.close()
        if run.ingester is not None:
            run.ingester.discard()
    run.sample(None, force=True)


def _fixed(strategy: str | Strategy | None) -> dict[str, Any]:
    """The planner's ``given`` choices for a strategy argument (``auto``: none)."""
    if isinstance(strategy, Strategy):
        return fixed_choices(strategy)
    if strategy is None or strategy == "auto":
        return {}
    return {"strategy": strategy}


def _resumed_strategy(target: Maintained, face: Face, rec: Marker,
                      strategy: str | Strategy | None, found: Mapping[str, Marker]
                      ) -> tuple[dict[str, Any], Strategy | None]:
    """The interrupted run's strategy: the planner's given choices, and the Strategy.

    A marker records the whole :class:`Strategy`; an older pipeline marker only its
    name (the plan then rebuilds the Strategy from it), or none (the arguments apply).
    """
    name = rec.strategy.get("name")
    if not rec.strategy:
        return _fixed(strategy), None
    if set(rec.strategy) == {"name"}:
        return _fixed(str(name)), None
    try:
        strat = Strategy(**rec.strategy)
    except (TypeError, PopulationError) as exc:
        raise_interrupted(target, found, f"its strategy is unreadable ({exc})")
        raise  # raise_interrupted always raises
    fixed = fixed_choices(strat) if face.fixed_strategies else {"strategy": strat.name}
    return fixed, strat


def _record(target: Maintained, run: Run, strategy: str, seconds: float,
            operators: dict[str, int]) -> None:
    """Record what a whole population measured, for the planner's next plan of ``target``."""
    store = target.store
    if store is None:
        return
    indexes = {}
    for ix in target.indexes():
        size = sum(store.property_int(cf, prop) or 0 for cf in ix.column_families
                   for prop in ("rocksdb.total-sst-files-size",
                                "rocksdb.cur-size-all-mem-tables"))
        indexes[ix.column_family] = {"rows": ix.rows, "entries": ix.entries, "bytes": size}
    record_population(
        store, target.owner, strategy=strategy, rows=sum(run.rows.values()),
        seconds=round(seconds, 4),
        inputs={s: (run.rows[s], run.seconds[s]) for s in run.program.sequence},
        indexes=indexes, operators=operators or None,
    )


def _dir_bytes(path: Any) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                continue  # a file removed by a background compaction meanwhile
    return total
