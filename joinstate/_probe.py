"""The in-memory probe cache of an index, and the policy that decides when to build it.

Probing a side stored in RocksDB costs a multi-get or a bounded iteration per key; a side
small enough to hold in memory can instead be scanned once into an Arrow table sorted by
key hash and probed with numpy ``searchsorted`` (~0.1 µs per row against ~5 µs for a get
from Python): the build side of a classic hash join, kept coherent with its writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate._bytes import Bytes
from joinstate._zset import consolidate

if TYPE_CHECKING:
    from joinstate.batch import PreparedBatch

__all__ = ["COST_GET_US", "COST_ROW_US", "COST_SCAN_US", "COST_SEEK_US", "Entries",
           "ProbeCache", "ProbePolicy"]

# Cost model of a probe, in microseconds per unit, measured on a 2-core VM with
# rocksdict 0.3.29 (``./dev bench core``): a cached point get; positioning an iterator at
# a key prefix; one row read through it (incl. decode); one row of a full scan (read,
# bulk decode and key hashing).
COST_GET_US = 5.0
COST_SEEK_US = 12.0
COST_ROW_US = 0.6
COST_SCAN_US = 0.6


@dataclass
class Entries:
    """Stored entries of a side returned by a probe, each tagged with its query group."""

    rows: pa.Table
    w: np.ndarray
    q: np.ndarray


class ProbeCache:
    """The whole side as Arrow, sorted by key hash: an in-memory hash-join build side.

    Asymmetry makes this affordable: the small side of a join fits in memory, and
    probing it with numpy ``searchsorted`` costs ~0.1 µs per row against ~5 µs for a
    RocksDB get from Python.  It is kept coherent by applying every consolidated delta of
    its side (see :meth:`apply`).
    """

    def __init__(
        self, rows: pa.Table, w: np.ndarray, rh: Bytes, enc: Bytes, canon: Bytes,
        khash: np.ndarray,
    ) -> None:
        order = np.argsort(khash, kind="stable")
        self.rows = rows
        self.w = w
        self.rh = rh
        self.enc = enc
        self.canon = canon
        self.khash = khash
        self.order = order
        self.sorted_hash = khash[order]

    def __len__(self) -> int:
        return len(self.w)

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        lo = np.searchsorted(self.sorted_hash, qhash, side="left")
        hi = np.searchsorted(self.sorted_hash, qhash, side="right")
        cnt = (hi - lo).astype(np.int64)
        total = int(cnt.sum())
        q = np.repeat(np.arange(len(qhash), dtype=np.int64), cnt)
        first_out = np.cumsum(cnt) - cnt
        pos = np.repeat(lo - first_out, cnt) + np.arange(total, dtype=np.int64)
        e = self.order[pos]
        ok = qcanon.take(q).equals(self.canon.take(e)) if total else np.zeros(0, bool)
        if not ok.all():
            e, q = e[ok], q[ok]
        return Entries(self.rows.take(pa.array(e)), self.w[e], q)

    def apply(self, batch: PreparedBatch, keep: np.ndarray) -> ProbeCache:
        """A new cache with the non-NULL-key rows ``keep`` of ``batch`` merged in."""
        idx = np.flatnonzero(keep)
        rows = pa.concat_tables([self.rows, batch.table.take(pa.array(idx))])
        w = np.concatenate([self.w, batch.w[idx]])
        rh = Bytes.concat([self.rh, batch.rh.take(idx)])
        enc = Bytes.concat([self.enc, batch.enc.take(idx)])
        canon = Bytes.concat([self.canon, batch.canon.take(idx)])
        khash = np.concatenate([self.khash, batch.khash[idx]])
        live, sums = consolidate(rh, enc, w, "probe cache weight")
        return ProbeCache(
            rows.take(pa.array(live)), sums, rh.take(live), enc.take(live), canon.take(live),
            khash[live],
        )


class ProbePolicy:
    """When to read a side by point probes and when to scan it into a probe cache.

    Ski rental: point probes are *rented*, a scan into the cache is *bought*.  The cache
    is bought once the point probes paid since the side last changed reach the price of
    the scan, so a side probed by many batches (a dimension while the fact streams in)
    gets cached, at most twice the cost of the best choice in hindsight.  Rent only
    counts while the scan could be kept as the cache (``max_rows``).
    """

    __slots__ = ("max_rows", "mode", "rent_us", "rows_per_key_seen")

    def __init__(self, mode: str, max_rows: int) -> None:
        self.mode = mode
        self.max_rows = max_rows
        self.rent_us = 0.0
        self.rows_per_key_seen: float | None = None

    def rows_per_key(self, entries: int, known_keys: int | None) -> float:
        """Expected entries per key: from counters when known, else as last observed."""
        if known_keys:
            return entries / known_keys
        return self.rows_per_key_seen or 1.0

    def should_scan(self, entries: int, point_us: float) -> bool:
        """Whether to scan the side now (``point_us``: the cost of probing by points)."""
        if self.mode == "point":
            return False
        if self.mode == "scan":
            return True
        rent = self.rent_us if entries <= self.max_rows else 0.0
        if entries * COST_SCAN_US <= point_us + rent:
            self.rent_us = 0.0
            return True
        self.rent_us += point_us
        return False

    def observed(self, rows: int, keys: int) -> None:
        """Remember how many rows a key held in the last point probe."""
        if keys:
            self.rows_per_key_seen = max(1.0, rows / keys)

    def side_changed(self) -> None:
        """The side was written: rent paid so far bought nothing lasting."""
        self.rent_us = 0.0
