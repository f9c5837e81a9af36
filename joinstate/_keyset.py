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

The same run structure holds a bag index's :class:`EntryMap` (row hash -> batch sequence
and count of every stored entry), which lets retractions be decided without reading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from joinstate._bytes import Bytes

__all__ = ["EntryMap", "Found", "HashSet64", "has_duplicates", "hash64"]

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

_DIR_MIN = 1 << 14
"""Runs at least this long get a directory (see :class:`_Run`); shorter ones are searched."""


class _Run:
    """Entries sorted by the low 64 bits of their row hash; ``count == 0`` marks removed.

    A long run also has a *directory*: the position of the first entry of every bucket
    of the top bits of the hash.  Row hashes are uniform, so a bucket holds 2-4 entries
    and a lookup is two gathers and a short forward walk instead of a binary search over
    the whole run (``searchsorted``'s ~22 probing steps on 2.9M entries each miss the
    cache).
    """

    __slots__ = ("count", "dir", "hi", "lo", "seq", "shift")

    def __init__(self, lo: np.ndarray, hi: np.ndarray, seq: np.ndarray, count: np.ndarray
                 ) -> None:
        self.lo, self.hi, self.seq, self.count = lo, hi, seq, count
        self.dir: np.ndarray | None = None
        self.shift = np.uint64(64)
        n = len(lo)
        if n >= _DIR_MIN:
            bits = int(n).bit_length() - 2  # 2-4 entries per bucket: 2-4 bytes per entry
            self.shift = np.uint64(64 - bits)
            per_bucket = np.bincount((lo >> self.shift).astype(np.int64), minlength=1 << bits)
            self.dir = np.zeros((1 << bits) + 1, np.int64)
            np.cumsum(per_bucket, out=self.dir[1:])

    def __len__(self) -> int:
        return len(self.lo)

    def first_at_or_after(self, qs: np.ndarray) -> np.ndarray:
        """Position of the first entry with ``lo >= q``, for every query ``q``."""
        if self.dir is None:
            return np.searchsorted(self.lo, qs, side="left")
        b = (qs >> self.shift).astype(np.int64)
        pos = self.dir[b]
        end = self.dir[b + 1]
        # Walk forward within the bucket while the entry is smaller than the query.
        todo = np.flatnonzero(pos < end)
        while len(todo):
            p = pos[todo]
            behind = self.lo[p] < qs[todo]
            todo = todo[behind]
            pos[todo] += 1
            todo = todo[pos[todo] < end[todo]]
        return pos

    def live(self) -> np.ndarray:
        """Mask of entries not removed."""
        return self.count != 0


def _merge_runs(a: _Run, b: _Run) -> _Run:
    """Merge two runs (removed entries dropped), in linear time."""
    parts = []
    for r in (a, b):
        keep = r.live()
        parts.append((r.lo, r.hi, r.seq, r.count) if keep.all() else
                     (r.lo[keep], r.hi[keep], r.seq[keep], r.count[keep]))
    (alo, *arest), (blo, *brest) = parts
    n = len(alo) + len(blo)
    pos_b = np.searchsorted(alo, blo, side="right") + np.arange(len(blo), dtype=np.int64)
    from_a = np.ones(n, dtype=bool)
    from_a[pos_b] = False
    out = []
    for x, y in zip((alo, *arest), (blo, *brest), strict=True):
        z = np.empty(n, dtype=x.dtype)
        z[pos_b] = y
        z[from_a] = x
        out.append(z)
    return _Run(*out)


class Found:
    """Entries found by :meth:`EntryMap.lookup`: for each, its query, identity and place."""

    __slots__ = ("count", "hi", "lo", "pos", "qi", "run", "seq", "version")

    def __init__(self, qi: np.ndarray, lo: np.ndarray, hi: np.ndarray, seq: np.ndarray,
                 count: np.ndarray, run: np.ndarray, pos: np.ndarray, version: int) -> None:
        self.qi, self.lo, self.hi, self.seq, self.count = qi, lo, hi, seq, count
        self.run, self.pos, self.version = run, pos, version

    def __len__(self) -> int:
        return len(self.qi)


class EntryMap:
    """Every entry of a bag index: 128-bit row hash -> (batch sequence, count), exact.

    A bag row's RocksDB key ends in the sequence number of the batch that appended it,
    and its value starts with the entry's count.  A retraction needs both: which keys to
    delete or rewrite, and whether the row's summed count stays >= 0.  Reading them costs
    a RocksDB read per retracted row (an iterator seek, ~12 µs, or with the keys known a
    multi-get, ~4 µs on a cold block cache), twice the cost of the write that follows.
    This map holds, for every stored entry, the row hash (both 64-bit halves), the batch
    sequence and the count, so a retraction is decided in memory and written blindly:
    deletes of exhausted entries, an in-place rewrite of the count otherwise.

    It must therefore be *exact*: it is created empty for an empty index and changed
    only after a transaction that changed the index committed
    (:meth:`~joinstate.transaction.Transaction.after_commit`), built by one scan of the
    index, or loaded from a file that is checked against the store's counters first
    (see ``BagLayout``).  Rows are identified by their xxh3_128 hash, as on disk (the
    hash is part of every entry's RocksDB key).

    Storage: sorted runs of (lo, hi, seq, count) of geometrically growing sizes, like a
    small in-memory LSM tree; a count of 0 marks a removed entry and merges drop them.
    Appends are only queued (an insert-only load pays nothing per batch) and sorted in
    when the map is next read, when the queue outgrows the runs, or on :meth:`settle`.
    32 bytes per entry.
    """

    __slots__ = ("pending", "pending_rows", "runs", "version")

    def __init__(self) -> None:
        self.runs: list[_Run] = []
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending_rows = 0
        self.version = 0  # changes whenever entries move between runs

    def __len__(self) -> int:
        return sum(int(r.live().sum()) for r in self.runs) + self.pending_rows

    def total(self) -> int:
        """The summed count of every entry (the index's rows counter, if exact)."""
        return sum(int(r.count.sum()) for r in self.runs) + sum(
            int(p[3].sum()) for p in self.pending)

    def add(self, lo: np.ndarray, hi: np.ndarray, seq: np.ndarray, count: np.ndarray) -> None:
        """Record new entries: row hash (``lo``, ``hi``) has one with ``seq`` and ``count``."""
        if not len(lo):
            return
        u64 = np.uint64
        self.pending.append((lo.astype(u64, copy=False), hi.astype(u64, copy=False),
                             seq.astype(u64, copy=False), count.astype(np.int64, copy=False)))
        self.pending_rows += len(lo)
        if self.pending_rows >= max(_SETTLE_MIN, sum(len(r) for r in self.runs)):
            self.settle()

    def settle(self) -> None:
        """Sort queued appends into the runs (one sort for the whole queue)."""
        if not self.pending:
            return
        cols = [np.concatenate([p[i] for p in self.pending]) for i in range(4)]
        self.pending, self.pending_rows = [], 0
        order = np.argsort(cols[0], kind="stable")
        run = _Run(*(c[order] for c in cols))
        while self.runs and len(self.runs[-1]) <= _FANOUT * len(run):
            run = _merge_runs(self.runs.pop(), run)
        self.runs.append(run)
        self.version += 1

    def compact(self) -> None:
        """Merge every run into one, removed entries dropped: the form that is saved."""
        self.settle()
        if not self.runs:
            return
        run = self.runs[0]
        for other in self.runs[1:]:
            run = _merge_runs(run, other)
        keep = run.live()
        if not keep.all():
            run = _Run(run.lo[keep], run.hi[keep], run.seq[keep], run.count[keep])
        if run is not self.runs[0]:
            self.runs = [run] if len(run) else []
            self.version += 1

    def lookup(self, lo: np.ndarray, hi: np.ndarray) -> Found:
        """Every live entry of each queried row hash (``lo[i]``, ``hi[i]``)."""
        self.settle()
        parts: list[tuple[np.ndarray, ...]] = []
        qs, qh = lo.astype(np.uint64, copy=False), hi.astype(np.uint64, copy=False)
        for r, run in enumerate(self.runs):
            start = run.first_at_or_after(qs)
            n = len(run)
            active = np.arange(len(qs), dtype=np.int64)
            cand = start
            while len(active):
                ok = cand < n
                active, cand = active[ok], cand[ok]
                same = run.lo[cand] == qs[active]
                active, cand = active[same], cand[same]
                if not len(active):
                    break
                hit = (run.hi[cand] == qh[active]) & (run.count[cand] != 0)
                a, c = active[hit], cand[hit]
                parts.append((a, np.full(len(a), r, np.int64), c))
                cand = cand + 1
        if not parts:
            e64, eu = np.zeros(0, np.int64), np.zeros(0, np.uint64)
            return Found(e64, eu, eu, eu, e64, e64, e64, self.version)
        qi, run_i, pos = (np.concatenate(x) for x in zip(*parts, strict=True))
        seq = np.empty(len(qi), np.uint64)
        count = np.empty(len(qi), np.int64)
        for r in np.unique(run_i).tolist():
            sel = run_i == r
            seq[sel] = self.runs[r].seq[pos[sel]]
            count[sel] = self.runs[r].count[pos[sel]]
        return Found(qi, lo[qi], hi[qi], seq, count, run_i, pos, self.version)

    def set_counts(self, found: Found, counts: np.ndarray) -> None:
        """Give the entries of ``found`` new counts (0 removes an entry)."""
        if not len(found):
            return
        if found.version != self.version:
            # Entries moved between runs since the lookup: find them again by identity
            # (row hash and sequence are unique per entry).
            again = self.lookup(found.lo, found.hi)
            same = again.seq == found.seq[again.qi]
            counts = counts[again.qi[same]]
            found = Found(again.qi[same], again.lo[same], again.hi[same], again.seq[same],
                          again.count[same], again.run[same], again.pos[same], again.version)
        for r in np.unique(found.run).tolist():
            sel = found.run == r
            self.runs[r].count[found.pos[sel]] = counts[sel]

    def between(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every live entry with ``start <= lo < stop`` (``stop`` up to 2**64): (lo, hi, count).

        One binary search per run: the runs are sorted by ``lo``, so a range of hashes
        (a pipeline source record's bucket) is a slice of each.
        """
        self.settle()
        parts = []
        for run in self.runs:
            a = int(np.searchsorted(run.lo, np.uint64(start)))
            b = len(run) if stop >= 1 << 64 else int(np.searchsorted(run.lo, np.uint64(stop)))
            keep = run.count[a:b] != 0
            parts.append((run.lo[a:b][keep], run.hi[a:b][keep], run.count[a:b][keep]))
        if not parts:
            u = np.zeros(0, np.uint64)
            return u, u, np.zeros(0, np.int64)
        lo, hi, count = (np.concatenate(x) for x in zip(*parts, strict=True))
        return lo, hi, count

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every live entry as one run sorted by ``lo``: (lo, hi, seq, count), for saving."""
        self.compact()
        if not self.runs:
            u = np.zeros(0, np.uint64)
            return u, u, u, np.zeros(0, np.int64)
        r = self.runs[0]
        return r.lo, r.hi, r.seq, r.count

    @classmethod
    def from_sorted(cls, lo: np.ndarray, hi: np.ndarray, seq: np.ndarray, count: np.ndarray
                    ) -> EntryMap:
        """A map holding one run already sorted by ``lo`` (as :meth:`arrays` returns it)."""
        emap = cls()
        if len(lo):
            emap.runs.append(_Run(lo, hi, seq, count))
        return emap
