"""Samples of RocksDB's state while population writes, and the guard's thresholds.

Population acts on two things it samples: the L0 file count and the estimated pending
compaction bytes of each column family, checked against the strategy's limits (a
crossing is a :class:`~compaction.ThresholdCrossed` event: the guard re-enables a family
some policy disabled).  The same samples, with each family's bytes (SST files +
memtables), the write-stall time and the process's peak RSS, go to the reports, for
charts and for the planner's next decision.  A sample reads four RocksDB properties per
family and the statistics dump: well under a millisecond for the few dozen families a
population writes, so it is taken at most every ``interval`` seconds between batches,
and always when an input finishes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import psutil

from compaction import ThresholdCrossed

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from compaction import Event
    from joinstate import Database

__all__ = ["SAMPLE_INTERVAL", "Sampler"]

SAMPLE_INTERVAL = 0.25
"""Default least seconds between two samples taken after a batch."""


class Sampler:
    """Samples of L0 files, pending compaction bytes and bytes per family, over time.

    Each sample is ``{"t": seconds since the load started, "source": the input being
    loaded, "rows": input rows loaded by this call so far, "stall_micros": write stall
    time since the load started (DB-wide), "l0": {family: L0 files}, "pending": {family:
    estimated pending compaction bytes}, "bytes": {family: SST + memtable bytes}}``.
    ``dispatch`` receives a :class:`~compaction.ThresholdCrossed` the first time a family
    passes ``l0_limit`` or ``pending_bytes_limit``.
    """

    def __init__(self, store: Database, families: Sequence[str], interval: float,
                 dispatch: Callable[[Event], None], *, l0_limit: int,
                 pending_bytes_limit: int | None, t0: float) -> None:
        self.store = store
        self.families = list(dict.fromkeys(families))
        self.interval = interval
        self.dispatch = dispatch
        self.l0_limit = l0_limit
        self.pending_bytes_limit = pending_bytes_limit
        self.t0 = t0
        self.last = -1.0
        self.samples: list[dict[str, Any]] = []
        self.l0_max: dict[str, int] = {}
        self.alerted: set[tuple[str, str]] = set()
        self.proc = psutil.Process()
        self.rss_start = self.proc.memory_info().rss
        self.peak_rss = self.rss_start
        self.stall0 = store.activity().get("stall_micros", 0)

    def take(self, source: str, rows: int, force: bool = False) -> None:
        """Sample now if ``interval`` passed since the last sample (or ``force``).

        ``rows``: input rows loaded by this call so far.
        """
        now = time.perf_counter() - self.t0
        if not force and now - self.last < self.interval:
            return
        self.last = now
        self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        props: dict[str, dict[str, int]] = {"l0": {}, "pending": {}, "bytes": {}}
        store = self.store
        for cf in self.families:
            n = store.property_int(cf, "rocksdb.num-files-at-level0") or 0
            pending = store.property_int(cf, "rocksdb.estimate-pending-compaction-bytes") or 0
            props["l0"][cf] = n
            props["pending"][cf] = pending
            props["bytes"][cf] = (
                (store.property_int(cf, "rocksdb.total-sst-files-size") or 0)
                + (store.property_int(cf, "rocksdb.cur-size-all-mem-tables") or 0))
            self.l0_max[cf] = max(self.l0_max.get(cf, 0), n)
            if n > self.l0_limit and (cf, "l0") not in self.alerted:
                self.alerted.add((cf, "l0"))
                self.dispatch(ThresholdCrossed(cf, "l0_files", n, self.l0_limit))
            limit = self.pending_bytes_limit
            if limit is not None and pending > limit and (cf, "pending") not in self.alerted:
                self.alerted.add((cf, "pending"))
                self.dispatch(ThresholdCrossed(cf, "pending_compaction_bytes", pending, limit))
        self.samples.append({
            "t": round(now, 4), "source": source, "rows": rows,
            "stall_micros": store.activity().get("stall_micros", 0) - self.stall0, **props,
        })

    def l0_samples(self) -> list[tuple[float, dict[str, int]]]:
        """``[(seconds, {family: L0 files})]``: the L0 part of every sample."""
        return [(round(s["t"], 3), dict(s["l0"])) for s in self.samples]
