"""``joinstate bench tpcds --queries ... --paths``: each apply path timed on the same batch.

Per query and batch size, one change batch (the four kinds of :mod:`bench.tpcds_all`,
each fact table's rows per kind a share ``size`` of the table) is applied three ways
to the same populated state: ``strategy="incremental"``, ``"recompute"`` (every
operator with a recompute path on it) and ``"auto"`` (the planner's choice, per
operator), each timed and its answer checked against DuckDB; DuckDB's time for the
query from scratch on the changed tables is measured beside them (median of
:data:`DUCKDB_RUNS`).  Every size starts again from the populated state: the batches
are not cumulative.

**The same state for every way.**  The store is populated once and closed; its
directory is the *base*.  Each way runs on a copy of it made the way RocksDB's own
checkpoints are: SST files, which RocksDB never modifies once written, are hard-linked
(free, and the base's files stay as they are when the copy compacts or deletes them);
every other file (MANIFEST, WAL, OPTIONS, CURRENT) is copied byte for byte.  The copy
is then opened and the view attached again (``planner.sql.compile`` re-attaches a
stored view), so each way starts from exactly the populated state, including the
planner's cost records: ``auto`` decides from what population left (the defaults, or
records the store already held), never from the other ways' runs on the same batch.
The output integrated from population is copied too, so each way's answer is checked
whole (the integrated output and ``read()``), as in :mod:`bench.tpcds_all`.  After the
reopen, :meth:`joinstate.Pipeline.warm` builds what a live view holds in memory once it
has taken its first retraction (the sources' row multisets, one scan of each record:
2.7 s for q3's 2.9M store_sales rows at SF1 under load, paid by the first push after an
open), untimed: the times are those of a view kept open, which is what DuckDB's
from-scratch time is compared with.

**The held-out rows.**  The first batch of :mod:`bench.tpcds_all` re-inserts candidate
rows held out of the population.  Here rows are held out once, at the largest size,
and each size's batch re-inserts as many of them as its share gives.

**How a batch is applied** (``push``): by default as one push of every source's change
(:func:`population.apply_changes`); ``push="source"`` applies one source at a time,
dimensions first, and times each (what the facts-only count needs).

**What is reported**, per query and size: the three times (the batch's push, or the sum
of every source's apply), the planner's choice per source (one letter each: ``i``
incremental, ``r`` recompute, ``m`` some operators recomputed), ``choice/best``
(``auto``'s time over the faster of the two fixed paths) measured, and *by plan*:
where ``auto``'s choice equals one of the fixed paths for every source (every operator
incremental, or every one recomputed), that path's measured time stands for it, so
the ratio shows what the choice costs without the noise of timing one more run; the
same in CPU seconds of the applying thread (``cpu_seconds``: steadier on a shared
machine); per operator, its rows in and out, keys looked up, ms and rows scanned on
each way (what a cost model is fitted on), and ``auto``'s estimates and reasons.
Summary: queries whose choice is within :data:`TARGET` of the best at every size (by
plan, measured, by plan in CPU seconds), how far apart two runs of one plan were (the
noise every ratio carries), and queries whose smallest batch beats DuckDB (whole, and
counting only the fact tables' applies).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa  # noqa: TC002 - the worker's tables, annotated at module level

from bench import tpcds, tpcds_all
from bench.q4 import Integrated
from bench.tpcds_all import (
    FACTS,
    TABLES,
    Changes,
    Oracle,
    QueryResult,
    check_view,
    compile_query,
    plain,
    prepare_changes,
    query_sources,
    unordered,
    valid_batch,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["DEFAULT_SIZES", "DUCKDB_RUNS", "ONE_PUSH", "PUSHES", "REPEAT", "TARGET", "WAYS",
           "PathsResult",
           "SizeResult", "copy_store", "from_partial", "run", "run_query", "summarize",
           "to_markdown", "write_report"]

DEFAULT_SIZES = (0.0001, 0.001, 0.01, 0.1)
"""Rows per kind and fact table, as a share of the table (0.01%, 0.1%, 1%, 10%)."""
WAYS = ("incremental", "recompute", "auto")
TARGET = 1.2
"""The planner's choice may cost at most this multiple of the faster fixed path."""
DUCKDB_RUNS = 3
REPEAT = 2
"""Runs of each way per size (from the same state each time); the fastest is reported."""
PUSHES = ("batch", "source")
"""How a batch is applied: ``batch``, every source's change in one push
(:func:`population.apply_changes`, what a micro-batch of change capture is); ``source``,
one push per source, dimensions first (:func:`population.apply_batch`), which times
each source apart."""
ONE_PUSH = "one push"
"""The name a ``batch`` run gives its one apply where a ``source`` run names sources."""


def copy_store(src: Path, dst: Path) -> None:
    """A copy of the closed store ``src`` at ``dst``: SST files hard-linked, the rest copied.

    RocksDB writes an SST file once and never changes it (compaction writes new files
    and unlinks old ones), so a hard link is an exact copy that stays exact whatever
    either store does later; the files RocksDB appends to or rewrites (MANIFEST, WAL,
    OPTIONS, CURRENT, the LOG) are copied.  The directory must not be open.
    """
    def link_or_copy(s: str, d: str) -> object:
        if s.endswith(".sst"):
            os.link(s, d)
            return d
        return shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_or_copy)


@dataclass
class SizeResult:
    """One batch size of one query: the batch, each way's time and check, DuckDB's time."""

    size: float
    batch_rows: dict[str, int] = field(default_factory=dict)
    """Rows per kind (new, delete, update, reinsert)."""
    source_rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Per way: the sum of its applies (wall seconds)."""
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    """``auto``'s path per source (``incremental``, ``recompute`` or a mix)."""
    plans: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    """Per way and source: each operator's path (label -> strategy)."""
    operators: dict[str, dict[str, dict[str, dict[str, float]]]] = field(default_factory=dict)
    """Per way, source and operator: rows_in, rows_out, keys, found, ms, scanned_rows,
    scan_ms (:class:`joinstate.ops.base.OperatorRun`)."""
    estimates: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """``auto``'s estimates per source and operator: incremental_ms, recompute_ms, rows."""
    reasons: dict[str, str] = field(default_factory=dict)
    """``auto``'s explanation per source (``ApplyReport.explain``)."""
    source_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per way and source: that source's apply (seconds) in the way's fastest run."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    source_cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    """As ``seconds`` and ``source_seconds``, in CPU seconds of the thread that applies:
    on a machine shared with other work, the time it spent descheduled is not in them,
    nor RocksDB's background flushes and compactions (the copy of a store compacts
    when it is opened, at moments no way chooses), so ratios between ways are steadier
    than wall time's.  Reads and writes run on the applying thread and count."""
    warm_s: dict[str, float] = field(default_factory=dict)
    """Per way: seconds of ``Pipeline.warm`` after the reopen (not in ``seconds``)."""
    runs: dict[str, list[float]] = field(default_factory=dict)
    """Per way: the seconds of every run (``seconds`` keeps the fastest)."""
    duckdb_s: float | None = None
    rows: int = 0
    changed: bool = False

    def best(self) -> float | None:
        """The faster of the two fixed paths (seconds)."""
        fixed = [self.seconds[w] for w in ("incremental", "recompute") if w in self.seconds]
        return min(fixed) if fixed else None

    def same_as(self) -> dict[str, str]:
        """Per source: the fixed path whose plan ``auto`` ran for it (absent: a mix)."""
        auto = self.plans.get("auto", {})
        out = {}
        for s, plan in auto.items():
            for way in ("incremental", "recompute"):
                if self.plans.get(way, {}).get(s) == plan:
                    out[s] = way
                    break
        return out

    def ratio(self) -> float | None:
        """``auto``'s measured time over the best fixed path's."""
        best = self.best()
        if best is None or "auto" not in self.seconds or best <= 0:
            return None
        return self.seconds["auto"] / best

    def by_plan(self, cpu: bool = False) -> float | None:
        """``auto``'s seconds, each source's apply timed by the fixed way of the same plan.

        Where ``auto`` ran the plan of a fixed way for a source (every operator
        incremental, or every one recomputed), that way's time of the source stands
        for it: the ratio then shows what the choice costs, not one more run's noise.
        A source ``auto`` ran with a mix keeps its own time.  ``cpu``: CPU seconds.
        """
        per = self.source_cpu if cpu else self.source_seconds
        auto = per.get("auto")
        if auto is None:
            return None
        same = self.same_as()
        return sum(per[same[s]][s] if s in same else t for s, t in auto.items())

    def plan_ratio(self, cpu: bool = False) -> float | None:
        """:meth:`by_plan` over the best fixed path's time (``cpu``: CPU seconds)."""
        times = self.cpu_seconds if cpu else self.seconds
        fixed = [times[w] for w in ("incremental", "recompute") if w in times]
        mine = self.by_plan(cpu)
        if not fixed or min(fixed) <= 0 or mine is None:
            return None
        return mine / min(fixed)

    @property
    def ok(self) -> bool:
        """Every way's answer matched DuckDB's."""
        return bool(self.checks) and all(c["ok"] for c in self.checks.values())


@dataclass
class PathsResult:
    """One query's run: population, then one :class:`SizeResult` per size."""

    query: int
    status: str = "pending"
    """``ok``, ``failed`` (a check differed), ``vacuous`` (every check matched, but the
    answer was empty after population or no batch changed it: the checks prove
    nothing), ``refused`` (compile), ``error``."""
    reason: str = ""
    sources: list[str] = field(default_factory=list)
    population_s: float | None = None
    state_rows: int = 0
    nonempty: bool = False
    """The answer after population has a row that is not all zeros and NULLs."""
    sizes: list[SizeResult] = field(default_factory=list)
    traceback: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every answer matched (a refusal is a listed outcome, not a failure)."""
        return self.status in ("ok", "refused")


def _copy_integrated(src: Integrated) -> Integrated:
    out = Integrated()
    out.pending = {k: list(v) for k, v in src.pending.items()}
    out.deltas = src.deltas
    return out


def _apply_way(n: int, way: str, sql: str, srcs: Mapping[str, Any], base_dir: Path,
               work: Path, deltas: Mapping[str, pa.Table], integrated: Integrated,
               want: pa.Table, lim: pa.Table, order: Sequence[str], sr: SizeResult,
               push: str = "batch") -> None:
    """Apply the batch ``way`` to a fresh copy of the populated store; time and check it.

    The fastest of the repeated runs of a way is kept (its plan and operator times
    with it); every run is checked, and the first wrong one is what ``checks`` keeps.
    """
    import joinstate
    import population
    from planner.sql import compile

    name = f"q{n}"
    state = work / f"{way}-{sr.size:g}"
    copy_store(base_dir, state)
    try:
        with joinstate.StateStore(state) as store:
            p = compile(sql, srcs, store=store, name=name)
            p.compile()
            # what a live view holds in memory after its first retraction: not timed
            sr.warm_s[way] = sum(p.warm().values())
            mine = _copy_integrated(integrated)
            total = cpu = 0.0
            per_source: dict[str, float] = {}
            per_cpu: dict[str, float] = {}
            plans: dict[str, dict[str, str]] = {}
            ops: dict[str, dict[str, dict[str, float]]] = {}
            choices: dict[str, str] = {}
            reasons: dict[str, str] = {}
            estimates: dict[str, dict[str, dict[str, float]]] = {}
            pushes: list[tuple[str, Mapping[str, pa.Table]]] = (
                ([(ONE_PUSH, deltas)] if deltas else []) if push == "batch" else
                [(s, {s: deltas[s]}) for s in sorted(deltas, key=lambda s: (s in FACTS, s))])
            for s, changes in pushes:
                t0, c0 = time.perf_counter(), time.thread_time()
                rep = population.apply_changes(p, changes, strategy=way)  # type: ignore[arg-type]
                per_source[s] = time.perf_counter() - t0
                per_cpu[s] = time.thread_time() - c0
                total += per_source[s]
                cpu += per_cpu[s]
                mine.add(rep.output)
                plans[s] = {str(d.figures["operator"]): str(d.choice) for d in rep.operators}
                ops[s] = {label: {"rows_in": r.rows_in, "rows_out": r.rows_out,
                                  "keys": r.keys, "found": r.found,
                                  "ms": round(r.ms, 3),
                                  "scanned_rows": r.scanned_rows, "scan_ms": round(r.scan_ms, 3)}
                          for label, r in rep.operator_runs.items()}
                choices[s] = rep.strategy
                reasons[s] = rep.explain()
                estimates[s] = {
                    str(d.figures["operator"]): {
                        "rows": float(d.figures["batch_rows"]),
                        "scanned_rows": float(d.figures["scanned_rows"]),
                        "incremental_ms": float(d.figures["incremental_ms"]),
                        "recompute_ms": float(d.figures["recompute_ms"])}
                    for d in rep.operators}
            check = check_view(p, name, mine, want, lim, order)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if not check["ok"] or sr.checks.get(way, {"ok": True})["ok"]:
        sr.checks[way] = check
    sr.runs.setdefault(way, []).append(total)
    if way not in sr.cpu_seconds or cpu < sr.cpu_seconds[way]:
        sr.cpu_seconds[way], sr.source_cpu[way] = cpu, per_cpu
    if way in sr.seconds and sr.seconds[way] <= total:
        return
    sr.seconds[way], sr.plans[way], sr.operators[way] = total, plans, ops
    sr.source_seconds[way] = per_source
    if way == "auto":
        sr.choices, sr.reasons, sr.estimates = choices, reasons, estimates


def _duckdb_seconds(oracle: Oracle, sql: str) -> float:
    return float(np.median([oracle.answer(sql)[1] for _ in range(DUCKDB_RUNS)]))


def run_query(n: int, base: Mapping[str, pa.Table], workdir: Path, *,
              sizes: Sequence[float] = DEFAULT_SIZES, seed: int = 0, repeat: int = REPEAT,
              step: Callable[[str], None] | None = None, push: str = "batch") -> PathsResult:
    """Populate query ``n`` once; per size, one batch applied each of the :data:`WAYS`."""
    import joinstate
    import population

    res = PathsResult(n)
    t_start = time.perf_counter()
    say = step or (lambda _: None)
    sql = tpcds.query(n)
    name = f"q{n}"
    srcs = query_sources(base)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-paths-", dir=workdir))
    base_dir = work / "populated"
    try:
        say("compile")
        integrated = Integrated()
        with joinstate.StateStore(base_dir) as store:
            compiled = compile_query(n, base, store)
            if isinstance(compiled, str):
                res.status, res.reason = "refused", compiled
                return res
            p, order = compiled
            res.sources = sorted(p.sources)
            say("candidates")
            scratch = QueryResult(n)
            changes = prepare_changes(n, sql, base, res.sources, scratch, seed=seed,
                                      share=max(sizes))
            say("populate")
            t0 = time.perf_counter()
            population.populate(p, sources={s: plain(changes.tables.t[s])
                                            for s in res.sources},
                                progress=False, sink=integrated.add)
            res.population_s = time.perf_counter() - t0
            res.state_rows = sum(ix.rows for ix in p.indexes())
        held = dict(changes.previous)
        oracle = Oracle()
        try:
            oracle.load(changes.tables.t, res.sources)
            populated = oracle.answer(unordered(sql))[0]
            res.nonempty = not tpcds_all.is_trivial(populated)
            for turn, size in enumerate(sizes):
                say(f"size {size:g}")
                res.sizes.append(_one_size(n, sql, srcs, base_dir, work, changes, held,
                                           oracle, populated, integrated, order, size,
                                           scratch, say, repeat, push, turn))
        finally:
            oracle.close()
        bad = [(s.size, w, c) for s in res.sizes for w, c in s.checks.items() if not c["ok"]]
        res.status = "failed" if bad else "ok"
        if bad:
            size, way, c = bad[0]
            res.reason = f"size {size:g}, {way}: {c['what']}: {c['detail']}"
        elif not res.nonempty or not any(s.changed for s in res.sizes):
            res.status = "vacuous"
            res.reason = ("the answer after population is empty (or one row of zeros and "
                          "NULLs)" if not res.nonempty else "no batch changed the answer")
    except Exception as e:  # one query's fault is its row, named; the run goes on
        import traceback

        res.status = "error"
        res.reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        res.traceback = traceback.format_exc(limit=-6)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        res.seconds = time.perf_counter() - t_start
    return res


def _one_size(n: int, sql: str, srcs: Mapping[str, Any], base_dir: Path, work: Path,
              changes: Changes, held: Mapping[str, pa.Table], oracle: Oracle,
              populated: pa.Table, integrated: Integrated, order: Sequence[str],
              size: float, scratch: QueryResult, say: Callable[[str], None], repeat: int,
              push: str = "batch", turn: int = 0) -> SizeResult:
    """One batch of ``size`` drawn from the populated state, applied each way, undone.

    The first apply of a newly drawn batch usually ran slower than the next ones,
    whichever way it was (SF1, q9: at 1% 229-241 ms against 69-87, at 10% 2.0-3.0 s
    against 0.62-0.9 s, with the same plan; the time is in Arrow's own operations on the
    batch, the cause is not found), so one untimed apply (auto's) goes before the timed
    ones: with it q9's ways at 1% took 72-86 ms.  At 10% an apply is still now and then
    that slow, first or not.  ``turn`` (the size's place in the run) rotates which way
    goes first, and so does each repeat, so such an effect does not fall on one way
    every time.
    """
    sr = SizeResult(size)
    snap = changes.snapshot()
    changes.share = size
    # re-inserts: as many held-out rows as this size's share gives
    changes.previous = {s: t.slice(0, changes.rows_per_kind(s)) for s, t in held.items()}
    b = valid_batch(changes, oracle, sql, scratch, populated)
    try:
        sr.batch_rows = dict(b.rows)
        sr.source_rows = {s: d.num_rows for s, d in b.deltas.items()}
        lim, _ = oracle.answer(sql)
        want, _ = oracle.answer(unordered(sql))
        sr.duckdb_s = _duckdb_seconds(oracle, sql)
        sr.rows = want.num_rows
        sr.changed = not tpcds_all.same_answer(want, populated)
        say(f"size {size:g}: warm-up (auto, not timed)")
        warm = SizeResult(size)
        _apply_way(n, "auto", sql, srcs, base_dir, work, b.deltas, integrated, want, lim,
                   order, warm, push)
        if not warm.checks["auto"]["ok"]:  # its time is not kept, its answer counts
            sr.checks["auto"] = warm.checks["auto"]
        for r in range(repeat):  # the ways interleaved: drifting load hits each alike
            k = (turn + r) % len(WAYS)
            for way in (*WAYS[k:], *WAYS[:k]):
                say(f"size {size:g}: {way} (run {r + 1} of {repeat})")
                _apply_way(n, way, sql, srcs, base_dir, work, b.deltas, integrated, want,
                           lim, order, sr, push)
    finally:
        changes.restore(snap)
        oracle.load(changes.tables.t, b.deltas)
    return sr


# ---- the run ---------------------------------------------------------------------------


def run(queries: Sequence[int], sf: float, *, sizes: Sequence[float] = DEFAULT_SIZES,
        seed: int = 0, repeat: int = REPEAT, workdir: Path | None = None,
        cache_dir: Path | None = None, jobs: int = 1,
        say: Callable[[str], None] | None = None, partial: Path | None = None,
        push: str = "batch") -> dict[str, Any]:
    """Every query of ``queries`` at ``sf`` (see the module docstring): a JSON-able dict.

    ``push``: one of :data:`PUSHES`.

    ``partial``: a file that gets each query's row as one JSON line the moment it is
    done (a long run's results readable before it ends, and kept if it is stopped).
    """
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
    if not sizes or any(not 0 < s <= 1 for s in sizes):
        raise tpcds_all.QueryArgumentError(
            f"--sizes {list(sizes)}: give shares of a fact table in (0, 1], e.g. "
            "0.0001,0.001,0.01,0.1")
    if repeat < 1:
        raise tpcds_all.QueryArgumentError(f"--repeat {repeat}: give at least 1")
    if push not in PUSHES:
        raise tpcds_all.QueryArgumentError(f"--push {push}: give one of {', '.join(PUSHES)}")
    t0 = time.perf_counter()
    tell: Callable[[str], None] = say or (lambda _: None)
    tell(f"loading TPC-DS SF{sf:g}")
    tpcds.tables(sf, TABLES, cache_dir=cache_dir)
    work = workdir or Path(tempfile.mkdtemp(prefix="joinstate-tpcds-paths-"))
    work.mkdir(parents=True, exist_ok=True)
    done: dict[int, PathsResult] = {}

    def finished(r: PathsResult) -> None:
        done[r.query] = r
        tell(_line(r))
        if partial is not None:
            with partial.open("a") as f:
                f.write(json.dumps(_row(r), default=str) + "\n")

    try:
        if jobs <= 1:
            base = tpcds_all.load_tables(sf, cache_dir)
            for n in queries:
                def step(what: str, n: int = n) -> None:
                    tell(f"q{n}: {what}")

                finished(run_query(n, base, work, sizes=sizes, seed=seed, repeat=repeat,
                                   step=step, push=push))
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed
            from multiprocessing import get_context

            with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"),
                                     initializer=_worker_init,
                                     initargs=(sf, cache_dir)) as pool:
                futures = {pool.submit(_worker_run, n, work, tuple(sizes), seed, repeat,
                                       push): n
                           for n in queries}
                for f in as_completed(futures):
                    finished(f.result())
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    results = [done[n] for n in queries]
    rows = [_row(r) for r in results]
    return {"sf": sf, "seed": seed, "sizes": list(sizes), "repeat": repeat, "push": push,
            "queries": list(queries), "jobs": jobs, "seconds": time.perf_counter() - t0,
            "ok": all(r.ok for r in results), "environment": _environment(),
            "summary": summarize(rows), "results": rows}


def _environment() -> dict[str, Any]:
    env = tpcds_all.environment()
    env["load_start"] = os.getloadavg()[0]
    return env


_BASE: dict[str, pa.Table] = {}
"""A worker process's tables (loaded once per process by :func:`_worker_init`)."""


def _worker_init(sf: float, cache_dir: Path | None) -> None:
    os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
    _BASE.update(tpcds_all.load_tables(sf, cache_dir))


def _worker_run(n: int, work: Path, sizes: tuple[float, ...], seed: int, repeat: int,
                push: str = "batch") -> PathsResult:
    return run_query(n, _BASE, work, sizes=sizes, seed=seed, repeat=repeat, push=push)


def _row(r: PathsResult) -> dict[str, Any]:
    d = asdict(r) | {"ok": r.ok}
    for s, sd in zip(r.sizes, d["sizes"], strict=True):
        sd |= {"best": s.best(), "ratio": s.ratio(), "plan_ratio": s.plan_ratio(),
               "cpu_plan_ratio": s.plan_ratio(cpu=True), "same_as": s.same_as(), "ok": s.ok}
    d["load"] = os.getloadavg()[0]
    return d


def _letters(choices: Mapping[str, str]) -> str:
    return "".join({"incremental": "i", "recompute": "r"}.get(c, "m")
                   for _, c in sorted(choices.items())) or "-"


def _line(r: PathsResult) -> str:
    if r.status in ("refused", "error"):
        return f"q{r.query}: {r.status}: {r.reason}"
    parts = []
    for s in r.sizes:
        t = "/".join(f"{s.seconds.get(w, float('nan')) * 1e3:.0f}" for w in WAYS)
        parts.append(f"{s.size:g}: {t} ms {_letters(s.choices)} "
                     f"x{s.plan_ratio() or float('nan'):.2f}")
    ddb = r.sizes[0].duckdb_s if r.sizes else None
    return (f"q{r.query}: {r.status}; population {r.population_s or 0:.1f} s; "
            f"inc/rc/auto: {'; '.join(parts)}; DuckDB {ddb or 0:.3f} s"
            + (f"; {r.reason}" if r.status in ("failed", "vacuous") else ""))


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The counts the report leads with."""
    ran = [r for r in rows if r["sizes"] and r["status"] in ("ok", "failed", "vacuous")]

    def within(r: Mapping[str, Any], key: str) -> bool:
        return all(s[key] is not None and s[key] <= TARGET for s in r["sizes"])

    def beats(r: Mapping[str, Any], facts_only: bool = False) -> bool:
        s = min(r["sizes"], key=lambda s: s["size"])
        if s["duckdb_s"] is None or "auto" not in s["seconds"]:
            return False
        mine = _fact_seconds(s) if facts_only else s["seconds"]["auto"]
        return mine is not None and mine < s["duckdb_s"]

    per_source = [r for r in ran if all(
        _fact_seconds(x) is not None for x in r["sizes"] if "auto" in x["seconds"])]

    # two runs of one plan: auto's, and the fixed way whose plan it ran for every source
    spread: dict[str, list[float]] = {"wall": [], "cpu": []}
    for r in ran:
        for x in r["sizes"]:
            same = set(x["same_as"].values())
            if len(same) == 1 and len(x["same_as"]) == len(x["choices"]):
                (way,) = same
                for what, key in (("wall", "seconds"), ("cpu", "cpu_seconds")):
                    a, b = x[key].get("auto"), x[key].get(way)
                    if a and b:
                        spread[what].append(max(a, b) / min(a, b))
    noise = {what: {"pairs": len(v), "median": float(np.median(v)) if v else None,
                    "p90": float(np.percentile(v, 90)) if v else None}
             for what, v in spread.items()}
    return {
        "queries": len(rows),
        "ran": len(ran),
        "same_plan_spread": noise,
        "refused": sorted(r["query"] for r in rows if r["status"] == "refused"),
        "errors": sorted(r["query"] for r in rows if r["status"] == "error"),
        "failed": sorted(r["query"] for r in rows if r["status"] == "failed"),
        "vacuous": sorted(r["query"] for r in rows if r["status"] == "vacuous"),
        "within_target_by_plan": sum(within(r, "plan_ratio") for r in ran),
        "within_target_measured": sum(within(r, "ratio") for r in ran),
        "within_target_cpu": sum(within(r, "cpu_plan_ratio") for r in ran),
        "over_target_cpu": sorted(r["query"] for r in ran if not within(r, "cpu_plan_ratio")),
        "over_target_by_plan": sorted(r["query"] for r in ran if not within(r, "plan_ratio")),
        "smallest_beats_duckdb": sum(beats(r) for r in ran),
        "duckdb_wins": sorted(r["query"] for r in ran if not beats(r)),
        "smallest_facts_beat_duckdb": (sum(beats(r, facts_only=True) for r in per_source)
                                       if per_source else None),
    }


def _fact_seconds(size: Mapping[str, Any]) -> float | None:
    """``auto``'s seconds for the fact tables' applies of a batch (dimension updates out).

    None for a batch applied as one push: no source was timed apart.
    """
    secs = size["source_seconds"].get("auto", {})
    if ONE_PUSH in secs:
        return None
    return sum(t for s, t in secs.items() if s in FACTS)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f}"


def to_markdown(results: Mapping[str, Any]) -> str:
    """Counts, then one row per query: per size inc / rc / auto ms, choice, ratios."""
    s, env = results["summary"], results["environment"]
    sizes = results["sizes"]
    lines = [
        f"# TPC-DS apply paths at SF{results['sf']:g}: incremental, recompute, the planner's "
        "choice",
        "",
        f"{env['date']}, commit {env['commit'] or '?'}, {env['machine']}, load at start "
        f"{env.get('load_start', float('nan')):.2f}; seed {results['seed']}; "
        f"{results['seconds']:.0f} s"
        + (f" with {results['jobs']} queries at a time." if results.get("jobs", 1) > 1
           else "."),
        "",
        f"- ran: {s['ran']} of {s['queries']}"
        + (f"; refused: {_qs(s['refused'])}" if s["refused"] else "")
        + (f"; errors: {_qs(s['errors'])}" if s["errors"] else "")
        + (f"; **failed** (an answer differed from DuckDB): {_qs(s['failed'])}"
           if s["failed"] else "; every answer matched DuckDB")
        + (f"; **vacuous** (empty after population, or no batch changed it): "
           f"{_qs(s['vacuous'])}" if s["vacuous"] else ""),
        f"- choice within {TARGET}x of the faster fixed path at every size: "
        f"{s['within_target_by_plan']} by plan, {s['within_target_measured']} measured, "
        f"{s['within_target_cpu']} by plan in CPU seconds"
        + (f" (over by plan: {_qs(s['over_target_by_plan'])}; in CPU seconds: "
           f"{_qs(s['over_target_cpu'])})" if s["over_target_by_plan"] else ""),
        f"- two runs of one plan (auto's, and the fixed way it matched for every source) "
        f"differ by a median {_x(s['same_plan_spread']['wall']['median'])}, 90th "
        f"percentile {_x(s['same_plan_spread']['wall']['p90'])} in wall time "
        f"({_x(s['same_plan_spread']['cpu']['median'])} / "
        f"{_x(s['same_plan_spread']['cpu']['p90'])} in CPU time; "
        f"{s['same_plan_spread']['wall']['pairs']} pairs): the noise any ratio carries",
        f"- smallest batch ({min(sizes):g}) faster than DuckDB from scratch: "
        f"{s['smallest_beats_duckdb']}"
        + (f" (DuckDB faster: {_qs(s['duckdb_wins'])})" if s["duckdb_wins"] else ""),
        (f"- the same, counting only the fact tables' applies (the batch's dimension "
         f"updates left out): {s['smallest_facts_beat_duckdb']}"
         if s["smallest_facts_beat_duckdb"] is not None else
         "- each batch was applied as one push of every source's change (no source timed "
         "apart; `--push source` times them one by one)"),
        "",
        "Per size: ms of incremental / recompute / auto (the batch's push, or every "
        "source's apply), auto's "
        "choice per push (i incremental, r recompute, m mixed per operator), the ratio "
        "of auto to the faster fixed path by plan (in brackets: measured, and by plan in "
        "CPU seconds). DuckDB: ms from scratch after the smallest batch (median of 3).",
        "",
    ]
    head = "| query | population s | " + " | ".join(f"{x:g}" for x in sizes) + \
        " | DuckDB ms | smallest / DuckDB | facts / DuckDB |"
    lines += [head, "|---|---:|" + "---|" * len(sizes) + "---:|---:|---:|"]
    for r in results["results"]:
        if r["status"] in ("refused", "error"):
            lines.append(f"| q{r['query']} | {r['status']} | "
                         + " | ".join("" for _ in sizes) + f" | | | {r['reason'][:60]} |")
            continue
        cells = []
        for x in r["sizes"]:
            t = " / ".join(_ms(x["seconds"].get(w)) for w in WAYS)
            pr, mr, cr = x["plan_ratio"], x["ratio"], x["cpu_plan_ratio"]
            flag = "**" if pr is not None and pr > TARGET else ""
            bad = "" if x["ok"] else " **WRONG**"
            cells.append(f"{t} {_letters(x['choices'])} {flag}{pr or 0:.2f}{flag} "
                         f"({mr or 0:.2f}; cpu {cr or 0:.2f}){bad}")
        vs = fv = "-"
        ddb = None
        if r["sizes"]:
            small = min(r["sizes"], key=lambda x: x["size"])
            ddb = small["duckdb_s"]
            if ddb and "auto" in small["seconds"]:
                vs = f"{small['seconds']['auto'] / ddb:.2f}"
                facts = _fact_seconds(small)
                fv = "-" if facts is None else f"{facts / ddb:.2f}"
        lines.append(f"| q{r['query']} | {r['population_s'] or 0:.1f} | " + " | ".join(cells)
                     + f" | {_ms(ddb)} | {vs} | {fv} |")
    losers = [r for r in results["results"] if r["query"] in s["duckdb_wins"]]
    if losers:
        lines += [
            "",
            f"## Where DuckDB wins the smallest batch ({min(sizes):g}): what the time went to",
            "",
            "Per query, the smallest batch as the planner applied it: the source whose apply "
            "took longest (its change rows, its ms of the total), and in it the operator that "
            "took longest: rows in and out, stored entries it read (found by key lookups, or "
            "scanned), ms.  What the operators do not account for is the fixed cost of a push "
            "(source row records, conforming and staging, the planner's decisions, the "
            "commit).",
            "",
            "| query | auto ms | DuckDB ms | slowest source | its slowest operator | "
            "operators' ms of the source's |",
            "|---|---:|---:|---|---|---:|",
        ]
        lines += [_floor_row(r) for r in losers]
    return "\n".join(lines) + "\n"


def _floor_row(r: Mapping[str, Any]) -> str:
    """One row of the report's floor table (see :func:`to_markdown`)."""
    small = min(r["sizes"], key=lambda x: x["size"])
    secs = small["source_seconds"].get("auto") or {}
    head = f"| q{r['query']} | {_ms(small['seconds'].get('auto'))} | {_ms(small['duckdb_s'])}"
    if not secs:
        return head + " | - | - | - |"
    src = max(secs, key=lambda k: secs[k])
    ops = (small.get("operators", {}).get("auto") or {}).get(src) or {}
    rows = small.get("source_rows", {}).get(src)
    where = f"{src} ({rows:,} rows): {_ms(secs[src])} ms" if rows is not None else \
        f"{src}: {_ms(secs[src])} ms"
    if not ops:
        return head + f" | {where} | - | - |"
    label = max(ops, key=lambda k: ops[k]["ms"])
    o = ops[label]
    read = f", {int(o['found']):,} entries found" if o.get("found") else ""
    read += f", {int(o['scanned_rows']):,} scanned" if o.get("scanned_rows") else ""
    top = (f"{label}: {int(o['rows_in']):,} → {int(o['rows_out']):,} rows{read}, "
           f"{o['ms']:,.1f} ms")
    share = sum(v["ms"] for v in ops.values()) / 1e3 / secs[src] if secs[src] else 0.0
    return head + f" | {where} | {top} | {share:.0%} |"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _qs(numbers: Sequence[int]) -> str:
    return ", ".join(f"q{q}" for q in numbers)


def from_partial(path: Path, sf: float, sizes: Sequence[float] = DEFAULT_SIZES, *,
                 seed: int = 0, repeat: int = REPEAT, jobs: int = 1,
                 push: str = "batch") -> dict[str, Any]:
    """The results of a run (stopped or still going) from its ``partial`` file.

    The rows are those written so far, in query order; ``seconds`` is 0 (unknown).
    """
    rows = sorted((json.loads(line) for line in path.read_text().splitlines() if line),
                  key=lambda r: r["query"])
    return {"sf": sf, "seed": seed, "sizes": list(sizes), "repeat": repeat, "push": push,
            "queries": [r["query"] for r in rows], "jobs": jobs, "seconds": 0.0,
            "ok": all(r["ok"] for r in rows), "environment": _environment(),
            "summary": summarize(rows), "results": rows}


def write_report(results: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """``paths.json`` and ``paths.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "paths.json", "markdown": out_dir / "paths.md"}
    files["json"].write_text(json.dumps(results, indent=1, default=str))
    files["markdown"].write_text(to_markdown(results))
    return files

