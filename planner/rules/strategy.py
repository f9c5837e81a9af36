"""How population writes: ``symmetric``, ``asymmetric`` or ``bulk``, per join and per pipeline.

* ``bulk`` (sorted SST files ingested, no compaction while loading) when the big
  side's index can take bulk writes (no degree family), holds at least
  ``bulk_min_rows`` rows (known, or counted past it) and is loaded after the small
  side (``small-first``, or ``as-given`` with the small side on the left).  Whether the
  rows come as a snapshot or a stream of batches does not matter: the runs are cut from
  whatever arrives.  Measured by ``bench population`` (small-first): ahead of or level
  with the other strategies from 300k rows on, with and without asymmetry (equal sides
  of 300k rows: 1.8x symmetric).  Interleaved, bulk also when the big side has at least
  ``asymmetry_ratio`` times the small side's rows: each side's pending run is ingested
  before the other side probes it, which costs only while the small side still loads
  (measured level with or ahead of symmetric at 30x and 10x; at equal sizes it
  gains nothing);
* ``asymmetric`` (Epsio's policy) when the small side is loaded first and the big input
  has at least ``asymmetry_ratio`` times its rows: the small index is compacted once it
  is complete and the big one, only written from then on, is not compacted while it
  loads.  Never interleaved (measured 0.67x symmetric at equal sizes): a side whose
  compaction stops may still be probed;
* ``symmetric`` (RocksDB's defaults) otherwise: sizes unknown, sides of similar size,
  or the big side loaded first (the small side's rows then probe it while it is being
  written, so its compaction must not stop).

Figures recorded by earlier runs (:mod:`planner.history`) override this estimate when
the static choice and at least one other candidate were measured at a comparable scale:
the one with the most rows per second wins, whatever the thresholds say.

Pipelines are populated ``symmetric`` or ``asymmetric`` (bulk writes cannot take a
pipeline push, which reads its aggregates and indexes): asymmetric when the largest
source holds at least ``asymmetry_ratio`` times the smallest non-empty one and more
bytes than one memtable (``memtable_bytes``).  Below that, nothing is flushed while the
pipeline loads, so RocksDB compacts nothing that stopping compaction would save, while
the schedule's forced compactions cost: TPC-DS q4 at SF0.01 (largest source ~3 MiB)
measured the asymmetric schedule at 0.4-0.9x symmetric, at SF0.1 (~27 MiB) level with
it.  Each join of a pipeline gets a decision too, from its own inputs' rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.rule import Decision
from planner.rules._text import rows, times

if TYPE_CHECKING:
    from planner.context import JoinShape, PlanContext

__all__ = ["JOIN_STRATEGIES", "PIPELINE_STRATEGIES", "PopulationStrategy"]

TOPIC = "strategy"
_MIB = 1 << 20
JOIN_STRATEGIES = ("symmetric", "asymmetric", "bulk")
PIPELINE_STRATEGIES = ("symmetric", "asymmetric")


class PopulationStrategy:
    """Decide the population strategy (subject: the join, or the pipeline and each join).

    >>> from planner.plan import join_context
    >>> from planner.stats import given
    >>> from planner.rules.small_side import SmallSide
    >>> from planner.rules.order import PopulationOrder
    >>> ctx = join_context(given("left", 10_000), given("right", 200_000))
    >>> for rule in (SmallSide(), PopulationOrder()):
    ...     ctx = ctx.with_decisions(rule.apply(ctx))
    >>> PopulationStrategy().apply(ctx)[0].choice
    'bulk'
    >>> ctx = join_context(given("left", 10_000), given("right", 20_000))
    >>> for rule in (SmallSide(), PopulationOrder()):
    ...     ctx = ctx.with_decisions(rule.apply(ctx))
    >>> PopulationStrategy().apply(ctx)[0].choice
    'symmetric'
    """

    name = "strategy"

    def apply(self, context: PlanContext) -> list[Decision]:
        """Decisions about the join, or about the pipeline and each of its joins."""
        if context.kind == "join":
            j = context.joins[0]
            fixed = context.given.get("strategy")
            if fixed is not None:
                return [Decision(TOPIC, j.name, fixed, f"strategy {fixed} given by the caller",
                                 {}, self.name)]
            static, reason, figures = self._join(context, j)
            return [self._with_history(context, j.name, static, reason, figures,
                                       self._feasible(context, j))]
        out = []
        fixed = context.given.get("strategy")
        if fixed is not None:
            out.append(Decision(TOPIC, context.name, fixed, f"strategy {fixed} given by the "
                                "caller", {}, self.name))
        else:
            static, reason, figures = self._pipeline(context)
            out.append(self._with_history(context, context.name, static, reason, figures,
                                          PIPELINE_STRATEGIES))
        chosen = out[0].choice
        for j in context.joins:
            out.append(self._pipeline_join(context, j, chosen))
        return out

    # ---- joins ---------------------------------------------------------------------------

    def _feasible(self, context: PlanContext, j: JoinShape) -> tuple[str, ...]:
        small = context.choice("small_side", j.name)
        big = "right" if small == "left" else "left"
        ix = context.index(j.index(big))
        if small is None or (ix is not None and not ix.bulk_loadable):
            return ("symmetric", "asymmetric")
        return JOIN_STRATEGIES

    def _join(self, context: PlanContext, j: JoinShape) -> tuple[str, str, dict[str, Any]]:
        s = context.settings
        small = context.choice("small_side", j.name)
        if small is None:
            return ("symmetric", "row counts unknown: no asymmetry to use, RocksDB's defaults",
                    {})
        big = "right" if small == "left" else "left"
        n_small = context.rows(j.stream(small))
        n_big = context.rows(j.stream(big))
        big_low = n_big if n_big is not None else context.lower_bound(j.stream(big))
        ratio = big_low / max(n_small or 0, 1)
        figures: dict[str, Any] = {"small_rows": n_small, "big_rows": n_big,
                                   "big_at_least": big_low, "ratio": round(ratio, 2)}
        ix = context.index(j.index(big))
        loadable = ix.bulk_loadable if ix is not None else True
        order = context.choice("order")
        figures.update(big_bulk_loadable=loadable, order=order)
        small_first = order == "small-first" or (order == "as-given" and small == "left")
        if order == "interleaved":
            if loadable and big_low >= s.bulk_min_rows and ratio >= s.asymmetry_ratio:
                return ("bulk", f"interleaved, the {big} side ({rows(big_low)} rows) has "
                        f"{times(ratio)} the {small} side's rows: after the {small} side "
                        "finishes it is only written; sorted SST files", figures)
            return ("symmetric", f"interleaved, sides of {rows(n_small)} and "
                    f"{rows(big_low)} rows ({times(ratio)}): both are probed while they are "
                    "written, so neither's compaction may stop: RocksDB's defaults", figures)
        if not small_first:
            return ("symmetric", f"the {big} side ({rows(big_low)} rows) loads first: the "
                    f"{small} side's rows probe it while it is written, so its compaction "
                    "must not stop: RocksDB's defaults", figures)
        if loadable and big_low >= s.bulk_min_rows:
            return ("bulk", f"the {big} side ({rows(big_low)} rows, {times(ratio)} the "
                    f"{small} side's) is loaded after the {small} side and takes bulk "
                    f"writes: sorted SST files (>= {rows(s.bulk_min_rows)} rows)", figures)
        why_not = ("its index keeps degrees" if not loadable else
                   f"below {rows(s.bulk_min_rows)} rows")
        if ratio >= s.asymmetry_ratio:
            return ("asymmetric", f"the {big} side has {times(ratio)} the {small} side's rows "
                    f"({rows(big_low)} vs {rows(n_small)}; bulk: {why_not}): Epsio's "
                    "asymmetric policy", figures)
        return ("symmetric", f"sides within {times(s.asymmetry_ratio)} of each other "
                f"({rows(n_small)} vs {rows(big_low)}; bulk: {why_not}): RocksDB's defaults",
                figures)

    # ---- pipelines -----------------------------------------------------------------------

    def _pipeline(self, context: PlanContext) -> tuple[str, str, dict[str, Any]]:
        counts = {n: s.rows for n, s in context.sources.items()}
        known = {n: c for n, c in counts.items() if c}
        if not known:
            return ("symmetric", "no source size known: RocksDB's defaults",
                    {"rows": counts})
        hi = max(known, key=lambda n: known[n])
        lo = min(known, key=lambda n: known[n])
        ratio = known[hi] / known[lo]
        sizes = {n: st.bytes for n, st in context.sources.items()}
        heaviest = None if any(b is None for b in sizes.values()) else max(
            sizes, key=lambda n: sizes[n] or 0)
        big_bytes = None if heaviest is None else sizes[heaviest]
        memtable = context.settings.memtable_bytes
        figures = {"largest": hi, "largest_rows": known[hi], "smallest": lo,
                   "smallest_rows": known[lo], "ratio": round(ratio, 2),
                   "heaviest": heaviest, "heaviest_bytes": big_bytes,
                   "memtable_bytes": memtable}
        if ratio >= context.settings.asymmetry_ratio and big_bytes is not None \
                and big_bytes < memtable:
            return ("symmetric", f"{hi} ({rows(known[hi])} rows) is {times(ratio)} {lo}, but "
                    f"the biggest source ({heaviest}, {big_bytes / _MIB:,.1f} MiB) fits one "
                    f"memtable ({memtable / _MIB:,.0f} MiB): RocksDB compacts nothing while "
                    "the pipeline loads, so there is nothing to stop; RocksDB's defaults",
                    figures)
        if ratio >= context.settings.asymmetry_ratio:
            return ("asymmetric", f"{hi} ({rows(known[hi])} rows) is {times(ratio)} {lo} "
                    f"({rows(known[lo])}): indexes nothing reads while loading stop "
                    "compacting, probed ones are compacted once complete", figures)
        return ("symmetric", f"sources within {times(context.settings.asymmetry_ratio)} "
                f"of each other ({hi} {rows(known[hi])}, {lo} {rows(known[lo])}): RocksDB's "
                "defaults", figures)

    def _pipeline_join(self, context: PlanContext, j: JoinShape, chosen: str) -> Decision:
        small = context.choice("small_side", j.name)
        n_l, n_r = context.rows(j.left), context.rows(j.right)
        figures: dict[str, Any] = {"left_rows": n_l, "right_rows": n_r, "pipeline": chosen}
        if small is None or n_l is None or n_r is None:
            return Decision(TOPIC, j.name, chosen, f"input sizes unknown ({j.left} "
                            f"{rows(n_l)}, {j.right} {rows(n_r)}): the pipeline's {chosen}",
                            figures, self.name)
        ratio = max(n_l, n_r) / max(min(n_l, n_r), 1)
        figures["ratio"] = round(ratio, 2)
        asym = ratio >= context.settings.asymmetry_ratio
        choice = "asymmetric" if asym and chosen == "asymmetric" else "symmetric"
        what = "asymmetric inputs" if asym else "inputs of similar size"
        return Decision(TOPIC, j.name, choice, f"{what} ({j.left} {rows(n_l)}, {j.right} "
                        f"{rows(n_r)}, {times(ratio)}); pipeline strategy {chosen}", figures,
                        self.name)

    # ---- history -------------------------------------------------------------------------

    def _with_history(self, context: PlanContext, subject: str, static: str, reason: str,
                      figures: dict[str, Any], candidates: tuple[str, ...]) -> Decision:
        total = 0
        for s in context.sources.values():
            if s.rows is None:
                total = -1
                break
            total += s.rows
        measured = context.history.comparable(total if total >= 0 else None, candidates)
        if static in measured and len(measured) >= 2:
            best = max(measured, key=lambda n: measured[n].rows_per_second)
            rates = {n: round(f.rows_per_second) for n, f in measured.items()}
            text = ", ".join(f"{n} {r:,} rows/s" for n, r in sorted(
                rates.items(), key=lambda kv: -kv[1]))
            figures = {**figures, "static": static, "measured_rows_per_second": rates}
            if best != static:
                return Decision(TOPIC, subject, best, f"earlier runs measured {text}: {best} "
                                f"(the static estimate said {static}: {reason})", figures,
                                self.name)
            return Decision(TOPIC, subject, static, f"{reason}; earlier runs agree ({text})",
                            figures, self.name)
        return Decision(TOPIC, subject, static, reason, figures, self.name)
