"""The report of ``joinstate bench tpcds``: markdown tables and PNG charts from a results dict.

Pure functions: :func:`write_report` takes the dict :func:`bench.tpcds_cli.run` returns
(``{"q4": bench.q4.run_q4's results, "spark": bench.q4spark.run's results or None,
...}``) and writes ``report.json``, ``report.md`` and the charts into a directory; nothing
here runs a benchmark, so a report can be redrawn from a saved ``report.json``
(``write_report(json.loads(path.read_text()), out)``).

Charts (matplotlib, drawn on ``Figure`` objects with the Agg canvas: no pyplot, no
global backend switch, nothing shown on a screen; imported only when a chart is drawn):

* ``population-timeline-<strategy>.png``: one per population strategy: input rows/s
  per source and write stall time over the load, then one panel per index and per
  aggregate with its L0 files, its size and RocksDB's pending compaction bytes, shaded
  where auto-compaction was off and marked where a manual compaction ran;
* ``population-time.png``: seconds per strategy (and Spark's population, if run);
* ``incremental.png``: median milliseconds of a change batch per batch size, against
  DuckDB computing q4 from scratch (and Spark's batches, if run);
* ``sharing.png``: shared vs unshared indexes: column families, bytes, customer-update
  time.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from joinstate.errors import JoinStateError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "KINDS",
    "MissingDependencyError",
    "ReportFiles",
    "compaction_off_spans",
    "draw_charts",
    "input_rates",
    "require_matplotlib",
    "state_groups",
    "state_label",
    "timeline_figure",
    "to_markdown",
    "write_report",
]

KINDS = ("insert", "delete", "customer", "date")
"""The batch kinds of :mod:`bench.q4`, in the order a batch applies them."""
KIND_TEXT = {"insert": "new sales", "delete": "deleted sales",
             "customer": "customer updates", "date": "date_dim correction"}
MIB = 1 << 20
MAX_STATE_PANELS = 15
"""Indexes and aggregates drawn per timeline (the largest first); the rest are listed."""
_SUFFIXES = (".nulls", ".deg", ".minmax")
"""Families that belong to another family's index or aggregate (``joinstate.names``)."""


class MissingDependencyError(JoinStateError, ImportError):
    """A package of the ``bench`` (or ``spark``) extra is not installed; the message says which."""


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    directory: Path
    json: Path
    markdown: Path
    charts: dict[str, Path] = field(default_factory=dict)


# ---- pure helpers over samples and actions ---------------------------------------------


def state_groups(families: Iterable[str]) -> dict[str, list[str]]:
    """Column families grouped by the index or aggregate they belong to, in first-seen order.

    ``ix.p~s[k]`` and ``ix.p~s[k].nulls`` form one group named ``ix.p~s[k]``; an
    aggregate's ``.minmax`` family joins its ``agg[...]`` family.
    """
    out: dict[str, list[str]] = {}
    for cf in families:
        base = cf
        for suffix in _SUFFIXES:
            if cf.endswith(suffix):
                base = cf[: -len(suffix)]
                break
        out.setdefault(base, []).append(cf)
    return out


def state_label(group: str, labels: Mapping[str, str] | None = None) -> str:
    """A short title for a group: its label in SQL terms if ``labels`` has one.

    ``labels`` (:func:`bench.labels.state_labels`, recorded with the run) reads
    ``store_sales ⋈ date_dim by ss_customer_sk``; without it the family name is shortened:
    ``index store_sales [ss_sold_date_sk]``, ``aggregate agg5`` (the pipeline's name,
    before the first ``~``, dropped: every panel has it).
    """
    if labels and group in labels:
        return labels[group]
    m = re.fullmatch(r"ix\.[^~]*~(.*)\[(.*)\]", group)
    if m:
        return f"index {m.group(1)} [{m.group(2)}]"
    m = re.fullmatch(r"agg\[[^~]*~(.*)\]", group)
    if m:
        return f"aggregate {m.group(1)}"
    return group


def input_rates(samples: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, str, float]]:
    """``(start s, end s, source, input rows/s)`` between consecutive samples that loaded rows.

    The rows between two samples are the later sample's source's (a source's last
    sample is taken when it finishes, before the next source's first push).
    """
    out = []
    for a, b in itertools.pairwise(samples):
        rows = b["rows"] - a["rows"]
        dt = b["t"] - a["t"]
        if rows > 0 and dt > 0:
            out.append((float(a["t"]), float(b["t"]), str(b["source"]), rows / dt))
    return out


def compaction_off_spans(actions: Iterable[Mapping[str, Any]], family: str, end: float
                         ) -> list[tuple[float, float]]:
    """``[(from s, to s)]`` during which auto-compaction was off on ``family``.

    From the population's compaction actions (``disable``/``enable`` with their time); a
    span still open at the last action closes at ``end``.
    """
    spans = []
    start: float | None = None
    for a in sorted((a for a in actions if a.get("cf") == family), key=lambda a: a["t"]):
        if a["action"] == "disable" and start is None:
            start = float(a["t"])
        elif a["action"] == "enable" and start is not None:
            spans.append((start, float(a["t"])))
            start = None
    if start is not None:
        spans.append((start, max(end, start)))
    return spans


def manual_compactions(actions: Iterable[Mapping[str, Any]], families: Iterable[str]
                       ) -> list[float]:
    """Times (s) of the manual compactions of any of ``families``."""
    fams = set(families)
    return sorted({float(a["t"]) for a in actions
                   if a.get("action") == "compact" and a.get("cf") in fams})


def _strategy_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "strategy"


def _sf(results: Mapping[str, Any]) -> str:
    """The scale factor as written on the command line: 1, 0.01 (not 1.0)."""
    sf = results.get("sf")
    return f"{sf:g}" if isinstance(sf, int | float) else "?"


def _pct(share: float) -> str:
    return f"{share * 100:g}%"


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f} MiB"


def _ratio(x: float) -> str:
    return f"{x:,.0f}x" if x >= 10 else f"{x:.2f}x"


# ---- what the results say ----------------------------------------------------------------


def _q4(results: Mapping[str, Any]) -> Mapping[str, Any]:
    q4: Mapping[str, Any] = results.get("q4") or {}
    return q4


def _passes(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(_q4(results).get("passes") or [])


def _recompute_ms(results: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """DuckDB's median ms for the whole answer and for year_total, from scratch."""
    rc = _q4(results).get("duckdb_recompute") or {}
    answer = (rc.get("answer") or {}).get("median_ms")
    year_total = (rc.get("year_total") or {}).get("median_ms")
    return answer, year_total


def spark_batches(spark: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """``(share, ms)`` of SparkPipeline's fastest change batch (steps named ``batch ...``).

    Each of those steps is a whole batch at one share, the four kinds at once (new sales,
    deleted sales, customer updates, a date_dim correction): comparable with an
    in-process "whole batch" at that share.  The fastest, because the first batch also
    starts the executors' Python workers.  Nones without Spark (or without a batch).
    """
    if not spark:
        return None, None
    steps = [s for s in spark.get("steps", []) if str(s.get("step", "")).startswith("batch")]
    if not steps:
        return spark.get("share"), None
    return spark.get("share"), 1e3 * min(float(s["seconds"]) for s in steps)


def spark_population_s(spark: Mapping[str, Any] | None) -> float | None:
    """Seconds of Spark's population step, or None."""
    if not spark:
        return None
    for s in spark.get("steps", []):
        if s.get("step") == "population":
            return float(s["seconds"])
    return None


def failures(results: Mapping[str, Any]) -> list[str]:
    """One line per failed DuckDB check (in-process passes, then Spark steps)."""
    out = []
    for p in _passes(results):
        for c in p.get("checks", []):
            if not c.get("ok"):
                out.append(f"pass {p.get('name')}, after {c.get('after')}: year_total "
                           f"{'ok' if c['year_total']['ok'] else 'differs'}, answer "
                           f"{'ok' if c['q4']['ok'] else 'differs'}, top 100 "
                           f"{'ok' if c.get('top100_ok') else 'differs'}")
    sq = _q4(results).get("spark_sql_recompute")
    if sq and not sq.get("matches_duckdb"):
        out.append(f"Spark SQL's q4 from scratch ({sq['rows']['q4']} rows) differs from "
                   f"DuckDB's ({sq['want_rows']['q4']} rows) on the same tables")
    spark = results.get("spark")
    if spark:
        out += [f"Spark, after {s['step']}: differs from DuckDB"
                for s in spark.get("steps", []) if not s.get("ok")]
        if spark.get("error"):
            out.append(f"SparkPipeline stopped with an error: {spark['error']}")
    return out


def check_counts(results: Mapping[str, Any]) -> tuple[int, int]:
    """``(passed, total)`` DuckDB checks over every pass and Spark step."""
    checks = [bool(c.get("ok")) for p in _passes(results) for c in p.get("checks", [])]
    spark = results.get("spark")
    if spark:
        checks += [bool(s.get("ok")) for s in spark.get("steps", [])]
        if spark.get("error"):
            checks.append(False)  # the steps it did not reach were not checked
    return sum(checks), len(checks)


def _batch_rows(size: Mapping[str, Any]) -> int:
    return sum(int(size["kinds"][k]["rows"]) for k in KINDS if k in size["kinds"])


def _losing_sizes(results: Mapping[str, Any]) -> list[str]:
    """Batch sizes whose median batch (first pass) took longer than DuckDB's recompute."""
    answer_ms, _ = _recompute_ms(results)
    passes = _passes(results)
    if answer_ms is None or not passes:
        return []
    return [_pct(float(s["share"])) for s in passes[0].get("sizes", [])
            if float(s["batch"]["median_ms"]) > answer_ms]


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``(fixed ms, ms per row)`` of ``ms = a + b * rows``; None if unfit."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    return (a, b) if a >= 0 and b > 0 else None


def findings(results: Mapping[str, Any]) -> list[str]:
    """What this run shows, in sentences computed from its figures (the report's summary).

    Population: whether the strategies' spreads overlap.  Change batches: against
    DuckDB's and Spark SQL's recompute, and, where a batch loses, why (its fixed cost
    per push against a recompute that is cheap at this scale) and where it wins (the
    recorded runs at larger scales).  SparkPipeline against in-process.
    """
    q4 = _q4(results)
    out: list[str] = []
    load = q4.get("load_average_start")
    cpus = os.cpu_count() or 1
    if load and float(load[0]) > cpus:
        end = q4.get("load_average_end") or load
        out.append(f"**A shared machine**: the load average was {float(load[0]):.1f} at the "
                   f"start and {float(end[0]):.1f} at the end of the in-process phases, on "
                   f"{cpus} CPUs: every figure of this run is slower than on a quiet machine "
                   "(DuckDB's and Spark SQL's too). Compare within this run; the recorded "
                   "runs were measured on a quiet one.")
    pops = list(q4.get("population_strategies") or [])
    if len(pops) > 1:
        spans = {str(p.get("requested") or p["strategy"]): (min(_runs_s(p)), max(_runs_s(p)))
                 for p in pops}
        best = min(spans, key=lambda k: spans[k][0])
        lo, hi = spans[best]
        overlap = [k for k, (a, _b) in spans.items() if k != best and a <= hi]
        n = max(len(_runs_s(p)) for p in pops)
        text = (f"**Population**: fastest {best} ({lo:.1f} s; its runs {lo:.1f}-{hi:.1f} s). ")
        if n < 2:
            text += "One run per strategy: no spread, so no ranking is claimed."
        elif overlap:
            text += (f"{', '.join(overlap)} overlap{'s' if len(overlap) == 1 else ''} its "
                     f"range over {n} alternated runs: at this scale the difference is "
                     "within run-to-run noise.")
        else:
            text += f"Every other strategy's fastest run is slower than its slowest ({n} " \
                    "alternated runs each)."
        l0 = max((max(s["l0"].values(), default=0) for p in pops
                  for s in p.get("samples") or []), default=0)
        pend = max((sum(s["pending"].values()) for p in pops
                    for s in p.get("samples") or []), default=0)
        text += (f" RocksDB during the loads: up to {l0} L0 files in one family, up to "
                 f"{pend / MIB:,.0f} MiB of pending compaction.")
        out.append(text)
    passes = _passes(results)
    answer_ms, _ = _recompute_ms(results)
    sq = q4.get("spark_sql_recompute") or {}
    sql_ms = (sq.get("answer") or {}).get("median_ms")
    if passes and answer_ms:
        sizes = passes[0].get("sizes", [])
        wins = [s for s in sizes if float(s["batch"]["median_ms"]) <= answer_ms]
        loses = [s for s in sizes if float(s["batch"]["median_ms"]) > answer_ms]
        cells = ", ".join(f"{_pct(float(s['share']))} ({_batch_rows(s):,} rows): "
                          f"{_ms(float(s['batch']['median_ms']))} ms" for s in sizes)
        text = (f"**Change batches** ({cells}) against DuckDB recomputing q4 in "
                f"{_ms(answer_ms)} ms: ")
        if wins and not loses:
            text += "every batch size is faster."
        elif wins:
            text += (f"faster at {', '.join(_pct(float(x['share'])) for x in wins)}, slower "
                     f"at {', '.join(_pct(float(x['share'])) for x in loses)}.")
        else:
            text += "every batch size is slower."
        if sql_ms:
            slowest = max(float(s["batch"]["median_ms"]) for s in sizes)
            text += (f" Against Spark SQL's recompute ({_ms(sql_ms)} ms, what a Spark job "
                     f"would rerun) every batch is faster, the largest by "
                     f"{_ratio(sql_ms / slowest)}." if slowest < sql_ms else
                     f" Spark SQL's recompute took {_ms(sql_ms)} ms.")
        warm = passes[0].get("warm")
        if warm and warm.get("s"):
            text += (f" Before the batches, `Pipeline.warm()` built the sources' row multisets "
                     f"in {_ms(float(warm['s']) * 1e3)} ms: a one-time scan that the first "
                     "retraction after a population or a reopen pays otherwise.")
        out.append(text)
        if loses:
            fit = _fit([(_batch_rows(s), float(s["batch"]["median_ms"])) for s in sizes])
            why = ("**Why a batch loses here, and where it wins**: a batch is four pushes "
                   "(new sales, deleted sales, customer updates, a date_dim correction), and "
                   "every push pays a fixed cost across q4's operators (index and aggregate "
                   "reads and writes in RocksDB, Arrow and Acero calls) before its rows do")
            if fit:
                why += (f"; across this run's sizes a batch costs ~{fit[0]:,.0f} ms plus "
                        f"~{fit[1] * 1e3:,.0f} µs per changed row")
            sf = results.get("sf")
            why += (f". DuckDB recomputes q4 at SF{sf:g} in {_ms(answer_ms)} ms"
                    if isinstance(sf, int | float) else
                    f". DuckDB recomputes q4 in {_ms(answer_ms)} ms")
            why += (" from tables already in memory, on every core, while a batch's pushes "
                    "run one after the other. A recompute grows with the tables, a batch "
                    "with the change")
            recorded = [r for r in (results.get("recorded") or {}).get("runs", [])
                        if r["incremental_ms"] < r["duckdb_ms"]]
            if recorded:
                best = max(recorded, key=lambda r: r["duckdb_ms"] / r["incremental_ms"])
                why += (f": in the recorded runs a {best['rows']:,}-row change at "
                        f"SF{best['sf']:g} took {best['incremental_ms']:,} ms against "
                        f"DuckDB's {best['duckdb_ms']:,} ms "
                        f"({best['duckdb_ms'] / best['incremental_ms']:.1f}x faster) and "
                        f"Spark SQL's {best['spark_sql_ms'] / 1e3:,.1f} s (see the scale "
                        "chart)")
            out.append(why + ".")
    spark_s = spark_population_s(results.get("spark"))
    spark_share, spark_ms = spark_batches(results.get("spark"))
    if spark_s is not None and pops:
        best_s = min(min(_runs_s(p)) for p in pops)
        text = (f"**SparkPipeline** ({results['spark'].get('shards')} shards, local[2]): "
                f"population {spark_s:.1f} s against {best_s:.1f} s in-process "
                f"({spark_s / best_s:.2f}x)")
        if spark_ms is not None and passes and spark_share is not None:
            match = [s for s in passes[0].get("sizes", [])
                     if math.isclose(float(s["share"]), spark_share)]
            if match:
                text += (f"; a {_pct(spark_share)} change {spark_ms / 1e3:,.1f} s against "
                         f"{_ms(float(match[0]['batch']['median_ms']))} ms in-process: each "
                         "Spark operation is a Spark job (scheduling, Python workers, "
                         "shuffles), a fixed cost that only large data or many machines "
                         "repay")
        out.append(text + ".")
    return out


# ---- charts -----------------------------------------------------------------------------


def require_matplotlib() -> None:
    """Raise MissingDependencyError unless matplotlib (and its Agg canvas) can be imported.

    Callers check before a long benchmark run, not after it.
    """
    try:
        import matplotlib.backends.backend_agg  # noqa: F401 - only whether it imports
    except ImportError as exc:
        raise MissingDependencyError(
            f"PNG charts need matplotlib ({exc}); install the bench extra: "
            "pip install 'joinstate[bench]'"
        ) from exc


def _figure(width: float, height: float) -> Figure:
    """A figure on an Agg canvas: no pyplot state, no window, safe in any process."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png")
    return path


def _log_share_axis(ax: Axes, shares: Sequence[float]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(list(shares))
    ax.set_xticklabels([_pct(s) for s in shares])
    ax.minorticks_off()
    ax.set_xlabel("change batch size (share of all sales rows)")


def _log_ms_axis(ax: Axes) -> None:
    """A log y axis in milliseconds with plain-number ticks at 1, 2 and 5 per decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.10g}"))
    ax.set_ylabel("milliseconds (log scale)")


def population_timeline(entry: Mapping[str, Any], path: Path, title: str) -> Path:
    """One strategy's population over time (see the module docstring); writes ``path``."""
    return _save(timeline_figure(entry, title), path)


def timeline_figure(entry: Mapping[str, Any], title: str) -> Figure:
    """The figure of :func:`population_timeline`.

    A rate panel, a stall panel, then one panel (with a twin axis for MiB) per index or
    aggregate, largest first (at most :data:`MAX_STATE_PANELS`).
    """
    samples: list[Mapping[str, Any]] = list(entry.get("samples") or [])
    actions: list[Mapping[str, Any]] = list(entry.get("compaction_actions") or [])
    end = float(samples[-1]["t"]) if samples else float(entry.get("s") or 0.0)
    families = list(samples[-1]["l0"]) if samples else []
    groups = state_groups(families)

    def final_bytes(cfs: list[str]) -> int:
        return sum(int(samples[-1]["bytes"].get(cf, 0)) for cf in cfs) if samples else 0

    ordered = sorted(groups, key=lambda g: -final_bytes(groups[g]))
    shown, hidden = ordered[:MAX_STATE_PANELS], ordered[MAX_STATE_PANELS:]
    cols = 3
    rows = 1 + max(1, math.ceil(len(shown) / cols))
    fig = _figure(15, 2.7 * rows + 0.8)
    grid = fig.add_gridspec(rows, cols)
    labels: Mapping[str, str] = entry.get("labels") or {}
    if samples:
        l0_max = max(max(s["l0"].values(), default=0) for s in samples)
        pending_max = max(sum(s["pending"].values()) for s in samples)
        title += (f"\nL0 files up to {l0_max} in one family, pending compaction up to "
                  f"{pending_max / MIB:,.0f} MiB in all, write stalls "
                  f"{samples[-1]['stall_micros'] / 1e6:.1f} s")
    fig.suptitle(title, fontsize=12)

    rate_ax = fig.add_subplot(grid[0, :2])
    sources = list(dict.fromkeys(s for _, _, s, _ in input_rates(samples)))
    colors = {s: f"C{i % 10}" for i, s in enumerate(sources)}
    for t0, t1, source, rate in input_rates(samples):
        rate_ax.fill_between([t0, t1], [rate, rate], step="post", alpha=0.35,
                             color=colors[source], linewidth=0)
        rate_ax.plot([t0, t1], [rate, rate], color=colors[source], linewidth=1.5)
    for s in sources:
        rate_ax.plot([], [], color=colors[s], linewidth=6, alpha=0.5, label=s)
    rate_ax.set_ylabel("input rows/s")
    rate_ax.set_xlabel("seconds since the load started")
    rate_ax.set_title("input rate, by the source being loaded (smallest first)", fontsize=10)
    if sources:
        rate_ax.legend(fontsize=8, ncols=min(len(sources), 5), loc="upper left")
    else:
        rate_ax.text(0.5, 0.5, "no samples recorded", ha="center", va="center",
                     transform=rate_ax.transAxes)
    rate_ax.set_xlim(0, max(end, 1e-3))

    stall_ax = fig.add_subplot(grid[0, 2])
    if samples:
        stall_ax.step([s["t"] for s in samples], [s["stall_micros"] / 1e6 for s in samples],
                      where="post", color="C3")
        if not any(s["stall_micros"] for s in samples):
            stall_ax.text(0.5, 0.75, "no write stalls: L0 files and pending bytes\n"
                          "stayed under RocksDB's slowdown limits", ha="center",
                          va="center", transform=stall_ax.transAxes, color="0.4", fontsize=8)
    stall_ax.set_title("write stall time (RocksDB, cumulative)", fontsize=10)
    stall_ax.set_ylabel("seconds")
    stall_ax.set_xlabel("seconds since the load started")
    stall_ax.set_xlim(0, max(end, 1e-3))

    times = [float(s["t"]) for s in samples]
    for i, group in enumerate(shown):
        ax = fig.add_subplot(grid[1 + i // cols, i % cols])
        cfs = groups[group]
        l0 = [sum(int(s["l0"].get(cf, 0)) for cf in cfs) for s in samples]
        size = [sum(int(s["bytes"].get(cf, 0)) for cf in cfs) / MIB for s in samples]
        pending = [sum(int(s["pending"].get(cf, 0)) for cf in cfs) / MIB for s in samples]
        for a, b in compaction_off_spans(actions, group, end):
            ax.axvspan(a, b, color="0.6", alpha=0.25, linewidth=0)
        for t in manual_compactions(actions, cfs):
            ax.axvline(t, color="C4", linestyle=":", linewidth=1)
        ax.step(times, l0, where="post", color="C0", linewidth=1.6)
        ax.set_ylabel("L0 files", color="C0", fontsize=8)
        ax.set_ylim(0, max(4, max(l0, default=0) + 1))
        ax.tick_params(labelsize=7)
        right = ax.twinx()
        # Sizes grow during a push and are measured after it: drawn as lines between
        # samples, not as steps (L0 files change in whole files, at flushes: steps).
        right.fill_between(times, size, color="C2", alpha=0.2, linewidth=0)
        right.plot(times, pending, color="C3", linestyle="--", linewidth=1.2)
        right.set_ylabel("MiB", fontsize=8)
        right.set_ylim(0, max(0.1, max(size + pending, default=0) * 1.1))
        right.tick_params(labelsize=7)
        ax.set_xlim(0, max(end, 1e-3))
        ax.set_title(textwrap.fill(state_label(group, labels), 64), fontsize=8.5)
    if hidden:
        fig.text(0.01, 0.005, textwrap.fill(
            "not drawn (smaller): " + "; ".join(state_label(h, labels) for h in hidden), 220),
            fontsize=7)

    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig.legend(handles=[
        Line2D([], [], color="C0", linewidth=1.6, label="L0 files (left axis)"),
        Patch(color="C2", alpha=0.3, label="state: SST files + memtables allocated (MiB)"),
        Line2D([], [], color="C3", linestyle="--", label="pending compaction (MiB)"),
        Patch(color="0.6", alpha=0.35, label="auto-compaction off"),
        Line2D([], [], color="C4", linestyle=":", label="manual compaction"),
    ], loc="outside lower center", ncols=5, fontsize=8)
    return fig


def _runs_s(entry: Mapping[str, Any]) -> list[float]:
    """Every population run's seconds of a strategy (just its own when only one ran)."""
    return [float(x) for x in entry.get("runs_s") or [entry["s"]]]


def population_times(results: Mapping[str, Any], path: Path) -> Path:
    """Bars: each strategy's fastest population, every run as a dot (and Spark's); ``path``.

    The bar is the fastest run, the line over it spans the slowest: strategies whose
    spans overlap are not told apart by this run.
    """
    pops = list(_q4(results).get("population_strategies") or [])
    names = []
    for p in pops:
        requested = str(p.get("requested") or p["strategy"])
        picked = ", ".join(str(x).removeprefix("auto->") for x in p.get("picked") or [])
        names.append(f"{requested}\n(picked {picked})" if requested == "auto" and picked
                     else str(p["strategy"]))
    runs = [_runs_s(p) for p in pops]
    secs = [min(r) for r in runs]
    colors = [f"C{i % 10}" for i in range(len(pops))]
    spark_s = spark_population_s(results.get("spark"))
    if spark_s is not None:
        spark = results["spark"]
        names.append(f"SparkPipeline\n{spark.get('shards')} shards, local[2]")
        secs.append(spark_s)
        runs.append([spark_s])
        colors.append("0.55")
    fig = _figure(9, 4.8)
    ax = fig.add_subplot()
    xs = list(range(len(names)))
    bars = ax.bar(xs, secs, color=colors, alpha=0.75)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, fontsize=8)
    for x, r, bar in zip(xs, runs, bars, strict=True):
        if len(r) > 1:
            ax.vlines(x, min(r), max(r), color="0.15", linewidth=1.5)
            ax.scatter([x] * len(r), r, color="0.15", s=14, zorder=3)
        text = (f"{min(r):.1f} s fastest of {len(r)}\nspread {max(r) - min(r):.1f} s"
                if len(r) > 1 else f"{r[0]:.1f} s")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, max(r)), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    rounds = results.get("rounds")
    ax.set_ylabel("seconds to populate the whole q4 pipeline")
    ax.set_ylim(0, max((max(r) for r in runs), default=1.0) * 1.3 or 1.0)
    rows = sum((_q4(results).get("rows") or {}).values())
    ax.set_title(f"population of the whole q4 pipeline per strategy, SF{_sf(results)}"
                 f" ({rows:,} rows)\n"
                 + (f"{rounds} run(s) each, order reversed every round; " if rounds else "")
                 + "bar: fastest run, dots and line: every run", fontsize=10)
    return _save(fig, path)


def incremental_times(results: Mapping[str, Any], path: Path) -> Path:
    """Change-batch ms per size vs DuckDB (and Spark); writes ``path``."""
    passes = _passes(results)
    answer_ms, year_total_ms = _recompute_ms(results)
    shares = sorted({float(s["share"]) for p in passes for s in p.get("sizes", [])})
    spark_share, spark_ms = spark_batches(results.get("spark"))
    sql_ms = ((_q4(results).get("spark_sql_recompute") or {}).get("answer") or {}).get(
        "median_ms")
    fig = _figure(13, 6.2)
    whole, kinds = fig.subplots(1, 2)
    styles = {"shared": ("C0", "-"), "unshared": ("C1", "--")}
    for p in passes:
        sizes = p.get("sizes", [])
        x = [float(s["share"]) for s in sizes]
        med = [float(s["batch"]["median_ms"]) for s in sizes]
        # the per-run times are stored rounded, the median is not: clamp at 0
        lo = [max(0.0, m - min(s["batch"]["ms"])) for m, s in zip(med, sizes, strict=True)]
        hi = [max(0.0, float(s["batch"]["max_ms"]) - m) for m, s in zip(med, sizes,
                                                                        strict=True)]
        color, style = styles.get(str(p["name"]), ("C5", "-."))
        whole.errorbar(x, med, yerr=[lo, hi], color=color, linestyle=style, marker="o",
                       capsize=3, label=f"joinstate in-process, indexes {p['name']} "
                                        "(median, min-max)")
    if spark_ms is not None and spark_share is not None:
        whole.plot([spark_share], [spark_ms], marker="*", markersize=14, color="C3",
                   linestyle="none", label="SparkPipeline, local[2] (fastest batch)")
    for ax in (whole, kinds):
        if answer_ms is not None:
            ax.axhline(answer_ms, color="0.25", linestyle="-", linewidth=1.2,
                       label="DuckDB: q4 from scratch (median)")
        if year_total_ms is not None:
            ax.axhline(year_total_ms, color="0.55", linestyle=":", linewidth=1.2,
                       label="DuckDB: year_total from scratch")
        if sql_ms is not None:
            ax.axhline(sql_ms, color="C9", linestyle="-.", linewidth=1.2,
                       label="Spark SQL: q4 from scratch (median)")
        _log_ms_axis(ax)
        ax.grid(True, which="major", axis="y", alpha=0.3)
        if shares:
            _log_share_axis(ax, shares + ([spark_share] if spark_share
                                          and spark_share not in shares else []))
    whole.set_title("a whole change batch (the four kinds)", fontsize=10)
    # below the axes: inside, a legend would hide the points it explains
    whole.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2)
    shared = next((p for p in passes if p.get("name") == "shared"), passes[0] if passes
                  else None)
    if shared is not None:
        for i, kind in enumerate(KINDS):
            x = [float(s["share"]) for s in shared.get("sizes", [])]
            y = [float(s["kinds"][kind]["median_ms"]) for s in shared.get("sizes", [])]
            kinds.plot(x, y, marker="o", color=f"C{i + 4}", label=KIND_TEXT[kind])
        kinds.set_title(f"per kind (indexes {shared['name']}, median)", fontsize=10)
        kinds.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3)
    title = f"change batches vs recomputing q4, SF{_sf(results)}"
    losing = _losing_sizes(results)
    if losing:
        title += (f"\nat {', '.join(losing)} DuckDB's recompute is faster here: see "
                  "report.md, 'Where joinstate wins and where it loses'")
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def _row_class(rows: float) -> str:
    """A change's size class by its rows: ~1k, ~10k, ~100k (one line per class)."""
    exponent = max(2, min(6, round(math.log10(max(rows, 1)))))
    return f"~{10 ** exponent:,}-row change"


def scale_chart(results: Mapping[str, Any], path: Path) -> Path:
    """Cost against scale: a fixed-size change and a recompute, recorded and this run's.

    Recorded runs (``results["recorded"]``) are hollow markers joined by lines, one line
    per change size class and per recompute engine; this run's figures are filled
    markers at its scale factor.  Both axes are logarithmic.
    """
    from matplotlib.lines import Line2D

    recorded = results.get("recorded") or {}
    rec_runs = list(recorded.get("runs") or [])
    fig = _figure(10, 6)
    ax = fig.add_subplot()
    classes = sorted({_row_class(r["rows"]) for r in rec_runs},
                     key=lambda c: int(c.strip("~").split("-")[0].replace(",", "")))
    colors = {c: f"C{i}" for i, c in enumerate(classes)}
    for c in classes:
        pts = sorted((float(r["sf"]), float(r["incremental_ms"])) for r in rec_runs
                     if _row_class(r["rows"]) == c)
        ax.plot(*zip(*pts, strict=True), color=colors[c], marker="o", markerfacecolor="white",
                linewidth=1.4)
    engines = {"DuckDB q4 from scratch": ("duckdb_ms", "0.2", "s"),
               "Spark SQL q4 from scratch": ("spark_sql_ms", "C9", "D")}
    for _name, (key, color, marker) in engines.items():
        pts = sorted({(float(r["sf"]), float(r[key])) for r in rec_runs if r.get(key)})
        if pts:
            ax.plot(*zip(*pts, strict=True), color=color, marker=marker,
                    markerfacecolor="white", linestyle="--", linewidth=1.2)
    sf = results.get("sf")
    passes = _passes(results)
    if isinstance(sf, int | float) and passes:
        for s in passes[0].get("sizes", []):
            c = _row_class(_batch_rows(s))
            color = colors.setdefault(c, f"C{len(colors)}")
            ax.plot([sf], [float(s["batch"]["median_ms"])], marker="o", color=color,
                    markersize=9, linestyle="none")
            ax.annotate(f"{_batch_rows(s):,} rows", (sf, float(s["batch"]["median_ms"])),
                        xytext=(6, -3), textcoords="offset points", fontsize=7)
        answer_ms, _ = _recompute_ms(results)
        if answer_ms is not None:
            ax.plot([sf], [answer_ms], marker="s", color="0.2", markersize=9)
        sql_ms = ((_q4(results).get("spark_sql_recompute") or {}).get("answer") or {}).get(
            "median_ms")
        if sql_ms is not None:
            ax.plot([sf], [sql_ms], marker="D", color="C9", markersize=9)
    ax.set_xscale("log")
    scales = sorted({float(r["sf"]) for r in rec_runs}
                    | ({float(sf)} if isinstance(sf, int | float) else set()))
    ax.set_xticks(scales)
    ax.set_xticklabels([f"SF{x:g}" for x in scales])
    ax.minorticks_off()
    ax.set_xlim(min(scales, default=0.1) / 1.6, max(scales, default=10) * 1.6)
    _log_ms_axis(ax)
    ax.set_xlabel("TPC-DS scale factor (log scale)")
    ax.grid(True, which="major", alpha=0.3)
    dates = sorted({f"{r['date']} {r['commit']}" for r in rec_runs})
    load = _q4(results).get("load_average_start")
    handles = [Line2D([], [], color=colors[c], marker="o", label=f"a {c} (joinstate)")
               for c in colors]
    handles += [Line2D([], [], color=color, marker=marker, linestyle="--", label=name)
                for name, (_k, color, marker) in engines.items()]
    handles += [Line2D([], [], color="0.3", marker="o", markerfacecolor="white",
                       linestyle="none", label="recorded: " + "; ".join(dates)),
                Line2D([], [], color="0.3", marker="o", linestyle="none",
                       label=f"this run (SF{_sf(results)}, load average {load[0]:.1f} on "
                       f"{os.cpu_count()} CPUs)" if load else f"this run (SF{_sf(results)})")]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.set_title("a change of a fixed size costs a little more as the data grows, a "
                 "recompute much more\n(hollow: recorded runs on this machine; filled: this "
                 "run)", fontsize=10)
    return _save(fig, path)


def sharing(results: Mapping[str, Any], path: Path) -> Path:
    """Shared vs unshared indexes: families, bytes, customer-update ms; writes ``path``."""
    passes = _passes(results)
    names = [str(p["name"]) for p in passes]
    colors = [f"C{i}" for i in range(len(passes))]
    fig = _figure(14, 4.2)
    fams, size, cust = fig.subplots(1, 3, width_ratios=[1, 2, 2])
    fams.bar(names, [len(p.get("column_families", [])) for p in passes], color=colors)
    fams.set_title("column families", fontsize=10)
    what = [("shared inputs' indexes", lambda p: p["index_bytes"]["shared inputs"]),
            ("after population", lambda p: p["state_bytes_after_population"]),
            ("after close", lambda p: p["state_bytes_closed"])]
    width = 0.8 / max(1, len(passes))
    for i, p in enumerate(passes):
        xs = [j + i * width for j in range(len(what))]
        size.bar(xs, [f(p) / MIB for _, f in what], width, color=colors[i], label=names[i])
    size.set_xticks([j + width * (len(passes) - 1) / 2 for j in range(len(what))])
    size.set_xticklabels([w for w, _ in what], fontsize=8)
    size.set_ylabel("MiB")
    size.set_title("bytes", fontsize=10)
    size.legend(fontsize=8)
    shares = [float(s["share"]) for s in passes[0].get("sizes", [])] if passes else []
    for i, p in enumerate(passes):
        xs = [j + i * width for j in range(len(shares))]
        ms = [float(s["kinds"]["customer"]["median_ms"]) for s in p.get("sizes", [])]
        cust.bar(xs, ms, width, color=colors[i], label=names[i])
    cust.set_xticks([j + width * (len(passes) - 1) / 2 for j in range(len(shares))])
    cust.set_xticklabels([_pct(s) for s in shares])
    cust.set_xlabel("change batch size")
    cust.set_ylabel("milliseconds (median)")
    cust.set_title("customer updates (one customer row reaches three joins)", fontsize=10)
    cust.legend(fontsize=8)
    fig.suptitle("indexes shared between operators vs one per operator input", fontsize=12)
    return _save(fig, path)


def draw_charts(results: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Draw every chart the results allow into ``out_dir``; ``{chart name: path}``.

    A population timeline needs the strategy's samples; the sharing chart needs the
    unshared pass; the incremental chart needs at least one pass.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    charts: dict[str, Path] = {}
    for entry in _q4(results).get("population_strategies") or []:
        if entry.get("samples"):
            name = f"population-timeline-{_strategy_slug(str(entry['strategy']))}"
            charts[name] = population_timeline(
                entry, out_dir / f"{name}.png",
                f"population with strategy {entry['strategy']}: SF{_sf(results)}, "
                f"{entry['s']:.2f} s")
    if _q4(results).get("population_strategies"):
        charts["population-time"] = population_times(results, out_dir / "population-time.png")
    passes = _passes(results)
    if passes:
        charts["incremental"] = incremental_times(results, out_dir / "incremental.png")
    if len(passes) > 1:
        charts["sharing"] = sharing(results, out_dir / "sharing.png")
    if results.get("recorded"):
        charts["scale"] = scale_chart(results, out_dir / "scale.png")
    return charts


# ---- markdown ---------------------------------------------------------------------------


def _image(charts: Mapping[str, Path | str], name: str, alt: str) -> list[str]:
    if name not in charts:
        return []
    return [f"![{alt}]({Path(charts[name]).name})", ""]


def to_markdown(results: Mapping[str, Any], charts: Mapping[str, Path | str]) -> str:
    """The report: verdict, population, change batches vs recompute, sharing, Spark.

    ``charts`` maps chart names (:func:`draw_charts`) to files next to the report.
    """
    q4 = _q4(results)
    rows = q4.get("rows") or {}
    passed, total = check_counts(results)
    failed = failures(results)
    answer_ms, year_total_ms = _recompute_ms(results)
    git = q4.get("git") or {}
    md = [f"# TPC-DS query 4, maintained incrementally: SF{results.get('sf', '?'):g}"
          if isinstance(results.get("sf"), int | float) else "# TPC-DS query 4", ""]
    setup = [", ".join(f"{n} {r:,}" for n, r in rows.items()) + " rows",
             f"change batches of {', '.join(_pct(s) for s in q4.get('sizes', []))} of the "
             f"sales, {q4.get('repeat', '?')} per size",
             f"strategies {', '.join(results.get('strategies') or []) or '-'}",
             "on local Spark too" if results.get("spark") else "no Spark run"]
    md += ["; ".join(setup) + ".", ""]
    meta = [f"started {results.get('started', q4.get('started', '?'))}",
            f"{results.get('seconds', 0):.0f} s in all",
            f"{os.cpu_count()} CPUs"]
    if q4.get("load_average_start"):
        meta.append(f"load average {q4['load_average_start'][0]:.1f} at the start")
    if git.get("head"):
        meta.append(f"commit `{git['head']}`"
                    + (" (uncommitted changes)" if git.get("dirty") else ""))
    md += ["; ".join(meta) + ".", ""]
    if failed:
        md += [f"**CHECK FAILED**: {len(failed)} of {total} DuckDB checks differ:", ""]
        md += [f"- {line}" for line in failed] + [""]
    else:
        md += [f"**Every answer matched DuckDB** ({passed} of {total} checks: both outputs "
               "after population and after every change, as multisets).", ""]

    found = findings(results)
    if found:
        md += ["## Where joinstate wins and where it loses", ""]
        md += [f"- {line}" for line in found] + [""]
    phases = results.get("phases") or {}
    if phases:
        md += ["Wall time per phase: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
               + ".", ""]

    pops = list(q4.get("population_strategies") or [])
    if pops:
        fixed = [p["rows_per_s"] for p in pops if not str(p["strategy"]).startswith("auto")]
        best = max(fixed) if fixed else None
        md += ["## Population", "", "The whole pipeline loaded into an empty store, sources "
               "smallest first"
               + (f", {results['rounds']} times per strategy, the order reversed every "
                  "round (so neither a cold start nor a warm page cache favours one); the "
                  "table gives each strategy's fastest run and every run's seconds"
                  if results.get("rounds") else ", once per strategy") + ".", ""]
        runs = list(q4.get("population_runs") or [])
        if runs:
            md += ["Run order: " + ", ".join(
                f"{r['strategy']} {r['s']:.1f} s" for r in runs) + ".", ""]
        md += _image(charts, "population-time", "population time per strategy")
        md += ["| strategy | fastest s | every run s | spread | rows/s (fastest) | "
               "vs best fixed | compaction actions | peak RSS | state on disk |",
               "|---|---|---|---|---|---|---|---|---|"]
        for p in pops:
            rel = _ratio(p["rows_per_s"] / best) if best else "-"
            r_s = _runs_s(p)
            md.append(f"| {p['strategy']} | {min(r_s):.2f} | "
                      f"{', '.join(f'{x:.1f}' for x in r_s)} | {max(r_s) - min(r_s):.1f} | "
                      f"{p['rows_per_s']:,.0f} | {rel} | "
                      f"{p['actions']} | {_mib(p.get('peak_rss_bytes'))} | "
                      f"{_mib(p.get('state_bytes'))} |")
        spark_s = spark_population_s(results.get("spark"))
        if spark_s is not None:
            md.append(f"| Spark, {results['spark'].get('shards')} shards (auto) | "
                      f"{spark_s:.1f} | {spark_s:.1f} | - | - | - | - | - | - |")
        md.append("")
        timelines = [n for n in charts if n.startswith("population-timeline-")]
        if timelines:
            md += ["Over time, per strategy (its fastest run): input rows/s (coloured by the "
                   "source being loaded), write stalls, and per index or aggregate (named "
                   "by what it holds and its key) its L0 files, its size and the compaction "
                   "RocksDB still owes it (grey: auto-compaction off; dotted: a manual "
                   "compaction).", ""]
            for n in timelines:
                md += _image(charts, n, n.replace("-", " "))

    passes = _passes(results)
    if passes:
        md += ["## Change batches vs recomputing", "",
               "A batch is four pushes in a row: new sales in three channels, deleted sales, "
               "customer updates (-old +new), one date_dim row moved between 2001 and 2002. "
               "DuckDB computes q4 from scratch on the same tables.", ""]
        md += _image(charts, "incremental", "incremental batch time vs DuckDB")
        spark_share, spark_ms = spark_batches(results.get("spark"))
        head = ["size", "rows per batch"] + [f"{p['name']} median ms" for p in passes]
        head += ["DuckDB q4 from scratch ms", "from scratch / incremental"]
        sq = q4.get("spark_sql_recompute") or {}
        sql_ms = (sq.get("answer") or {}).get("median_ms")
        if sql_ms is not None:
            head += ["Spark SQL q4 from scratch ms", "Spark SQL / incremental"]
        md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        first = passes[0]
        for i, s in enumerate(first.get("sizes", [])):
            n_rows = sum(int(s["kinds"][k]["rows"]) for k in KINDS if k in s["kinds"])
            cells = [_pct(float(s["share"])), f"{n_rows:,}"]
            cells += [_ms(p["sizes"][i]["batch"]["median_ms"]) if i < len(p.get("sizes", []))
                      else "-" for p in passes]
            med = float(s["batch"]["median_ms"])
            cells += [_ms(answer_ms), _ratio(answer_ms / med) if answer_ms and med else "-"]
            if sql_ms is not None:
                cells += [_ms(sql_ms), _ratio(sql_ms / med) if med else "-"]
            md.append("| " + " | ".join(cells) + " |")
        md.append("")
        rc = q4.get("duckdb_recompute") or {}
        if year_total_ms is not None:
            md += [f"DuckDB on the final tables, {rc.get('threads', '?')} threads, median of "
                   f"{len((rc.get('answer') or {}).get('ms', []))} runs: q4 {_ms(answer_ms)} ms, "
                   f"its year_total CTE alone {_ms(year_total_ms)} ms.", ""]
        if sql_ms is not None:
            md += [f"Spark SQL (local, Parquet inputs read each run) on the same final "
                   f"tables, median of {sq.get('runs', '?')} runs: q4 {_ms(sql_ms)} ms (first "
                   f"run {_ms(sq['answer']['first_ms'])} ms), year_total "
                   f"{_ms(sq['year_total']['median_ms'])} ms; its answer "
                   f"{'equals' if sq.get('matches_duckdb') else 'DIFFERS FROM'} DuckDB's.", ""]
        if spark_ms is not None and spark_share is not None:
            md += [f"On SparkPipeline ({results['spark'].get('shards')} shards, local[2]), "
                   f"a whole batch at {_pct(spark_share)}, the fastest: {spark_ms:,.0f} ms, "
                   "Spark's job "
                   "overhead included.", ""]
        md += [f"Per kind ({first['name']} indexes), median ms:", "",
               "| size | " + " | ".join(KIND_TEXT[k] for k in KINDS) + " |",
               "|---|" + "---|" * len(KINDS)]
        for s in first.get("sizes", []):
            md.append(f"| {_pct(float(s['share']))} | " + " | ".join(
                f"{_ms(s['kinds'][k]['median_ms'])} ({s['kinds'][k]['rows']:,} rows)"
                for k in KINDS) + " |")
        md.append("")

    if len(passes) > 1:
        md += ["## Shared vs unshared indexes", "",
               "Shared: operators reading one stream on one key read one index (q4's six "
               "year_total legs, customer and date_dim in three joins each). Unshared: one "
               "index per operator input.", ""]
        md += _image(charts, "sharing", "shared vs unshared indexes")
        md += ["| indexes | column families | shared inputs' index bytes | bytes after "
               "population | bytes after close | population s | customer update ms "
               "(median per size) |", "|---|---|---|---|---|---|---|"]
        for p in passes:
            cu = ", ".join(f"{_pct(float(s['share']))}: "
                           f"{_ms(s['kinds']['customer']['median_ms'])}"
                           for s in p.get("sizes", []))
            md.append(f"| {p['name']} | {len(p.get('column_families', []))} | "
                      f"{_mib(p['index_bytes']['shared inputs'])} | "
                      f"{_mib(p['state_bytes_after_population'])} | "
                      f"{_mib(p['state_bytes_closed'])} | {p['population']['s']:.2f} | {cu} |")
        md.append("")

    recorded = results.get("recorded")
    if recorded:
        md += ["## Cost against scale", "",
               "How a fixed-size change and a recompute grow with the data: the recorded "
               f"runs ({recorded.get('machine', '')}; {recorded.get('what', '')}) beside "
               "this run's own figures.", ""]
        md += _image(charts, "scale", "cost against scale")
        md += ["| SF | change | rows | incremental ms | DuckDB ms | Spark SQL ms | recorded |",
               "|---|---|---|---|---|---|---|"]
        for r in recorded.get("runs", []):
            md.append(f"| {r['sf']:g} | {_pct(r['share'])} | {r['rows']:,} | "
                      f"{r['incremental_ms']:,} | {r['duckdb_ms']:,} | {r['spark_sql_ms']:,} | "
                      f"{r['date']}, `{r['commit']}`, {r.get('note', '')} |")
        md.append("")

    spark = results.get("spark")
    if spark:
        md += [f"## Local Spark: {spark.get('shards')} shards", "",
               "`spark_io.SparkPipeline`: the same definition, one sharded stage per "
               "stateful operator; each step applied with Spark jobs, then checked against "
               "DuckDB.", "",
               "| step | seconds | Spark operations | year_total rows | answer rows | "
               "vs DuckDB |", "|---|---|---|---|---|---|"]
        for s in spark.get("steps", []):
            md.append(f"| {s['step']} | {s['seconds']:.1f} | {s['applies']} | "
                      f"{s['year_total_rows']:,} | {s['q4_rows']} | "
                      f"{'OK' if s['ok'] else '**DIFFERS**'} |")
        md.append("")
    baseline = results.get("baseline")
    if baseline:
        from bench.spark_tpcds import to_markdown as baseline_markdown

        body = baseline_markdown(baseline).split("\n", 1)[1]
        md += ["## Spark Structured Streaming beside joinstate (customer ⋈ store_sales)",
               body, ""]
    md += ["All figures: `report.json` (the same numbers, every sample and check).", ""]
    return "\n".join(md)


def write_report(results: Mapping[str, Any], out_dir: Path) -> ReportFiles:
    """Write ``report.json``, the charts and ``report.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    charts = draw_charts(results, out_dir)
    md_path = out_dir / "report.md"
    md_path.write_text(to_markdown(results, charts))
    return ReportFiles(out_dir, json_path, md_path, charts)
