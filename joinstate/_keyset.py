"""An exact in-memory set of 64-bit key hashes, vectorised: the unique-key filter.

Enforcing a declared unique key used to cost a RocksDB read per inserted row (a batched
multi-get: ~1 µs per key plus Python work per row), which halved the push rate of a
unique-key side.  A set of the hashes of every stored key answers "is any of these keys
possibly stored?" for a whole batch in a few numpy calls; only keys whose hash is in
the set (a real duplicate, a retraction, or a rare 64-bit collision) are read.

The set is kept as sorted ``uint64`` runs of geometrically growing sizes, like a small
in-memory LSM tree: a batch becomes a new run, and runs of similar size are merged, so
an insert costs O(log n) amortised copies per hash and a lookup one ``searchsorted``
per run (at most ~log2(n / batch) runs).  8 bytes per key: 80 MB for 10M keys.
Deletions are not removed (a stale hash only costs a read later).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from joinstate._bytes import Bytes

__all__ = ["EntryMap", "HashSet64", "has_duplicates", "hash64"]

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _fmix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(33))
        h = h * _M1
        h = h ^ (h >> np.uint64(33))
        h = h * _M2
        return h ^ (h >> np.uint64(33))


def hash64(data: Bytes, seed: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit hash of every byte string (vectorised for fixed widths), mixed with ``seed``.

    Not xxh3 (which the on-disk key prefix uses): only this process's filter uses it.
    """
    n = len(data)
    h = np.full(n, _GOLD, dtype=np.uint64) if seed is None else _fmix(seed.astype(np.uint64))
    width = data.width
    if width is None:
        import xxhash

        digest = xxhash.xxh3_64_intdigest
        words = np.fromiter((digest(b) for b in data.to_list()), np.uint64, n)
        with np.errstate(over="ignore"):
            return _fmix(h ^ (words * _GOLD))
    mat = data.matrix()
    pad = (-width) % 8
    if pad:
        mat = np.concatenate([mat, np.zeros((n, pad), np.uint8)], axis=1)
    words = np.ascontiguousarray(mat).view("<u8")
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            h = _fmix(h ^ (words[:, j] * _GOLD) ^ np.uint64(width))
    return h


def _sorted_distinct(a: np.ndarray, kind: str = "quicksort") -> np.ndarray:
    """``a`` sorted, duplicates dropped.

    Not ``np.unique``: numpy 2 answers it with a hash table, ~10x slower on these sizes.
    """
    s = np.sort(a, kind=kind)  # type: ignore[call-overload]
    if len(s) > 1:
        keep = np.empty(len(s), dtype=bool)
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
        if not keep.all():
            return s[keep]
    return s


def has_duplicates(a: np.ndarray) -> bool:
    """Whether any value occurs twice (sort-based)."""
    s = np.sort(a)
    return bool(len(s) > 1 and (s[1:] == s[:-1]).any())


class HashSet64:
    """An exact set of uint64 values as sorted runs (see the module docstring)."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    def contains(self, h: np.ndarray) -> np.ndarray:
        """Membership of each value (bool array)."""
        found = np.zeros(len(h), dtype=bool)
        if not len(h):
            return found
        # Sorted needles: each binary search starts where the last one ended.
        order = np.argsort(h)
        hs = h[order]
        hit = np.zeros(len(h), dtype=bool)
        for run in self.runs:
            pos = np.searchsorted(run, hs)
            pos[pos == len(run)] = len(run) - 1
            hit |= run[pos] == hs
        found[order] = hit
        return found

    def add(self, h: np.ndarray) -> None:
        """Add values (duplicates are harmless)."""
        if not len(h):
            return
        run = _sorted_distinct(h.astype(np.uint64, copy=False))
        while self.runs and len(self.runs[-1]) <= 2 * len(run):
            # Two sorted runs: a stable sort (timsort) merges them in linear time.
            run = _sorted_distinct(np.concatenate([self.runs.pop(), run]), kind="stable")
        self.runs.append(run)


_SETTLE_MIN = 1 << 20
"""Queued appends are sorted in once there are this many (or as many as in the runs)."""

_FANOUT = 4
"""A run absorbs the next once it is at most this many times larger (fewer, larger runs
mean fewer merges per entry: each entry is copied ~log4(n / batch) times)."""


def _merge(ak: np.ndarray, av: np.ndarray, bk: np.ndarray, bv: np.ndarray) -> tuple[
    np.ndarray, np.ndarray
]:
    """Merge two runs sorted by key, in linear time (positions by binary search)."""
    n = len(ak) + len(bk)
    pos_b = np.searchsorted(ak, bk, side="right") + np.arange(len(bk), dtype=np.int64)
    from_a = np.ones(n, dtype=bool)
    from_a[pos_b] = False
    keys = np.empty(n, dtype=np.uint64)
    vals = np.empty(n, dtype=np.uint64)
    keys[pos_b], vals[pos_b] = bk, bv
    keys[from_a], vals[from_a] = ak, av
    return keys, vals


class EntryMap:
    """Where a bag index's entries are: 64-bit row hash -> batch sequence of each entry.

    A bag row's RocksDB key ends in the sequence number of the batch that appended it,
    which a retraction cannot know, so finding the entries of a retracted row costs an
    iterator seek (one per overlapping file, ~6-15 µs).  With this map the exact keys are
    known, and a batch of retractions becomes one multi-get (one bloom-filtered read per
    key, GIL released).  The map is a hint: every key it names is read back and checked,
    and a row it cannot account for is looked up by a seek.

    Storage: sorted runs of (hash, seq) with a live flag per pair; removal clears the
    flag in place, merges drop dead pairs.  Appends are only queued (an insert-only load
    pays nothing per batch) and sorted into the runs when the map is next read, when the
    queue outgrows the runs, or on :meth:`settle`.  16 bytes per entry plus one flag.
    """

    __slots__ = ("pending", "pending_rows", "runs")

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending_rows = 0

    def __len__(self) -> int:
        return sum(int(live.sum()) for _, _, live in self.runs) + self.pending_rows

    def add(self, h: np.ndarray, seq: np.ndarray) -> None:
        """Record entries (row hash ``h[i]`` has an entry with sequence ``seq[i]``)."""
        if not len(h):
            return
        self.pending.append((h.astype(np.uint64, copy=False), seq.astype(np.uint64, copy=False)))
        self.pending_rows += len(h)
        if self.pending_rows >= max(_SETTLE_MIN, sum(len(r[0]) for r in self.runs)):
            self.settle()

    def settle(self) -> None:
        """Sort queued appends into the runs (one sort for the whole queue)."""
        if not self.pending:
            return
        h = np.concatenate([p[0] for p in self.pending])
        seq = np.concatenate([p[1] for p in self.pending])
        self.pending, self.pending_rows = [], 0
        if (seq == seq[0]).all():  # one sequence: sort the hashes only
            keys, vals = np.sort(h), seq
        else:
            order = np.argsort(h)
            keys, vals = h[order], seq[order]
        while self.runs and len(self.runs[-1][0]) <= _FANOUT * len(keys):
            pk, pv, live = self.runs.pop()
            if not live.all():
                pk, pv = pk[live], pv[live]
            keys, vals = _merge(pk, pv, keys, vals)
        self.runs.append((keys, vals, np.ones(len(keys), dtype=bool)))

    def lookup(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]:
        """Live entries of each queried hash: (query index, seq, locations per run)."""
        self.settle()
        qi_parts: list[np.ndarray] = []
        seq_parts: list[np.ndarray] = []
        locs: list[tuple[int, np.ndarray]] = []
        # Sorted needles: numpy's binary search then narrows each search by the last
        # one, and the big run is walked forward once (3x faster on 2.9M entries).
        qorder = np.argsort(q, kind="stable")
        qs = q[qorder]
        for r, (keys, vals, live) in enumerate(self.runs):
            lo = np.searchsorted(keys, qs, side="left")
            hi = np.searchsorted(keys, qs, side="right")
            cnt = (hi - lo).astype(np.int64)
            total = int(cnt.sum())
            if not total:
                continue
            qi = np.repeat(qorder, cnt)
            first_out = np.cumsum(cnt) - cnt
            pos = np.repeat(lo - first_out, cnt) + np.arange(total, dtype=np.int64)
            ok = live[pos]
            qi_parts.append(qi[ok])
            seq_parts.append(vals[pos[ok]])
            locs.append((r, pos[ok]))
        if not qi_parts:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64), []
        return np.concatenate(qi_parts), np.concatenate(seq_parts), locs

    def remove(self, locs: list[tuple[int, np.ndarray]], keep: np.ndarray | None = None) -> None:
        """Mark entries found by :meth:`lookup` dead (``keep``: a mask over them to skip)."""
        offset = 0
        for r, pos in locs:
            sel = pos if keep is None else pos[~keep[offset:offset + len(pos)]]
            self.runs[r][2][sel] = False
            offset += len(pos)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every live (hash, seq) pair, for saving."""
        self.settle()
        if not self.runs:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        return (np.concatenate([k[live] for k, _, live in self.runs]),
                np.concatenate([v[live] for _, v, live in self.runs]))
