"""The bag layout: nothing is unique, so rows are appended as entries of (row, count).

RocksDB key = prefix + canon + xxh3_128(row) + seq, value = count + row (``prefix``: the
8-byte big-endian xxh3 of the canonical join key ``canon``).

The bag layout *appends*: an insert is a blind put of a new entry (no read), because on
the machines this was measured on a bloom-filtered multi-get miss (~1 µs) costs about
half a memtable put (~1.8 µs): reading before every write would add ~60%.  Several
entries of one row may therefore coexist (one per batch that inserted it); readers sum
them.  A retraction must sum the row's entries, check the multiplicity stays >= 0, and
rewrite the first entry with the new count (deleting the others, or all of them at 0).
With the exact in-memory entry map (:class:`~joinstate._keyset.EntryMap`: each entry's
row hash, ``seq`` and count) that is decided without reading: a retraction writes
blindly, like an insert (reading the entries cost ~4 µs per row with their keys known,
~12 µs by seek, against ~1-2 µs for the write).  Without the map (not yet rebuilt after a
crash or a damaged map file) the entries are read by one seek per row.  ``seq`` is the
index's batch counter, so the keys of one batch never collide with earlier ones.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate._bytes import Bytes, is_identity
from joinstate._keyset import EntryMap
from joinstate._probe import COST_SCAN_US, COST_SEEK_US, Entries, Rental
from joinstate.errors import StateCorruptedError, WeightOverflowError
from joinstate.layouts.base import RowLayout, split_counts
from joinstate.names import is_keyed_cf
from joinstate.transaction import ABSENT
from joinstate.zset import checked_add, checked_sum, checked_sum_by, sort_order, sum_by

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate.batch import PreparedBatch
    from joinstate.codec import RowCodec
    from joinstate.db import Database
    from joinstate.keys import KeyCodec
    from joinstate.transaction import Transaction

__all__ = ["BagLayout"]

log = logging.getLogger(__name__)

_SEQ_BYTES = 8  # batch sequence, big-endian so entries of one row sort by batch
_RH_BYTES = 16  # xxh3_128 of the encoded row


def _i64_column(values: np.ndarray) -> Bytes:
    return Bytes.from_fixed(values.astype("<i8").view(np.uint8).reshape(len(values), 8))


class BagLayout(RowLayout):
    """Nothing is unique: append-only entries of (row, count), summed by readers.

    Retractions are decided by an exact in-memory :class:`~joinstate._keyset.EntryMap`
    (every entry's row hash, batch sequence and count) when the index has one: the
    totals are checked in memory and the writes are blind (a delete of each exhausted
    entry, a rewrite of the count in place otherwise), so a retraction costs what an
    insert costs.  Without a map, the entries are found by one iterator seek per row and
    checked against the retracted rows.  The map is complete from the start for an
    index that starts empty (population), is saved when the store closes and loaded when
    it reopens *if* it passes every check against the store (see :meth:`_load_map`), and
    is otherwise rebuilt by one scan once the seeks it would have saved reach the scan's
    price (ski rental).
    """

    name = "bag"
    counted = True
    blind_inserts = True

    def __init__(
        self, store: Database, cf: str, side: str, key: Sequence[str],
        key_codec: KeyCodec, row_codec: RowCodec,
    ) -> None:
        super().__init__(store, cf, side, key, key_codec, row_codec)
        self.emap: EntryMap | None = None
        self._rental = Rental()
        self.reset()

    # ---- the entry map ----------------------------------------------------------------

    def _stamp(self) -> list[int]:
        # Every batch bumps the rows family's sequence, so (seq, entries, rows) names one
        # state of this store; the RocksDB identity names the store (a derived folder
        # copied next to another store is not taken for its own).
        rows_cf = self.cf[: -len(".nulls")] if self.cf.endswith(".nulls") else self.cf
        return [self.store.counter(rows_cf, "seq"), self.store.counter(self.cf, "entries"),
                self.store.counter(self.cf, "rows"), _identity(self.store)]

    def reset(self) -> None:
        """Start the entry map: empty for an empty index, the saved copy, or none."""
        self._rental = Rental()
        self.emap = None
        if self.store.counter(self.cf, "entries") == 0:
            self.emap = EntryMap()
            return
        self.emap = self._load_map()

    def _load_map(self) -> EntryMap | None:
        """The map saved at the last close, if it is provably the map of this state.

        The map decides retractions without reading, so a wrong one would corrupt the
        index: it is taken only if the file is intact (the archive's CRC-32 of every
        array), was saved for exactly these counters of this RocksDB store, and agrees
        with the counters (as many entries, the same summed count, every count
        positive, sorted, no sequence from the future).  Anything else means a rebuild
        by scan when retractions next need it.
        """
        name = _map_name(self.cf)
        try:
            saved = self.store.load_arrays(name, self._stamp())
        except Exception as exc:  # zipfile.BadZipFile on a CRC mismatch, and the like
            log.warning("ignoring the saved entry map of %s: %s", self.cf, exc)
            return None
        if saved is None:
            return None
        problem = _map_problem(saved, self.store.counter(self.cf, "entries"),
                               self.store.counter(self.cf, "rows"), self._stamp()[0])
        if problem is not None:
            log.warning("ignoring the saved entry map of %s: %s", self.cf, problem)
            return None
        return EntryMap.from_sorted(saved["lo"], saved["hi"], saved["seq"], saved["count"])

    def settle(self) -> None:
        """Sort the entry map's queued appends in (before the live phase)."""
        if self.emap is not None:
            self.emap.settle()

    def save(self) -> None:
        """Keep the entry map beside the store (called when the store closes)."""
        if self.emap is not None and len(self.emap):
            lo, hi, seq, count = self.emap.arrays()
            self.store.save_arrays(_map_name(self.cf), self._stamp(), lo=lo, hi=hi, seq=seq,
                                   count=count)

    def scan_map(self) -> EntryMap:
        """An exact entry map read off the index: keys and the count at each value's head."""
        keys, heads = _rocks.iter_keys_heads(self.store.cf(self.cf), 8, self.store.path,
                                             f"scan {self.cf}")
        lo, hi, seq = _key_tails(Bytes.from_list(keys))
        count = np.frombuffer(b"".join(heads), "<i8").astype(np.int64)
        order = np.argsort(lo, kind="stable")
        return EntryMap.from_sorted(lo[order], hi[order], seq[order], count[order])

    def check_derived(self) -> None:
        """Compare the in-memory map with the index; on any difference rebuild it and raise.

        For :meth:`joinstate.Join.verify`: retractions trusted the map, so a map that
        disagrees with the stored entries means their outputs cannot be trusted either.
        """
        if self.emap is None:
            return
        truth = self.scan_map()
        mine = self.emap.arrays()
        want = truth.arrays()
        if _entry_set(*mine) != _entry_set(*want):
            self.emap = truth
            raise StateCorruptedError(
                f"{self.side} side: the in-memory entry map of {self.cf} disagreed with the "
                "stored entries (it has been rebuilt from them); retractions decided by it "
                "may have been wrong: restore the store from a copy or repopulate it"
            )

    def _map_for(self, n: int) -> EntryMap | None:
        if self.emap is None:
            entries = max(self.store.counter(self.cf, "entries"), 0)
            if entries <= self.store.options.unique_filter_max_rows and \
                    self._rental.rent(n * COST_SEEK_US, entries * COST_SCAN_US):
                self.emap = self.scan_map()
        return self.emap

    # ---- staging ----------------------------------------------------------------------

    def stage(
        self, batch: PreparedBatch, rows: np.ndarray, group_prefix: Bytes, seq: int,
        txn: Transaction,
    ) -> None:
        """Append inserts blindly; check retractions against the map (or by seeks)."""
        rh = batch.rh.take(rows)
        base = Bytes.concat_rows([group_prefix, rh])
        # Write in key order: RocksDB's memtable inserts a sorted batch ~1.5x faster
        # (each insert starts where the last one ended), and reads walk forward.
        order = sort_order(_head64(base))
        if not is_identity(order, len(order)):
            rows, rh, base = rows[order], rh.take(order), base.take(order)
        w = batch.w[rows]
        halves = np.ascontiguousarray(rh.matrix()).view("<u8")
        lo, hi = halves[:, 0], halves[:, 1]
        ins = np.flatnonzero(w > 0)
        dels = np.flatnonzero(w < 0)
        emap = self._map_for(len(dels)) if len(dels) else self.emap
        entries_delta = 0
        if len(ins):
            keys = Bytes.concat_rows([base.take(ins), _seq_column(np.full(len(ins), seq))])
            values = Bytes.concat_rows([_i64_column(w[ins]), batch.enc.take(rows[ins])])
            # New keys: ``seq`` is this batch's number, above every stored entry's.
            txn.put_many(self.cf, keys, values, prior=ABSENT)
            entries_delta += len(ins)
        if len(dels):
            txn.note_read()
            if emap is not None:
                entries_delta += self._retract_by_map(batch, rows, base, w, lo, hi, dels,
                                                      emap, txn)
            else:
                entries_delta += self._retract_by_seek(batch, rows, base, w, dels, txn)
        if len(ins) and emap is not None:
            added = (lo[ins], hi[ins], np.full(len(ins), seq, np.uint64), w[ins])
            txn.after_commit(lambda: emap.add(*added))
        txn.add(self.cf, "rows", checked_sum(w, f"rows of {self.cf}"))
        txn.add(self.cf, "entries", entries_delta)

    def _retract_by_map(
        self, batch: PreparedBatch, rows: np.ndarray, base: Bytes, w: np.ndarray,
        lo: np.ndarray, hi: np.ndarray, dels: np.ndarray, emap: EntryMap, txn: Transaction,
    ) -> int:
        """Retract ``dels`` without reading: totals from the map, blind writes."""
        found = emap.lookup(lo[dels], hi[dels])
        totals = checked_sum_by(found.qi, found.count, len(dels),
                                f"multiplicity of a row in {self.cf}")
        new_total = self._check_totals(batch, rows, dels, totals, w)
        order = sort_order(found.qi)  # dels are in key order: so are these
        qi = found.qi[order]
        seq_col = _seq_column(found.seq[order])
        keys = Bytes.concat_rows([base.take(dels[qi]), seq_col])
        # What each entry holds, for an undo capture: its count (exact in the map), then
        # the row, whose encoding the entry's row hash is the hash of.
        held = Bytes.concat_rows([_i64_column(found.count[order]),
                                  batch.enc.take(rows[dels[qi]])]) \
            if txn.undo is not None else None
        counts, deleted = self._rewrite(qi, keys, new_total, batch, rows[dels], txn, held)
        in_found_order = np.empty_like(counts)
        in_found_order[order] = counts
        txn.after_commit(lambda: emap.set_counts(found, in_found_order))
        return -deleted

    def _retract_by_seek(
        self, batch: PreparedBatch, rows: np.ndarray, base: Bytes, w: np.ndarray,
        dels: np.ndarray, txn: Transaction,
    ) -> int:
        """Retract ``dels`` by reading each row's entries (one seek per row, in key order)."""
        ent_row, ent_keys, ent_vals = _flatten(self._entries_by_seek(base.take(dels).to_list()))
        totals = self._totals(ent_row, ent_vals, batch.enc.take(rows[dels]), len(dels))
        new_total = self._check_totals(batch, rows, dels, totals, w)
        _, deleted = self._rewrite(ent_row, Bytes.from_list(ent_keys), new_total, batch,
                                   rows[dels], txn, Bytes.from_list(ent_vals))
        return -deleted

    def _check_totals(self, batch: PreparedBatch, rows: np.ndarray, dels: np.ndarray,
                      totals: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Each retracted row's multiplicity after the batch; refuses one below zero."""
        new_total = checked_add(totals, w[dels], f"multiplicity of a row in {self.cf}")
        bad = np.flatnonzero(new_total < 0)
        if len(bad):
            j = int(bad[0])
            self._over_retraction(batch, int(rows[dels[j]]), int(totals[j]),
                                  int(new_total[j]))
        return new_total

    def _rewrite(self, ent_row: np.ndarray, keys: Bytes, new_total: np.ndarray,
                 batch: PreparedBatch, del_rows: np.ndarray, txn: Transaction,
                 held: Bytes | None) -> tuple[np.ndarray, int]:
        """Stage the writes of retracted rows whose entries are ``keys`` (grouped by row).

        ``ent_row`` is each entry's position in ``del_rows``, the batch rows retracted;
        ``held`` what each entry holds now, if known (declared to the transaction: an
        undo capture need not read it again).

        A row's first entry keeps its key and gets the new count, when that is > 0; every
        other entry is deleted.  Rewriting in place instead of appending a merged entry
        saves a tombstone per partly retracted row.  Returns each entry's new count (0:
        deleted) and how many were deleted.
        """
        n = len(ent_row)
        first = np.ones(n, dtype=bool)
        first[1:] = ent_row[1:] != ent_row[:-1]
        counts = np.where(first, new_total[ent_row], 0)
        keep = np.flatnonzero(counts > 0)
        gone = np.flatnonzero(counts <= 0)
        counts[gone] = 0
        if len(keep):
            values = Bytes.concat_rows([_i64_column(counts[keep]),
                                        batch.enc.take(del_rows[ent_row[keep]])])
            txn.put_many(self.cf, keys.take(keep).to_list(), values.to_list(),
                         prior=None if held is None else list(held.take(keep).to_list()))
        if len(gone):
            deletes: list[bytes | None] = [None] * len(gone)
            txn.put_many(self.cf, keys.take(gone).to_list(), deletes,
                         prior=None if held is None else list(held.take(gone).to_list()))
        return counts, len(gone)

    def _totals(self, ent_row: np.ndarray, ent_vals: list[bytes], enc: Bytes, n: int
                ) -> np.ndarray:
        """Summed count of each retracted row's entries, checking each holds that row."""
        if not ent_vals:
            return np.zeros(n, np.int64)
        counts, stored = split_counts(Bytes.from_list(ent_vals))
        if not stored.equals(enc.take(ent_row)).all():
            msg = (f"{self.side} side: xxh3_128 collision or corrupt entry in {self.cf}; "
                   "verify the store (StateStore.verify())")
            raise StateCorruptedError(msg)
        return checked_sum_by(ent_row, counts, n, f"multiplicity of a row in {self.cf}")

    def _entries_by_seek(self, bases: list[bytes]) -> list[list[tuple[bytes, bytes]]]:
        return _rocks.range_entries(self.store.cf(self.cf), bases, self.store.path,
                                    f"read {self.cf}", keyed=is_keyed_cf(self.cf))

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """Stored entries whose join key is one of the (distinct) query keys."""
        entries, enc = self._prefix_probe(qcanon, qhash)
        if len(entries.w) > 1:
            return _merge_adjacent_entries(entries, enc)
        return entries

    def distinct_keys(self, entries: int) -> int:
        """Distinct join keys stored."""
        # Keys end in a fixed row hash + batch sequence, so the join-key part is read off
        # the RocksDB keys without decoding a single row.
        keys = _rocks.iter_keys(self.store.cf(self.cf), self.store.path, f"scan {self.cf}")
        return len({k[: -(_RH_BYTES + _SEQ_BYTES)] for k in keys})


def _flatten(found: list[list[tuple[bytes, bytes]]]) -> tuple[np.ndarray, list[bytes],
                                                              list[bytes]]:
    """Per-row lists of (key, value) -> flat (row of each entry, keys, values)."""
    lengths = np.fromiter((len(f) for f in found), np.int64, len(found))
    rows = np.repeat(np.arange(len(found), dtype=np.int64), lengths)
    keys = [k for f in found for k, _ in f]
    vals = [v for f in found for _, v in f]
    return rows, keys, vals


def _map_name(cf: str) -> str:
    return "entry-map-" + cf


def _identity(store: Database) -> int:
    """A 63-bit hash of the RocksDB directory's IDENTITY file (0 if it has none)."""
    import xxhash

    try:
        raw = (store.path / "IDENTITY").read_bytes()
    except OSError:
        return 0
    return xxhash.xxh3_64_intdigest(raw.strip()) >> 1


def _map_problem(saved: dict[str, np.ndarray], entries: int, rows: int, seq: int
                 ) -> str | None:
    """Why a loaded entry map cannot be the map of an index with these counters, or None."""
    cols = ("lo", "hi", "seq", "count")
    if any(c not in saved for c in cols):
        return "it lacks arrays (an older format)"
    lo, hi, sq, count = (saved[c] for c in cols)
    if any(a.ndim != 1 or len(a) != entries for a in (lo, hi, sq, count)):
        return f"it does not hold the index's {entries} entries"
    if lo.dtype != np.uint64 or hi.dtype != np.uint64 or sq.dtype != np.uint64 or \
            count.dtype != np.int64:
        return "its arrays have the wrong types"
    if entries == 0:
        return None
    if (count <= 0).any():
        return "it holds an entry without a positive count"
    if sq.max() > max(seq, 0):
        return "it holds an entry of a batch the index has not seen"
    if (lo[1:] < lo[:-1]).any():
        return "it is not sorted"
    try:
        total = checked_sum(count, "entry map counts")
    except WeightOverflowError:
        total = None
    if total != rows:
        return f"its counts sum to {total}, the index holds {rows} rows"
    same = np.flatnonzero(lo[1:] == lo[:-1])
    if len(same) and ((hi[same] == hi[same + 1]) & (sq[same] == sq[same + 1])).any():
        return "it holds an entry twice"
    return None


def _entry_set(lo: np.ndarray, hi: np.ndarray, seq: np.ndarray, count: np.ndarray) -> bytes:
    """A canonical byte form of a set of entries (for comparing two maps)."""
    order = np.lexsort((count, seq, hi, lo))
    return np.stack([lo[order], hi[order], seq[order], count[order].view(np.uint64)]).tobytes()


def _seq_column(seq: np.ndarray) -> Bytes:
    """Batch sequences as the 8 big-endian bytes that end a bag key."""
    return Bytes.from_fixed(np.ascontiguousarray(seq.astype(">u8")).view(np.uint8)
                            .reshape(len(seq), _SEQ_BYTES))


def _head64(keys: Bytes) -> np.ndarray:
    """The first 8 bytes of every key (each at least 8 long) as a big-endian integer."""
    if keys.width is not None:
        head = keys.matrix()[:, :8]
    else:
        head = keys.data[keys.offsets[:-1, None] + np.arange(8, dtype=np.int64)]
    return np.ascontiguousarray(head).view(">u8").reshape(len(keys))


def _key_tails(keys: Bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row hash low, high 64 bits, batch sequence) of bag keys, off their 24-byte tail."""
    n = len(keys)
    if not n:
        z = np.zeros(0, np.uint64)
        return z, z, z
    ends = keys.offsets[1:]
    pos = ends[:, None] - np.arange(_RH_BYTES + _SEQ_BYTES, 0, -1, dtype=np.int64)
    tail = np.ascontiguousarray(keys.data[pos])
    halves = np.ascontiguousarray(tail[:, :_RH_BYTES]).view("<u8")
    seq = np.ascontiguousarray(tail[:, _RH_BYTES:]).view(">u8").reshape(n).astype(np.uint64)
    return halves[:, 0].copy(), halves[:, 1].copy(), seq


"""Layout class by :attr:`joinstate.Side.layout`."""


def _merge_adjacent_entries(entries: Entries, enc: Bytes) -> Entries:
    """Sum the entries of one row (bag rows inserted by several batches).

    They are adjacent in key order (key = prefix + canon + row hash + seq), so comparing
    neighbours suffices; merging keeps push outputs consolidated (one output row per
    distinct pair) instead of repeating a row once per batch that inserted it.  The sums
    are bounded by the side's rows counter, which is checked, so they cannot overflow.
    """
    rows, w, q = entries.rows, entries.w, entries.q
    n = len(w)
    same = np.zeros(n, dtype=bool)
    same[1:] = (q[1:] == q[:-1]) & enc.take(np.arange(1, n)).equals(enc.take(np.arange(n - 1)))
    if not same.any():
        return entries
    first = np.flatnonzero(~same)
    gid = np.cumsum(~same) - 1
    return Entries(rows.take(pa.array(first)), sum_by(gid, w, len(first)), q[first])
