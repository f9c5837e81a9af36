"""Per change batch: maintain incrementally, or recompute the batch's effect from snapshots.

Two ways to apply a change batch to a join side (``population.apply`` runs either):

* ``incremental``: the join's push.  Per distinct key of the batch it reads the other
  side's rows and this side's degree (point reads, or an in-memory probe cache), so it
  costs in proportion to the batch and to the partner rows each batch row meets;
* ``recompute``: scan the other side whole (and this side when the join needs its
  degrees), compute the output with vectorised hash joins, write the difference.  It
  costs in proportion to the rows scanned, plus the batch's own writes.

Cost model, in milliseconds, with ``B`` the batch's rows, ``N`` the rows a recompute
scans and ``P`` the partner rows per batch row (the other side's rows per key of this
side, from the counters when this side holds one row per key, else 1)::

    incremental = fixed_ms + B * inc_us / 1000           (fixed_ms: INCREMENTAL_FIXED_MS)
        inc_us  = INCREMENTAL_US + INCREMENTAL_PARTNER_US * max(0, P - 1)   (default)
    recompute   = RECOMPUTE_FIXED_MS + (N * scan_us + B * batch_us) / 1000

The coefficients are measured when the store has a history: the executor records the
batch rows, scanned rows and wall time of every apply (``planner.batch.record_batch``),
with the recompute's scan time apart, and the rule estimates per join side
(:func:`estimate`, medians, robust to one disturbed run): the incremental path's fixed
and per-row costs, the recompute path's per-scanned-row and per-batch-row costs.  Both
paths write the same difference, so measuring recompute's batch term too keeps a
machine's write speed from tilting the choice.  Small runs set no per-row cost (their
time is mostly fixed costs), and an estimate that comes out negative gives way to the
default.

A pipeline is decided per operator (``planner.batch.decide_operators``): each operator
whose reads grow with the change (a join, a ``join_all``, a window) is one subject, with
``B`` the rows expected to reach it (the source batch's rows times the fan-out measured on
earlier batches, else estimated from the index counters), ``N`` the rows of the indexes
its recompute path scans (an index held in a probe cache is not scanned: over cached
indexes both paths read alike and the operator stays incremental), its own recorded
runs, and the ``OPERATOR_*`` defaults (a pipeline operator's time holds its reads and
computation, not the writes, which both paths stage alike; a window's recompute path
re-evaluates the touched partitions as the incremental one does, so its per-row work is
costed alike: :data:`OPERATOR_WINDOW_BATCH_US`).

Defaults, calibrated by ``python -m bench recompute`` on TPC-DS SF1 customer ⋈
store_sales (100k x 2.88M rows, default store options, one run on the 2-core
development VM): incremental batches to the sales side cost 1.38 µs per batch row
(0.01% to 10% of the sales, half deletes, half inserts); customer updates, which meet
~29 sales rows each, 12.4 µs per row (0.38 µs per partner row beyond the first); a
recompute read 0.59 µs per scanned customer row and 0.55-0.66 µs per scanned sales row
(1.1 on a cold first scan), plus 1.33 µs per batch row of writes and hash joins.
Recompute is chosen only when estimated at least :data:`MARGIN` (20%) cheaper, and at
least :data:`MARGIN_EXTRAPOLATED` (50%) when a measured per-row cost is extrapolated to
a batch more than 4x the largest it was measured on: near a tie the incremental path
wins, because it leaves the block cache and the probe caches as they are while a
recompute reads a whole side.  (Measured at SF1 on the 2-core VM under other load:
per-row costs taken from 1% batches predicted 10% batches 30-100% off, either way.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.rule import Decision
from planner.rules._text import rows, times

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "INCREMENTAL_FIXED_MS",
    "INCREMENTAL_PARTNER_US",
    "INCREMENTAL_US",
    "EXTRAPOLATION",
    "MARGIN",
    "MARGIN_EXTRAPOLATED",
    "MIN_FIT_ROWS",
    "OPERATOR_BATCH_US",
    "OPERATOR_INCREMENTAL_US",
    "OPERATOR_SCAN_US",
    "OPERATOR_WINDOW_BATCH_US",
    "RECOMPUTE_BATCH_US",
    "RECOMPUTE_FIXED_MS",
    "RECOMPUTE_SCAN_US",
    "TOPIC",
    "BatchContext",
    "Costs",
    "Observation",
    "RecomputeRule",
    "estimate",
]

TOPIC = "batch_strategy"

INCREMENTAL_US = 1.4
"""Default µs per batch row of an incremental apply with one partner row per batch row."""
INCREMENTAL_PARTNER_US = 0.38
"""Default µs per further partner row a batch row meets (probed, joined, output)."""
INCREMENTAL_FIXED_MS = 2.0
"""Per-apply cost of the incremental path that does not grow with the batch."""
RECOMPUTE_SCAN_US = 0.65
"""Default µs per row a recompute scans (read, decode, hash lookup of its key)."""
RECOMPUTE_BATCH_US = 1.35
"""Default µs per batch row of a recompute: its writes and hash joins."""
RECOMPUTE_FIXED_MS = 2.0
"""Per-apply cost of a recompute that grows with neither the scan nor the batch."""
OPERATOR_INCREMENTAL_US = 6.0
"""Default µs per row reaching a pipeline operator that reads its input state by key (a
join probing an index, a window re-reading a partition): a point read (~5 µs from Python,
a prefix seek ~12 µs) per distinct key, plus its share of the operator's vectorised work."""
OPERATOR_SCAN_US = 2.0
"""Default µs per row a pipeline operator's recompute path scans: read and decode the
row, encode its key, one hash lookup (q4 at SF0.1 on the 2-core development VM, shared
with other work at a load of ~15: 0.6-4 µs per row, median ~1.8)."""
OPERATOR_BATCH_US = 1.0
"""Default µs per row reaching a join or ``join_all`` on its recompute path: its
vectorised work (probing the build side, the join rule)."""
OPERATOR_WINDOW_BATCH_US = OPERATOR_INCREMENTAL_US
"""Default µs per row reaching a window on its recompute path: the same as incremental.

Both paths re-evaluate every touched partition whole (sort it, compute the window
functions, diff the outputs); the recompute path only reads the partitions by one scan
instead of by key, so its per-row work is the incremental path's and the scan comes on
top.  Measured on TPC-DS q47 at SF1 (a 0.01% batch, ~98k rows reaching the window):
incremental 500 ms, recompute 803 ms of which ~130 ms scanning 54k rows, where a batch
term of 1 µs/row had estimated the recompute at 191 ms and chosen it; q67 at SF0.1: the
recompute's work beside its scan ~9 µs per row against ~11 µs for the whole incremental
run."""
MARGIN = 0.2
"""Recompute must be estimated at least this fraction cheaper to be chosen.

Per-row costs fall as batches grow (fixed work is amortised), so a cost fitted on small
batches and extrapolated to a much larger one overestimates either path; the margin
keeps such estimates from trading the incremental path for a recompute that is not
clearly cheaper (measured: a 10% SF0.1 batch estimated 15% cheaper by recompute ran 17%
slower)."""
MARGIN_EXTRAPOLATED = 0.5
"""The margin when a measured per-row cost is extrapolated to a batch more than
:data:`EXTRAPOLATION` times the largest measured one (the defaults are calibrated at
scale and do not count as extrapolated)."""
EXTRAPOLATION = 4.0
MIN_FIT_ROWS = 1000
"""Runs below this many rows (batch rows; scanned rows for the scan) set no per-row cost."""


@dataclass(frozen=True)
class Observation:
    """One recorded apply: batch rows, rows scanned (0 for incremental), wall ms.

    ``scan_ms``: for a recompute, the part of ``ms`` spent reading the snapshots (0 when
    not measured).
    """

    batch_rows: int
    scanned_rows: int
    ms: float
    scan_ms: float = 0.0


@dataclass(frozen=True)
class BatchContext:
    """What the rule decides from: the batch, the state, the recorded runs.

    ``scanned_rows``: the rows a recompute would read (the other side, plus this side
    when the join needs its degrees); ``state_rows``: the rows stored on the side
    receiving the batch (quoted in the reason); ``partners_per_row``: the other side's
    rows a batch row is expected to meet.  ``incremental`` and ``recompute``: the
    recorded runs of this side, oldest first.  ``recompute_available`` is false for
    targets without a recompute path (``unavailable`` says why).
    """

    subject: str
    batch_rows: int
    scanned_rows: int
    state_rows: int
    partners_per_row: float = 1.0
    incremental: Sequence[Observation] = ()
    recompute: Sequence[Observation] = ()
    recompute_available: bool = True
    unavailable: str = ""
    default_incremental_us: float = 0.0
    """The default µs per batch row of the incremental path (0: :data:`INCREMENTAL_US`)."""
    default_scan_us: float = 0.0
    """The default µs per scanned row of a recompute (0: :data:`RECOMPUTE_SCAN_US`)."""
    default_batch_us: float = 0.0
    """The default µs per batch row of a recompute (0: :data:`RECOMPUTE_BATCH_US`)."""


@dataclass(frozen=True)
class Costs:
    """Per-row coefficients of both paths, and where each comes from."""

    incremental_us: float
    incremental_fixed_ms: float
    scan_us: float
    batch_us: float
    incremental_from: str
    recompute_from: str
    measured_up_to: int = 0  # largest batch a measured per-row cost was taken from


def _theil_sen(b: np.ndarray, ms: np.ndarray) -> tuple[float, float] | None:
    """``(fixed, per_row)`` of the line ``ms = fixed + per_row * b``, robustly, or None.

    The slope is the median of the slopes between every two runs of different sizes
    (Theil-Sen), the intercept the median residual: one disturbed run (a neighbour's
    benchmark, a flush) moves neither, where least squares on a few runs swings.
    """
    i, j = np.triu_indices(len(b), k=1)
    keep = b[i] != b[j]
    if not keep.any():
        return None
    slope = float(np.median((ms[j] - ms[i])[keep] / (b[j] - b[i])[keep]))
    return (float(np.median(ms - slope * b)), slope) if slope >= 0 else None


def estimate(context: BatchContext) -> Costs:
    """The coefficients for ``context``: measured on its recorded runs, else the defaults.

    Only runs of at least :data:`MIN_FIT_ROWS` batch rows set per-batch-row costs: a
    small run's time is mostly fixed costs (two runs of 288 and 2,880 rows took the same
    12.4 ms at SF1, a slope of zero), and extrapolating them misleads.  Incremental:
    with two or more such batch sizes, the line ``ms = fixed + inc_us * B``
    (:func:`_theil_sen`; a negative fixed cost gives way to :data:`INCREMENTAL_FIXED_MS`
    and the median per-row cost); with one, the median per-row cost.  Recompute: the
    executor times its scans apart (``Observation.scan_ms``), so ``scan_us`` is the
    median of ``scan_ms / N`` over the runs, and ``batch_us`` the median of
    ``(ms - scan_ms - fixed) / B`` over the runs of at least :data:`MIN_FIT_ROWS` batch
    rows; runs recorded without ``scan_ms`` give ``scan_us`` with the default
    ``batch_us`` taken off.
    """
    c = context
    default_batch_us = c.default_batch_us or RECOMPUTE_BATCH_US
    inc_us = (c.default_incremental_us or INCREMENTAL_US) \
        + INCREMENTAL_PARTNER_US * max(0.0, c.partners_per_row - 1.0)
    inc_fixed, inc_from = INCREMENTAL_FIXED_MS, "default"
    inc = [o for o in c.incremental if o.batch_rows >= MIN_FIT_ROWS]
    b = np.array([o.batch_rows for o in inc], np.float64)
    ms = np.array([o.ms for o in inc], np.float64)
    line = _theil_sen(b, ms) if len(inc) > 1 else None
    if line is not None and line[0] >= 0:
        inc_fixed, inc_us = line[0], line[1] * 1e3
        inc_from = f"fitted on {len(inc)} run(s)"
    elif inc:
        per_row = float(np.median((ms - INCREMENTAL_FIXED_MS) / b)) * 1e3
        if per_row >= 0:
            inc_us, inc_from = per_row, f"median of {len(inc)} run(s)"
    scan_us, batch_us, rc_from = c.default_scan_us or RECOMPUTE_SCAN_US, default_batch_us, \
        "default"
    rc = [o for o in c.recompute if o.scanned_rows >= MIN_FIT_ROWS]
    timed = [o for o in rc if o.scan_ms > 0]
    if timed:
        scan_us = float(np.median([o.scan_ms / o.scanned_rows for o in timed])) * 1e3
        rc_from = f"scan: median of {len(timed)} run(s), batch default"
        sized = [(o.ms - o.scan_ms - RECOMPUTE_FIXED_MS) / o.batch_rows for o in timed
                 if o.batch_rows >= MIN_FIT_ROWS]
        if sized and float(np.median(sized)) >= 0:
            batch_us = float(np.median(sized)) * 1e3
            rc_from = f"scan: median of {len(timed)} run(s), batch: of {len(sized)}"
    elif rc:
        per_row = float(np.median([
            (o.ms - RECOMPUTE_FIXED_MS - o.batch_rows * default_batch_us / 1e3)
            / o.scanned_rows for o in rc])) * 1e3
        if per_row >= 0:
            scan_us, rc_from = per_row, f"scan: median of {len(rc)} run(s), batch default"
    sizes = [o.batch_rows for o in inc] if inc_from != "default" else []
    if batch_us != default_batch_us:
        sizes += [o.batch_rows for o in timed if o.batch_rows >= MIN_FIT_ROWS]
    return Costs(inc_us, inc_fixed, scan_us, batch_us, inc_from, rc_from, max(sizes, default=0))


class RecomputeRule:
    """Choose ``incremental`` or ``recompute`` for one change batch, by estimated ms.

    >>> ctx = BatchContext("join j, right side", batch_rows=1_000,
    ...                    scanned_rows=100_000, state_rows=3_000_000)
    >>> d = RecomputeRule().apply(ctx)[0]
    >>> d.choice, d.figures["incremental_ms"], d.figures["recompute_ms"]
    ('incremental', 3.4, 68.35)
    """

    name = "recompute"

    def apply(self, context: BatchContext) -> list[Decision]:
        """One decision for the batch (subject: the join side or pipeline source)."""
        c = context
        k = estimate(c)
        inc_ms = k.incremental_fixed_ms + k.incremental_us * c.batch_rows / 1e3
        rc_ms = RECOMPUTE_FIXED_MS + (k.scan_us * c.scanned_rows
                                      + k.batch_us * c.batch_rows) / 1e3
        figures = {
            "batch_rows": c.batch_rows, "state_rows": c.state_rows,
            "scanned_rows": c.scanned_rows, "partners_per_row": round(c.partners_per_row, 3),
            "incremental_ms": round(inc_ms, 3), "recompute_ms": round(rc_ms, 3),
            "incremental_us_per_batch_row": round(k.incremental_us, 4),
            "incremental_fixed_ms": round(k.incremental_fixed_ms, 3),
            "recompute_us_per_scanned_row": round(k.scan_us, 4),
            "recompute_us_per_batch_row": round(k.batch_us, 4),
            "incremental_cost_from": k.incremental_from,
            "recompute_cost_from": k.recompute_from,
        }
        extrapolated = k.measured_up_to > 0 and \
            c.batch_rows > EXTRAPOLATION * k.measured_up_to
        margin = MARGIN_EXTRAPOLATED if extrapolated else MARGIN
        figures["margin"] = margin
        figures["measured_up_to_batch_rows"] = k.measured_up_to
        if not c.recompute_available:
            return [Decision(TOPIC, c.subject, "incremental",
                             f"incremental: {c.unavailable}", figures, self.name)]
        if c.batch_rows == 0:
            return [Decision(TOPIC, c.subject, "incremental",
                             "incremental: the batch is empty, there is nothing to recompute",
                             figures, self.name)]
        est = (f"{rows(c.batch_rows)} batch rows against {rows(c.scanned_rows)} rows a "
               f"recompute would scan ({rows(c.state_rows)} on this side): incremental "
               f"~{inc_ms:,.1f} ms ({k.incremental_us:.2f} µs/batch row, "
               f"{k.incremental_from}), recompute ~{rc_ms:,.1f} ms ({k.scan_us:.2f} "
               f"µs/scanned row + {k.batch_us:.2f} µs/batch row, {k.recompute_from})")
        if extrapolated:
            est += (f"; per-row costs measured on batches of up to "
                    f"{rows(k.measured_up_to)} rows are extrapolated, so recompute must be "
                    f"{margin:.0%} cheaper")
        if rc_ms < inc_ms * (1.0 - margin):
            return [Decision(TOPIC, c.subject, "recompute",
                             f"recompute, {times(inc_ms / rc_ms)} cheaper: {est}",
                             figures, self.name)]
        why = (f"{times(rc_ms / inc_ms)} cheaper" if inc_ms <= rc_ms else
               f"recompute is not {margin:.0%} cheaper")
        return [Decision(TOPIC, c.subject, "incremental", f"incremental, {why}: {est}",
                         figures, self.name)]
