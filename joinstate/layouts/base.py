"""The base of an index's row layouts: one column family, the side's codecs, a store.

A layout decides how a side's rows are keyed, staged, probed and decoded in RocksDB
(:mod:`joinstate.layouts`); what every layout shares lives here: decoding stored values
(rows, or an int64 count then a row), a full scan, the bounded prefix iteration that
probes layouts with several rows per join key, and the over-retraction error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate._probe import COST_ROW_US, COST_SEEK_US, Entries
from joinstate.errors import OverRetractionError
from joinstate.keys import prefix_bytes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate.batch import PreparedBatch
    from joinstate.codec import RowCodec
    from joinstate.db import Database
    from joinstate.keys import KeyCodec
    from joinstate.side import Side
    from joinstate.transaction import Transaction

__all__ = ["RowLayout", "describe_key", "split_counts"]


def describe_key(batch: PreparedBatch, r: int, cols: Sequence[str]) -> str:
    """The values of ``cols`` in row ``r`` of ``batch``, for error messages."""
    vals = [batch.table.column(c)[r].as_py() for c in cols]
    return repr(vals[0]) if len(vals) == 1 else repr(tuple(vals))


def split_counts(values: Bytes) -> tuple[np.ndarray, Bytes]:
    """Bag values -> (int64 counts, the encoded rows after them), vectorised."""
    n = len(values)
    count_pos = values.offsets[:-1, None] + np.arange(8, dtype=np.int64)
    counts = np.ascontiguousarray(values.data[count_pos]).view("<i8").reshape(n)
    keep = np.ones(len(values.data), dtype=bool)
    keep[count_pos] = False
    rows = Bytes(values.data[keep], values.offsets - 8 * np.arange(n + 1, dtype=np.int64))
    return counts.astype(np.int64), rows


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
        w, enc = split_counts(packed)
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
