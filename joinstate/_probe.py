"""The in-memory probe cache of a side, and the cost model that decides when to build it.

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
from joinstate._zset import group_rows, sum_by

if TYPE_CHECKING:
    from joinstate._index import Batch

__all__ = ["COST_GET_US", "COST_ROW_US", "COST_SCAN_US", "COST_SEEK_US", "Entries",
           "ProbeCache"]

# Cost model of a probe, in microseconds per unit, measured on the project machine
# (ROCKSDICT.md and bench/core.py): a cached point get; opening a bounded iterator at a key
# prefix; one row read through it (``values()``, incl. decode); one row of a full scan
# (``values()`` at ~0.25 µs plus bulk decode and key hashing).
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

    def apply(self, batch: Batch, keep: np.ndarray) -> ProbeCache:
        """A new cache with the non-NULL-key rows ``keep`` of ``batch`` merged in."""
        idx = np.flatnonzero(keep)
        rows = pa.concat_tables([self.rows, batch.rows.take(pa.array(idx))])
        w = np.concatenate([self.w, batch.w[idx]])
        rh = Bytes.concat([self.rh, batch.rh.take(idx)])
        enc = Bytes.concat([self.enc, batch.enc.take(idx)])
        canon = Bytes.concat([self.canon, batch.canon.take(idx)])
        khash = np.concatenate([self.khash, batch.khash[idx]])
        g = group_rows(rh, enc)
        sums = sum_by(g.inv, w, len(g))
        live = g.first[sums != 0]
        sel = pa.array(live)
        return ProbeCache(
            rows.take(sel), sums[sums != 0], rh.take(live), enc.take(live), canon.take(live),
            khash[live],
        )
