"""Row layouts of an index: how rows are keyed, staged, probed and decoded in RocksDB.

Three layouts, chosen by what is known about uniqueness (:attr:`joinstate.Side.layout`):

``key``     the join key is unique on the side: RocksDB key = prefix + canon,
            value = row.  Probed by multi-get.
``unique``  the side has a unique row key: key = prefix + canon + canon(unique key),
            value = row.  Probed by prefix iteration.
``bag``     nothing is unique: key = prefix + canon + xxh3_128(row) + seq,
            value = count + row.

``prefix`` is the 8-byte big-endian xxh3 of the canonical join key ``canon``.

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

The unique layouts read before writing, to enforce the declared key.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate._bytes import Bytes, is_identity
from joinstate._keyset import EntryMap, HashSet64, has_duplicates, hash64
from joinstate._probe import (
    COST_GET_US,
    COST_ROW_US,
    COST_SCAN_US,
    COST_SEEK_US,
    Entries,
    Rental,
)
from joinstate.errors import (
    OverRetractionError,
    SchemaMismatchError,
    StateCorruptedError,
    UniqueKeyViolationError,
    WeightOverflowError,
)
from joinstate.keys import KeyCodec, hash_prefix, prefix_bytes, single_plan
from joinstate.names import is_keyed_cf
from joinstate.zset import (
    checked_add,
    checked_sum,
    checked_sum_by,
    group_keys,
    sort_order,
    sum_by,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate.batch import PreparedBatch
    from joinstate.codec import RowCodec
    from joinstate.db import Database
    from joinstate.side import Side
    from joinstate.transaction import Transaction

__all__ = ["LAYOUTS", "BagLayout", "KeyLayout", "RowLayout", "UniqueLayout", "describe_key"]

COST_UNIQUE_READ_US = 2.0
"""Estimated µs per row of checking a unique key by multi-get (read, compare, group)."""
log = logging.getLogger(__name__)

_SEQ_BYTES = 8  # batch sequence, big-endian so entries of one row sort by batch
_RH_BYTES = 16  # xxh3_128 of the encoded row


def describe_key(batch: PreparedBatch, r: int, cols: Sequence[str]) -> str:
    """The values of ``cols`` in row ``r`` of ``batch``, for error messages."""
    vals = [batch.table.column(c)[r].as_py() for c in cols]
    return repr(vals[0]) if len(vals) == 1 else repr(tuple(vals))


def _i64_column(values: np.ndarray) -> Bytes:
    return Bytes.from_fixed(values.astype("<i8").view(np.uint8).reshape(len(values), 8))


class RowLayout:
    """Base of the three layouts: one column family, the side's codecs, a store.

    Subclasses own how a batch is staged into a :class:`Transaction`, how stored
    entries of some keys are read back (:meth:`probe`), and how values decode.
    """

    name: ClassVar[str]
    counted: ClassVar[bool] = False  # values start with an int64 count
    blind_inserts: ClassVar[bool] = False  # inserts never read the index
    one_entry_per_key: ClassVar[bool] = False  # entries counter == distinct join keys

    def __init__(
        self, store: Database, cf: str, side: str, key: Sequence[str],
        key_codec: KeyCodec, row_codec: RowCodec,
    ) -> None:
        self.store = store
        self.cf = cf
        self.side = side
        self.key = list(key)
        self.key_codec = key_codec
        self.row_codec = row_codec

    # ---- decoding ---------------------------------------------------------------------

    def decode(self, values: list[bytes]) -> tuple[pa.Table, np.ndarray, Bytes]:
        """Stored values -> rows, weights, each row's encoding."""
        packed = Bytes.from_list(values)
        if not self.counted:
            return self.row_codec.decode(packed), np.ones(len(values), np.int64), packed
        if not values:
            return self.row_codec.schema.empty_table(), np.zeros(0, np.int64), packed
        w, enc = _split_counts(packed)
        return self.row_codec.decode(packed, skip=8), w, enc

    def scan(self) -> tuple[pa.Table, np.ndarray, Bytes]:
        """Every stored entry (bag entries unconsolidated): rows, weights, encodings."""
        values = _rocks.iter_values(self.store.cf(self.cf), self.store.path, f"scan {self.cf}")
        return self.decode(values)

    @classmethod
    def for_side(
        cls, store: Database, cf: str, label: str, side: Side, key_codec: KeyCodec,
        row_codec: RowCodec,
    ) -> RowLayout:
        """The layout for ``side``'s rows in family ``cf``."""
        return cls(store, cf, label, side.key, key_codec, row_codec)

    # ---- the layout's own business ----------------------------------------------------

    def check_within(self, batch: PreparedBatch) -> None:
        """Reject a batch that by itself breaks the layout's promise (default: none)."""

    def reset(self) -> None:
        """Forget in-memory state derived from the store (after a failed bulk write)."""

    def save(self) -> None:
        """Keep derived in-memory state beside the store, for the next open (default: none)."""

    def check_derived(self) -> None:
        """Compare derived in-memory state with the index (for ``verify``; default: none).

        Raises :class:`StateCorruptedError` (after rebuilding it) if it disagrees.
        """

    def settle(self) -> None:
        """Finish deferred in-memory work now, so the next batch does not pay for it."""

    def stage(
        self, batch: PreparedBatch, rows: np.ndarray, group_prefix: Bytes, seq: int,
        txn: Transaction,
    ) -> None:
        """Validate ``rows`` of ``batch`` against stored state and stage their writes."""
        raise NotImplementedError

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """Stored entries whose join key is one of the (distinct) query keys."""
        raise NotImplementedError

    def point_cost(self, nq: int, rows_per_key: float) -> float:
        """Estimated µs to probe ``nq`` keys from RocksDB (the probe policy's input)."""
        return nq * (COST_SEEK_US + rows_per_key * COST_ROW_US)

    def distinct_keys(self, entries: int) -> int:
        """Distinct join keys stored (a pass over the family unless known for free)."""
        rows, _, _ = self.scan()
        canon, _ = self.key_codec.encode(rows)
        return len(set(canon.to_list()))

    # ---- shared pieces ----------------------------------------------------------------

    def _over_retraction(self, batch: PreparedBatch, r: int, have: int, would: int) -> None:
        raise OverRetractionError(
            f"{self.side} side: the batch would take the multiplicity of a row with key "
            f"{self.key} = {describe_key(batch, r, self.key)} from {have} to {would}; "
            "retract only rows that are present; nothing of the batch was applied"
        )

    def _prefix_probe(self, qcanon: Bytes, qhash: np.ndarray) -> tuple[Entries, Bytes]:
        """One bounded iteration per distinct key, in key-hash order.

        The iterator stops at the end of the 8-byte prefix; keys that only share the
        hash prefix are filtered after decoding, vectorised.
        """
        nq = len(qhash)
        order = np.argsort(qhash, kind="stable")
        p8 = prefix_bytes(qhash[order]).to_list()
        values, counts_sorted = _rocks.prefix_values(
            self.store.cf(self.cf), p8, self.store.path, f"probe {self.cf}")
        counts = np.zeros(nq, dtype=np.int64)
        counts[order] = counts_sorted
        q = np.repeat(order, counts[order])
        rows, w, enc = self.decode(values)
        if len(q):
            canon, _ = self.key_codec.encode(rows)
            ok = canon.equals(qcanon.take(q))
            if not ok.all():
                keep = np.flatnonzero(ok)
                rows, w, q, enc = rows.take(pa.array(keep)), w[keep], q[keep], enc.take(keep)
        return Entries(rows, w, q), enc


class _UniqueBase(RowLayout):
    """Shared staging of the two unique layouts: at most one row per RocksDB key.

    Uniqueness is checked against an in-memory set of the hashes of every stored key
    (:class:`~joinstate._keyset.HashSet64`) when the index has one: a batch of new
    single-copy rows whose hashes are all absent is written blindly, like bag appends.
    Otherwise (retractions, a hash that is present, no set yet) the keys are read with
    one multi-get.  The set exists from the start for an index that starts empty (the
    usual case in population), and is built by one scan of the index once the reads it
    would have saved reach the scan's price (ski rental, as for the probe cache).
    """

    unique_key: list[str]
    keyset: HashSet64 | None
    _rental: Rental

    def reset(self) -> None:
        """Rebuild the key set from the durable counters."""
        self.init_keyset(self.store.counter(self.cf, "entries"))

    def init_keyset(self, entries: int) -> None:
        """Start the key set: empty and exact for an empty index, else built on demand."""
        self.keyset = HashSet64() if entries == 0 else None
        self._rental = Rental()

    def store_keys(self, batch: PreparedBatch, rows: np.ndarray, group_prefix: Bytes) -> tuple[
        Bytes, np.ndarray
    ]:
        """The RocksDB key of each row, and its 64-bit hash for the key set."""
        raise NotImplementedError

    def check_derived(self) -> None:
        """Every stored key must be in the key set (a stale extra hash only costs a read)."""
        keyset = self.keyset
        if keyset is None:
            return
        stored = self.stored_hashes()
        if not keyset.contains(stored).all():
            rebuilt = HashSet64()
            rebuilt.add(stored)
            self.keyset = rebuilt
            raise StateCorruptedError(
                f"{self.side} side: the in-memory key set of {self.cf} lacked stored keys (it "
                "has been rebuilt); unique-key checks decided by it may have let duplicates "
                "in: restore the store from a copy or repopulate it"
            )

    def stored_hashes(self) -> np.ndarray:
        """The key-set hash of every stored row (one scan of the index)."""
        raise NotImplementedError

    def _keyset_for(self, n: int) -> HashSet64 | None:
        if self.keyset is None:
            entries = max(self.store.counter(self.cf, "entries"), 0)
            if entries <= self.store.options.unique_filter_max_rows and \
                    self._rental.rent(n * COST_UNIQUE_READ_US, entries * COST_SCAN_US):
                keyset = HashSet64()
                keyset.add(self.stored_hashes())
                self.keyset = keyset
        return self.keyset

    def stage(
        self, batch: PreparedBatch, rows: np.ndarray, group_prefix: Bytes, seq: int,
        txn: Transaction,
    ) -> None:
        """Check the declared key and stage the writes (blindly when the key set allows)."""
        skeys_b, h = self.store_keys(batch, rows, group_prefix)
        w = batch.w[rows]
        keyset = self._keyset_for(len(rows)) if (w == 1).all() else self.keyset
        if keyset is not None and (w == 1).all() and not has_duplicates(h) \
                and not keyset.contains(h).any():
            n = len(rows)
            txn.put_many(self.cf, skeys_b, batch.enc.take(rows))
            txn.add(self.cf, "rows", n)
            txn.add(self.cf, "entries", n)
            txn.after_commit(lambda: keyset.add(h))
            return
        txn.note_read()
        skeys = skeys_b.to_list()
        firsts: dict[bytes, int] = {}
        inv = np.fromiter((firsts.setdefault(k, len(firsts)) for k in skeys), np.int64, len(skeys))
        gkeys = list(firsts)
        existing = _rocks.multi_get(self.store.cf(self.cf), gkeys, self.store.path,
                                    f"read {self.cf}")
        enc_list = batch.enc.take(rows).to_list()
        match = np.fromiter(
            (e == existing[g] for e, g in zip(enc_list, inv.tolist(), strict=True)), bool, len(w)
        )
        final = w + match
        bad = np.flatnonzero(final < 0)
        if len(bad):
            self._over_retraction(batch, int(rows[bad[0]]), int(match[bad[0]]),
                                  int(final[bad[0]]))
        present = np.array([v is not None for v in existing], dtype=bool)
        matched_any = np.zeros(len(firsts), dtype=bool)
        matched_any[inv[match]] = True
        survivors = np.bincount(inv, weights=(final >= 1), minlength=len(firsts)).astype(np.int64)
        survivors += present & ~matched_any
        over = np.flatnonzero(final > 1)
        crowded = np.flatnonzero(survivors > 1)
        if len(over) or len(crowded):
            r = rows[over[0]] if len(over) else rows[np.flatnonzero(inv == crowded[0])[0]]
            what = self.unique_key
            raise UniqueKeyViolationError(
                f"{self.side} side: the batch would leave more than one row with unique key "
                f"{what} = {describe_key(batch, int(r), what)}; an update must retract the "
                "old row (weight -1) in the same or an earlier batch; nothing was applied"
            )
        put_rows = np.flatnonzero(final == 1)
        puts = put_rows.tolist()
        txn.put_many(self.cf, [skeys[i] for i in puts], [enc_list[i] for i in puts])
        gone = present & matched_any
        gone[inv[put_rows]] = False
        for gi in np.flatnonzero(gone).tolist():
            txn.delete(self.cf, gkeys[gi])
        txn.add(self.cf, "rows", checked_sum(w, f"rows of {self.cf}"))
        txn.add(self.cf, "entries",
                int((~present[inv[put_rows]]).sum()) - int(gone.sum()))
        if keyset is not None:
            added = h[put_rows]
            txn.after_commit(lambda: keyset.add(added))


class KeyLayout(_UniqueBase):
    """The join key is unique: at most one row per key, probed by multi-get."""

    name = "key"
    one_entry_per_key = True

    def __init__(
        self, store: Database, cf: str, side: str, key: Sequence[str],
        key_codec: KeyCodec, row_codec: RowCodec, unique_key: Sequence[str],
    ) -> None:
        super().__init__(store, cf, side, key, key_codec, row_codec)
        self.unique_key = list(unique_key)
        self.init_keyset(store.counter(cf, "entries"))

    @classmethod
    def for_side(
        cls, store: Database, cf: str, label: str, side: Side, key_codec: KeyCodec,
        row_codec: RowCodec,
    ) -> RowLayout:
        """The key layout of ``side`` (its unique key is within its join key)."""
        return cls(store, cf, label, side.key, key_codec, row_codec, side.unique_key or ())

    def store_keys(self, batch: PreparedBatch, rows: np.ndarray, group_prefix: Bytes) -> tuple[
        Bytes, np.ndarray
    ]:
        """Prefix + canon; the key set holds the join key's xxh3 (the prefix)."""
        return group_prefix, batch.khash[rows]

    def stored_hashes(self) -> np.ndarray:
        """The 8-byte prefixes of the stored keys."""
        keys = _rocks.iter_keys(self.store.cf(self.cf), self.store.path, f"scan {self.cf}")
        if not keys:
            return np.zeros(0, np.uint64)
        heads = b"".join(k[:8] for k in keys)
        return np.frombuffer(heads, dtype=">u8").astype(np.uint64)

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """Stored entries whose join key is one of the (distinct) query keys."""
        prefixes = Bytes.concat_rows([prefix_bytes(qhash), qcanon]).to_list()
        got = _rocks.multi_get(self.store.cf(self.cf), prefixes, self.store.path,
                               f"probe {self.cf}")
        hit = [i for i, v in enumerate(got) if v is not None]
        rows, w, _ = self.decode([got[i] for i in hit])
        return Entries(rows, w, np.asarray(hit, dtype=np.int64))

    def point_cost(self, nq: int, rows_per_key: float) -> float:
        """Estimated µs to probe ``nq`` keys from RocksDB."""
        return nq * COST_GET_US

    def distinct_keys(self, entries: int) -> int:
        """Distinct join keys stored."""
        return entries


class UniqueLayout(_UniqueBase):
    """A unique row key other than the join key: key + unique key, prefix-probed."""

    name = "unique"

    def __init__(
        self, store: Database, cf: str, side: str, key: Sequence[str],
        key_codec: KeyCodec, row_codec: RowCodec, unique_key: Sequence[str],
        unique_codec: KeyCodec,
    ) -> None:
        super().__init__(store, cf, side, key, key_codec, row_codec)
        self.unique_key = list(unique_key)
        self.unique_codec = unique_codec
        self.init_keyset(store.counter(cf, "entries"))

    @classmethod
    def for_side(
        cls, store: Database, cf: str, label: str, side: Side, key_codec: KeyCodec,
        row_codec: RowCodec,
    ) -> RowLayout:
        """The unique layout of ``side``, with a codec for its unique key."""
        uk = list(side.unique_key or ())
        return cls(store, cf, label, side.key, key_codec, row_codec, uk,
                   KeyCodec(uk, single_plan(side.schema, uk), label))

    def store_keys(self, batch: PreparedBatch, rows: np.ndarray, group_prefix: Bytes) -> tuple[
        Bytes, np.ndarray
    ]:
        """Prefix + canon + canon(unique key); hashed together for the key set."""
        ucanon, _ = self.unique_codec.encode(batch.table.take(pa.array(rows)))
        return Bytes.concat_rows([group_prefix, ucanon]), hash64(ucanon, batch.khash[rows])

    def stored_hashes(self) -> np.ndarray:
        """Re-encode the stored rows' keys (one scan and decode of the index)."""
        rows, _, _ = self.scan()
        canon, _ = self.key_codec.encode(rows)
        ucanon, _ = self.unique_codec.encode(rows)
        return hash64(ucanon, hash_prefix(canon))

    def check_within(self, batch: PreparedBatch) -> None:
        """Reject two rows (or two copies of one row) with one unique key in a batch.

        Stored rows are checked against the batch per join key while staging (that read
        is needed anyway).  A row inserted under another join key than a stored row with
        the same unique key is *not* detected across batches: that would need a second
        index (unique key -> join key) and a read per inserted row, doubling the write
        cost of this layout.  The join output stays correct (rows are stored under
        distinct keys and counted as a bag); only the promise goes unchecked.
        """
        for c in self.unique_key:
            if batch.table.column(c).null_count:
                raise SchemaMismatchError(
                    f"{self.side} side: unique key column {c!r} has NULLs; a unique key "
                    "must be non-null"
                )
        ins = np.flatnonzero(batch.w > 0)
        if not len(ins):
            return
        ucanon, _ = self.unique_codec.encode(batch.table.take(pa.array(ins)))
        groups = group_keys(hash64(ucanon), ucanon)
        twice = np.flatnonzero(batch.w[ins] > 1)
        if len(groups) < len(ins) or len(twice):
            if len(twice):
                r = int(ins[twice[0]])
            else:
                dup = np.flatnonzero(groups.first[groups.inv] != np.arange(len(ins)))
                r = int(ins[dup[0]])
            raise UniqueKeyViolationError(
                f"{self.side} side: the batch inserts more than one row with unique key "
                f"{self.unique_key} = {describe_key(batch, r, self.unique_key)}; "
                "nothing was applied"
            )

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """Stored entries whose join key is one of the (distinct) query keys."""
        return self._prefix_probe(qcanon, qhash)[0]


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
            txn.put_many(self.cf, keys, values)
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
        counts, deleted = self._rewrite(qi, keys, new_total, batch, rows[dels], txn)
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
                                   rows[dels], txn)
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
                 batch: PreparedBatch, del_rows: np.ndarray, txn: Transaction
                 ) -> tuple[np.ndarray, int]:
        """Stage the writes of retracted rows whose entries are ``keys`` (grouped by row).

        ``ent_row`` is each entry's position in ``del_rows``, the batch rows retracted.

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
            txn.put_many(self.cf, keys.take(keep).to_list(), values.to_list())
        if len(gone):
            deletes: list[bytes | None] = [None] * len(gone)
            txn.put_many(self.cf, keys.take(gone).to_list(), deletes)
        return counts, len(gone)

    def _totals(self, ent_row: np.ndarray, ent_vals: list[bytes], enc: Bytes, n: int
                ) -> np.ndarray:
        """Summed count of each retracted row's entries, checking each holds that row."""
        if not ent_vals:
            return np.zeros(n, np.int64)
        counts, stored = _split_counts(Bytes.from_list(ent_vals))
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


def _split_counts(values: Bytes) -> tuple[np.ndarray, Bytes]:
    """Bag values -> (int64 counts, the encoded rows after them), vectorised."""
    n = len(values)
    count_pos = values.offsets[:-1, None] + np.arange(8, dtype=np.int64)
    counts = np.ascontiguousarray(values.data[count_pos]).view("<i8").reshape(n)
    keep = np.ones(len(values.data), dtype=bool)
    keep[count_pos] = False
    rows = Bytes(values.data[keep], values.offsets - 8 * np.arange(n + 1, dtype=np.int64))
    return counts.astype(np.int64), rows


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


LAYOUTS: dict[str, type[RowLayout]] = {"key": KeyLayout, "unique": UniqueLayout, "bag": BagLayout}
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

