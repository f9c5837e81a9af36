"""The unique layouts: at most one row per RocksDB key, so writes read first.

``key``     the join key is unique on the side: RocksDB key = prefix + canon,
            value = row.  Probed by multi-get.
``unique``  the side has a unique row key: key = prefix + canon + canon(unique key),
            value = row.  Probed by prefix iteration.

``prefix`` is the 8-byte big-endian xxh3 of the canonical join key ``canon``.  Both read
the stored keys a batch touches before writing, to enforce the declared key, unless an
in-memory set of the stored keys' hashes (:class:`~joinstate._keyset.HashSet64`) proves
a batch of new keys new without reading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate._keyset import HashSet64, has_duplicates, hash64
from joinstate._probe import COST_GET_US, COST_SCAN_US, Entries, Rental
from joinstate.errors import (
    SchemaMismatchError,
    StateCorruptedError,
    UniqueKeyViolationError,
)
from joinstate.keys import KeyCodec, hash_prefix, prefix_bytes, single_plan
from joinstate.layouts.base import RowLayout, describe_key
from joinstate.zset import checked_sum, group_keys

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate.batch import PreparedBatch
    from joinstate.codec import RowCodec
    from joinstate.db import Database
    from joinstate.side import Side
    from joinstate.transaction import Transaction

__all__ = ["COST_UNIQUE_READ_US", "KeyLayout", "UniqueLayout"]

COST_UNIQUE_READ_US = 2.0
"""Estimated µs per row of checking a unique key by multi-get (read, compare, group)."""


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
