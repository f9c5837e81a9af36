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
from joinstate.errors import StateCorruptedError
from joinstate.zset import checked_add

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
    """Rows of the side sorted by key hash (one run of the cache); ``w == 0``: removed."""

    __slots__ = ("_by_row", "_paired", "canon", "enc", "rh", "rows", "sorted_hash", "w")

    def __init__(self, rows: pa.Table, w: np.ndarray, rh: Bytes, enc: Bytes, canon: Bytes,
                 khash: np.ndarray) -> None:
        if len(khash) > 1 and (khash[1:] < khash[:-1]).any():
            order = np.argsort(khash, kind="stable")
            rows, w = rows.take(pa.array(order)), w[order]
            rh, enc, canon, khash = rh.take(order), enc.take(order), canon.take(order), \
                khash[order]
        self.rows, self.w, self.rh, self.enc, self.canon = rows, w, rh, enc, canon
        self.sorted_hash = khash
        self._by_row: tuple[np.ndarray, np.ndarray] | None = None
        self._paired = 0

    def __len__(self) -> int:
        return len(self.w)

    def _runs(self, qhash: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each query's key hash starts in the segment, and how many rows have it."""
        h = self.sorted_hash
        n = len(h)
        lo = np.searchsorted(h, qhash, side="left")
        # One binary search per query; the end of a key's run is searched for only where
        # the run is longer than one row (never on a side with one row per key).
        cnt = np.zeros(len(qhash), dtype=np.int64)
        inside = np.flatnonzero(lo < n)
        cnt[inside[h[lo[inside]] == qhash[inside]]] = 1
        more = np.flatnonzero(cnt & (lo + 1 < n))
        more = more[h[lo[more] + 1] == qhash[more]]
        if len(more):
            cnt[more] = np.searchsorted(h, qhash[more], side="right") - lo[more]
        return lo, cnt

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of matching rows (removed ones too) and the query each matches."""
        return self._pairs(qcanon, qhash, *self._runs(qhash))

    def _pairs(self, qcanon: Bytes, qhash: np.ndarray, lo: np.ndarray, cnt: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        total = int(cnt.sum())
        q = np.repeat(np.arange(len(qhash), dtype=np.int64), cnt)
        first_out = np.cumsum(cnt) - cnt
        e = np.repeat(lo - first_out, cnt) + np.arange(total, dtype=np.int64)
        if total:
            ok = qcanon.take(q).equals(self.canon.take(e))
            if not ok.all():
                e, q = e[ok], q[ok]
        return e, q

    def find(self, canon: Bytes, khash: np.ndarray, rh: Bytes, enc: Bytes
             ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of this segment equal to some of the given rows: (given row, position).

        Two ways.  *By key*: each given row is compared with the rows of the segment
        under its key, which costs the pairs (given rows x rows per key).  *By row
        hash*: a sorted copy of the segment's row hashes, built once and kept (a
        segment's rows never change, only their weights), answers each given row with
        one binary search; building it sorts every row of the segment (~0.1 s per
        million).  Ski rental decides: pairs are compared until as many have been
        compared as the segment has rows, then the copy is built.  A small change to a
        side with one or a few rows per key never sorts the segment; a bag whose keys
        hold thousands of rows (sales per date) sorts it on its first such change.  The
        segment's rows are distinct, so each given row has at most one match.
        """
        if self._by_row is None:
            lo, cnt = self._runs(khash)
            pairs = int(cnt.sum())
            if self._paired + pairs <= max(len(self), 64):
                self._paired += pairs
                e, q = self._pairs(canon, khash, lo, cnt)
                same = self._same_rows(e, q, rh)
                return self._checked(q[same], e[same], enc)
            self._by_row = _row_index(self.rh)
        by_row, order = self._by_row
        qv = _row_keys(rh, wide=by_row.dtype.kind == "V")
        if not len(by_row) or not len(qv):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pos = np.searchsorted(by_row, qv)
        inside = np.flatnonzero(pos < len(by_row))
        q = inside[by_row[pos[inside]] == qv[inside]]
        e = order[pos[q]].astype(np.int64, copy=False)
        q = q.astype(np.int64, copy=False)
        if by_row.dtype.kind != "V":  # 64 of the 128 bits matched: the rest must too
            same = self._same_rows(e, q, rh)
            e, q = e[same], q[same]
        return self._checked(q, e, enc)

    def _same_rows(self, e: np.ndarray, q: np.ndarray, rh: Bytes) -> np.ndarray:
        """Per pair, whether segment row ``e`` and given row ``q`` have the same row hash."""
        return self.rh.take(e).equals(rh.take(q)) if len(e) else np.zeros(0, bool)

    def _checked(self, q: np.ndarray, e: np.ndarray, enc: Bytes
                 ) -> tuple[np.ndarray, np.ndarray]:
        """``(q, e)``, once the rows paired by row hash are checked equal byte for byte."""
        if len(e) and not self.enc.take(e).equals(enc.take(q)).all():
            msg = "xxh3_128 collision between two different rows"
            raise StateCorruptedError(msg)
        return q, e

    def live(self) -> _Segment:
        """The segment without its removed rows (itself if it has none)."""
        if self.w.all():
            return self
        i = np.flatnonzero(self.w)
        return _Segment(self.rows.take(pa.array(i)), self.w[i], self.rh.take(i),
                        self.enc.take(i), self.canon.take(i), self.sorted_hash[i])

    @staticmethod
    def merge(segments: list[_Segment]) -> _Segment:
        """One segment holding the live rows of ``segments`` (no row is in two of them)."""
        parts = [s.live() for s in segments]
        return _Segment(
            pa.concat_tables([s.rows for s in parts]), np.concatenate([s.w for s in parts]),
            Bytes.concat([s.rh for s in parts]), Bytes.concat([s.enc for s in parts]),
            Bytes.concat([s.canon for s in parts]),
            np.concatenate([s.sorted_hash for s in parts]),
        )


def _row_index(rh: Bytes) -> tuple[np.ndarray, np.ndarray]:
    """Row hashes sorted, and the position each came from: what :meth:`_Segment.find` searches.

    Sorted by their first 64 bits (a numpy integer sort, ten times faster than sorting
    16-byte strings); a segment where two rows share those bits (about one in 10^7 for
    a million rows) is sorted by all 128.
    """
    if rh.width is not None and rh.width >= 8:
        head = _row_keys(rh, wide=False)
        order = np.argsort(head)
        head = head[order]
        if not (len(head) > 1 and (head[1:] == head[:-1]).any()):
            return head, order
    v = _as_void(rh)
    order = np.argsort(v, kind="stable")
    return v[order], order


def _row_keys(rh: Bytes, *, wide: bool) -> np.ndarray:
    """Search keys of row hashes: all their bytes (``wide``), or their first 64 bits."""
    if wide or rh.width is None or rh.width < 8:
        return _as_void(rh)
    m = np.ascontiguousarray(rh.matrix()[:, :8])
    return m.view("<u8").reshape(len(m))


def _as_void(b: Bytes) -> np.ndarray:
    """Fixed-width strings as one numpy void value each (sortable, comparable)."""
    m = np.ascontiguousarray(b.matrix())
    return m.view(f"V{m.shape[1]}").reshape(len(m))


class ProbeCache:
    """The whole side as Arrow, sorted by key hash: an in-memory hash-join build side.

    Asymmetry makes this affordable: the small side of a join fits in memory, and
    probing it with numpy ``searchsorted`` costs ~0.1 µs per row against ~5 µs for a
    RocksDB get from Python.  It is kept coherent by applying every consolidated delta of
    its side (:meth:`apply`): a row already in the cache gets its weight changed in place
    (to 0 when it is gone), the other rows of the delta become a new sorted segment, and
    segments of similar size are merged, so keeping the cache coherent costs in
    proportion to the delta, not to the cache.  No row is in two segments, so a probe
    reads every segment (a handful) and only concatenates what it finds.
    """

    def __init__(
        self, rows: pa.Table, w: np.ndarray, rh: Bytes, enc: Bytes, canon: Bytes,
        khash: np.ndarray,
    ) -> None:
        self.segments: list[_Segment] = [_Segment(rows, w, rh, enc, canon, khash)]

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """Stored rows whose key equals one of the queries (one entry per row)."""
        tables: list[pa.Table] = []
        ws: list[np.ndarray] = []
        qs: list[np.ndarray] = []
        for seg in self.segments:
            e, q = seg.probe(qcanon, qhash)
            if len(e):
                w = seg.w[e]
                if not w.all():
                    alive = np.flatnonzero(w)
                    e, q, w = e[alive], q[alive], w[alive]
                if len(e):
                    tables.append(seg.rows.take(pa.array(e)))
                    ws.append(w)
                    qs.append(q)
        if not tables:
            seg = self.segments[0]
            return Entries(seg.rows.schema.empty_table(), np.zeros(0, np.int64),
                           np.zeros(0, np.int64))
        if len(tables) == 1:
            return Entries(tables[0], ws[0], qs[0])
        return Entries(pa.concat_tables(tables), np.concatenate(ws), np.concatenate(qs))

    def apply(self, batch: PreparedBatch, keep: np.ndarray) -> ProbeCache:
        """Merge the non-NULL-key rows ``keep`` of ``batch`` in (in place; returns self)."""
        idx = np.flatnonzero(keep)
        if not len(idx):
            return self
        canon, khash, rh, enc = (batch.canon.take(idx), batch.khash[idx], batch.rh.take(idx),
                                 batch.enc.take(idx))
        w = batch.w[idx]
        new = np.ones(len(idx), dtype=bool)
        for seg in self.segments:
            rows_found, at = seg.find(canon, khash, rh, enc)
            if len(rows_found):
                seg.w[at] = checked_add(seg.w[at], w[rows_found], "probe cache weight")
                new[rows_found] = False
        rest = np.flatnonzero(new)
        if not len(rest):
            return self
        segments = self.segments
        segments.append(_Segment(batch.table.take(pa.array(idx[rest])), w[rest],
                                 rh.take(rest), enc.take(rest), canon.take(rest),
                                 khash[rest]))
        # Merge the tail while it is at least half the segment before it (a binary
        # counter: O(log n) segments, each row merged O(log n) times), in one step.
        first, total = len(segments) - 1, len(segments[-1])
        while first > 0 and 2 * total >= len(segments[first - 1]):
            first -= 1
            total += len(segments[first])
        if first < len(segments) - 1:
            segments[first:] = [_Segment.merge(segments[first:])]
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
