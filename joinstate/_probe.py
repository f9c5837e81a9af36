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
           "ProbeCache", "ProbePolicy", "Rental"]

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


class _Segment:
    """Rows of the side sorted by key hash (one run of the cache)."""

    __slots__ = ("canon", "enc", "rh", "rows", "sorted_hash", "w")

    def __init__(self, rows: pa.Table, w: np.ndarray, rh: Bytes, enc: Bytes, canon: Bytes,
                 khash: np.ndarray) -> None:
        order = np.argsort(khash, kind="stable")
        if len(order) and not (order == np.arange(len(order))).all():
            rows, w = rows.take(pa.array(order)), w[order]
            rh, enc, canon, khash = rh.take(order), enc.take(order), canon.take(order), \
                khash[order]
        self.rows, self.w, self.rh, self.enc, self.canon = rows, w, rh, enc, canon
        self.sorted_hash = khash

    def __len__(self) -> int:
        return len(self.w)

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of matching rows and the query each matches."""
        lo = np.searchsorted(self.sorted_hash, qhash, side="left")
        hi = np.searchsorted(self.sorted_hash, qhash, side="right")
        cnt = (hi - lo).astype(np.int64)
        total = int(cnt.sum())
        q = np.repeat(np.arange(len(qhash), dtype=np.int64), cnt)
        first_out = np.cumsum(cnt) - cnt
        e = np.repeat(lo - first_out, cnt) + np.arange(total, dtype=np.int64)
        if total:
            ok = qcanon.take(q).equals(self.canon.take(e))
            if not ok.all():
                e, q = e[ok], q[ok]
        return e, q

    @staticmethod
    def merge(segments: list[_Segment]) -> _Segment:
        """One consolidated segment holding the rows of ``segments``."""
        rows = pa.concat_tables([s.rows for s in segments])
        w = np.concatenate([s.w for s in segments])
        rh = Bytes.concat([s.rh for s in segments])
        enc = Bytes.concat([s.enc for s in segments])
        canon = Bytes.concat([s.canon for s in segments])
        khash = np.concatenate([s.sorted_hash for s in segments])
        live, sums = consolidate(rh, enc, w, "probe cache weight")
        return _Segment(rows.take(pa.array(live)), sums, rh.take(live), enc.take(live),
                        canon.take(live), khash[live])


class ProbeCache:
    """The whole side as Arrow, sorted by key hash: an in-memory hash-join build side.

    Asymmetry makes this affordable: the small side of a join fits in memory, and
    probing it with numpy ``searchsorted`` costs ~0.1 µs per row against ~5 µs for a
    RocksDB get from Python.  It is kept coherent by applying every consolidated delta of
    its side (:meth:`apply`).  A delta becomes a new sorted segment (weights may be
    negative) and segments of similar size are merged, so keeping the cache coherent
    costs in proportion to the delta, not to the cache; probes read every segment (a
    handful) and sum the entries of one row across them.
    """

    def __init__(
        self, rows: pa.Table, w: np.ndarray, rh: Bytes, enc: Bytes, canon: Bytes,
        khash: np.ndarray,
    ) -> None:
        self.segments: list[_Segment] = [_Segment(rows, w, rh, enc, canon, khash)]

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """Stored rows whose key equals one of the queries, consolidated per row."""
        if len(self.segments) == 1:
            seg = self.segments[0]
            e, q = seg.probe(qcanon, qhash)
            return Entries(seg.rows.take(pa.array(e)), seg.w[e], q)
        parts = []
        for seg in self.segments:
            e, q = seg.probe(qcanon, qhash)
            if len(e):
                parts.append((seg, e, q))
        if not parts:
            seg = self.segments[0]
            return Entries(seg.rows.schema.empty_table(), np.zeros(0, np.int64),
                           np.zeros(0, np.int64))
        rows = pa.concat_tables([seg.rows.take(pa.array(e)) for seg, e, _ in parts])
        w = np.concatenate([seg.w[e] for seg, e, _ in parts])
        q = np.concatenate([q for _, _, q in parts])
        if len(parts) == 1:
            return Entries(rows, w, q)
        rh = Bytes.concat([seg.rh.take(e) for seg, e, _ in parts])
        enc = Bytes.concat([seg.enc.take(e) for seg, e, _ in parts])
        # A row whose entries sit in several segments: one entry, weights summed (per
        # query: equal rows have equal keys, so they match the same query).
        live, sums = consolidate(rh, enc, w, "probe cache weight")
        return Entries(rows.take(pa.array(live)), sums, q[live])

    def apply(self, batch: PreparedBatch, keep: np.ndarray) -> ProbeCache:
        """Merge the non-NULL-key rows ``keep`` of ``batch`` in (in place; returns self)."""
        idx = np.flatnonzero(keep)
        if not len(idx):
            return self
        seg = _Segment(batch.table.take(pa.array(idx)), batch.w[idx], batch.rh.take(idx),
                       batch.enc.take(idx), batch.canon.take(idx), batch.khash[idx])
        segments = self.segments
        segments.append(seg)
        while len(segments) > 1 and 2 * len(segments[-1]) >= len(segments[-2]):
            tail = segments.pop()
            segments[-1] = _Segment.merge([segments[-1], tail])
        return self


class Rental:
    """Ski rental for derived in-memory state: pay per use, buy once rent reaches price.

    Building a structure (a probe cache, a key set, an entry map) costs one scan; not
    having it costs a little on every batch.  Buying once the rent paid reaches the price
    costs at most twice the best choice in hindsight, without knowing the future.
    """

    __slots__ = ("paid_us",)

    def __init__(self) -> None:
        self.paid_us = 0.0

    def rent(self, cost_us: float, price_us: float) -> bool:
        """Pay ``cost_us`` for doing without; True when it is time to pay ``price_us``."""
        self.paid_us += cost_us
        if self.paid_us >= price_us:
            self.paid_us = 0.0
            return True
        return False


class ProbePolicy:
    """When to read a side by point probes and when to scan it into a probe cache.

    Ski rental (:class:`Rental`): point probes are rented, a scan into the cache is
    bought, so a side probed by many batches (a dimension while the fact streams in)
    gets cached, at most twice the cost of the best choice in hindsight.  Rent only
    counts while the scan could be kept as the cache (``max_rows``), and a write to the
    side forfeits it (the cache would have had to be kept coherent).
    """

    __slots__ = ("max_rows", "mode", "rental", "rows_per_key_seen")

    def __init__(self, mode: str, max_rows: int) -> None:
        self.mode = mode
        self.max_rows = max_rows
        self.rental = Rental()
        self.rows_per_key_seen: float | None = None

    def rows_per_key(self, entries: int, known_keys: int | None) -> float:
        """Expected entries per key: from counters when known, else as last observed."""
        if known_keys:
            return entries / known_keys
        return self.rows_per_key_seen or 1.0

    def should_scan(self, entries: int, point_us: float) -> bool:
        """Whether to scan the side now (``point_us``: the cost of probing by points)."""
        if self.mode in ("point", "scan"):
            return self.mode == "scan"
        price = entries * COST_SCAN_US
        if entries > self.max_rows:
            return price <= point_us
        return self.rental.rent(point_us, price)

    def observed(self, rows: int, keys: int) -> None:
        """Remember how many rows a key held in the last point probe."""
        if keys:
            self.rows_per_key_seen = max(1.0, rows / keys)

    def side_changed(self) -> None:
        """The side was written: rent paid so far bought nothing lasting."""
        self.rental = Rental()
