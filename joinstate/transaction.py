r"""A transaction: one atomic unit of work against a state store.

Everything one push changes — rows of every index it touches, counters, commit records —
is staged here first and written by :meth:`Transaction.commit` as one RocksDB
``WriteBatch``: all of it or none of it.  Staging instead of writing as we go is what
lets validation (over-retraction, unique keys, weight overflow, commit conflicts) finish
before anything reaches RocksDB, and it is what lets one push span several indexes (a
pipeline source feeding several operators).

A bulk loader may take the writes instead (``commit(sink=...)``), e.g. to write them as
sorted SST files for ingestion: the sink gets the data blocks *and* the ``__meta__``
records (counters, progress markers, commit records) that describe them, and must make
both durable together (:meth:`joinstate.Database.ingest_durably` does), so that counters
never run ahead of, or behind, the data they count.

**Blind inserts as SST files** (opt-in: :meth:`Transaction.ingest_into`, used by
population pushes).  The inserts staged for the named families, when a block holds only
keys new by construction (``prior=ABSENT``, no deletes) and the family gets at least
``min_rows`` of them, are written as one sorted SST file per family instead of going
into the WriteBatch; the batch (everything else, with the counters that count those
rows) is written first, holding an intent that names the files, then the files are
ingested (:meth:`joinstate.db.Database.write_then_ingest`): a crash anywhere is finished
or undone at the next open.  Nothing reads the files' keys within the transaction (its
reads go to the store, never to its own staged writes), so the result is the same
state; what it saves is the memtable insert, the flush and the compactions of rows
that a population writes once.  Off while undo capture is on.

Status machine: ``open`` -> ``committed`` | ``failed``.  A transaction is used once.

**Undo capture** (opt-in: ``Transaction(store, undo=(prefix, note))``, or every
transaction committed while :meth:`joinstate.db.Database.capturing_undo` is in force).
The commit then reads, with one multi-get per column family (which releases the GIL),
the current value of every key it is about to write — data, counters, ``__meta__``
records — and puts them, as one *undo record*, into the same WriteBatch, under
``__meta__`` key ``undo\x00<tag>\x00<8-byte sequence>``.  :func:`apply_undo` writes the
prior values back (a key that was absent is deleted) for every record of a tag, newest
first, and removes the records, all in one WriteBatch: the store then holds exactly the
bytes it held before the tagged transactions.  A writer that knows what its keys held
declares it (``put_many(..., prior=...)``) and they are not read again: an index's
appended entries and a source's row-record values, whose keys carry a batch number no
earlier write used (:data:`ABSENT`); the entries a retraction rewrites, found in the
bag index's entry map or read; an aggregate's groups, read to fold the change in.  In
a small operation these are most of the keys written.  :func:`drop_undo` forgets the
records once what they undo is final.  A driver uses this to make a change spread over
several stores all-or-nothing (:mod:`spark_io.operation`).  Undo is only for WriteBatch
commits; a bulk sink is refused while capture is on.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import TYPE_CHECKING, Final, Literal, Protocol, cast

import numpy as np
import pyarrow as pa
import rocksdict as rd

from joinstate import _rocks, sstfiles
from joinstate._bytes import Bytes
from joinstate.errors import JoinStateError, StateCorruptedError
from joinstate.intents import STAGING, Record, fill_records
from joinstate.names import META_CF, UNDO_PREFIX, counter_key, undo_prefix
from joinstate.zset import checked_int

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from joinstate.db import Database

__all__ = [
    "ABSENT",
    "BulkSink",
    "Prior",
    "Record",
    "Transaction",
    "WriteBlock",
    "apply_undo",
    "drop_undo",
    "undo_tags",
]

_BLOCK_ROWS = 4096

INGEST_MIN_ROWS: Final = 50_000
"""Fewest blind inserts into one family that :meth:`Transaction.ingest_into` writes as an
SST file: ingesting a file costs a few milliseconds, a memtable insert ~1 µs a row."""

ABSENT: Final = "absent"
"""``put_many(..., prior=ABSENT)``: no key of the block exists before the transaction."""

Prior = Literal["absent"] | list[bytes | None] | None
"""What a block's keys held before the transaction: :data:`ABSENT`, one value (None:
absent) per key, or None (unknown)."""


class WriteBlock:
    """Staged writes to one column family; a ``None`` value deletes its key.

    An index stages a batch's inserts *packed* (all keys in one buffer, all values in
    another), and Python ``bytes`` objects are made only when something asks for them:
    :attr:`keys` / :attr:`values` for a ``WriteBatch``, or never, when a bulk loader takes
    :meth:`arrow` and sorts the run itself.  Holding a whole population run as one
    ``bytes`` object per key and per value costs ~150 bytes a row of fresh heap; the page
    faults of first-touching it were most of a load's system time (~3x the faults).
    """

    __slots__ = ("_keys", "_values", "column_family", "prior")

    def __init__(self, column_family: str, keys: list[bytes] | Bytes,
                 values: list[bytes | None] | Bytes, prior: Prior = None) -> None:
        if len(keys) != len(values):
            msg = f"{column_family}: {len(keys)} keys but {len(values)} values"
            raise JoinStateError(msg)
        if isinstance(prior, list) and len(prior) != len(keys):
            msg = f"{column_family}: {len(keys)} keys but {len(prior)} prior values"
            raise JoinStateError(msg)
        self.column_family = column_family
        self._keys = keys
        self._values = values
        # What the keys held before the transaction, when the writer knows it (module
        # docstring, *Undo capture*); None: unknown, read by the undo capture.
        self.prior = prior

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"WriteBlock({self.column_family!r}, {len(self)} rows)"

    @property
    def keys(self) -> list[bytes]:
        """The keys as ``bytes`` objects (made on first use when packed)."""
        if isinstance(self._keys, Bytes):
            self._keys = self._keys.to_list()
        return self._keys

    @property
    def values(self) -> list[bytes | None]:
        """The values as ``bytes`` objects, ``None`` for a delete (made on first use)."""
        if isinstance(self._values, Bytes):
            self._values = cast("list[bytes | None]", self._values.to_list())
        return self._values

    @property
    def deletes(self) -> bool:
        """Whether any write of the block is a delete (packed blocks never are)."""
        return not isinstance(self._values, Bytes) and None in self._values

    def arrow(self) -> tuple[pa.Array, pa.Array]:
        """Keys and values as ``large_binary`` Arrow arrays (zero-copy when packed).

        For a block without deletes (:attr:`deletes`); a bulk loader concatenates,
        sorts and writes them without making one Python object per row.
        """
        if self.deletes:
            msg = f"{self.column_family}: a block with deletes has no Arrow form"
            raise JoinStateError(msg)
        return _arrow(self._keys), _arrow(self._values)

    def _appendable(self) -> bool:
        return isinstance(self._keys, list) and isinstance(self._values, list) \
            and len(self._keys) < _BLOCK_ROWS and self.prior is None

    def prior_values(self) -> list[bytes | None]:
        """The values the keys held before the transaction, as declared (not None)."""
        if self.prior is None:
            msg = f"{self.column_family}: the prior values of this block are unknown"
            raise JoinStateError(msg)
        return [None] * len(self) if self.prior == ABSENT else self.prior

    def _append(self, key: bytes, value: bytes | None) -> None:
        cast("list[bytes]", self._keys).append(key)
        cast("list[bytes | None]", self._values).append(value)


def _arrow(column: list[bytes] | list[bytes | None] | Bytes) -> pa.Array:
    if isinstance(column, Bytes):
        return column.arrow()
    return pa.array(column, type=pa.large_binary())


class BulkSink(Protocol):
    """Takes a transaction's writes instead of a ``WriteBatch`` (bulk loading).

    ``records`` are the ``__meta__`` writes that describe ``blocks`` (absolute counter
    values, markers); the sink makes them durable together with the blocks, later
    writes of a key superseding earlier ones.  Raising refuses the transaction: then
    nothing of it is kept and the counters do not change.
    """

    def __call__(self, blocks: Sequence[WriteBlock], records: Sequence[Record]) -> None:
        """Keep ``blocks`` and ``records`` until they are made durable together."""


class Transaction:
    """Staged writes per column family, counter deltas and ``__meta__`` records.

    Obtain one from :meth:`joinstate.StateStore.transaction`; stage with :meth:`put_many`,
    :meth:`put`, :meth:`delete`, :meth:`add` and :meth:`record`; then :meth:`commit`.
    """

    __slots__ = ("_after", "_counters", "_ingest", "_records", "blocks", "read_state", "state",
                 "store", "undo")

    def __init__(self, store: Database, *, undo: tuple[bytes, bytes] | None = None) -> None:
        self.store = store
        # (key prefix, note) of the undo record this commit writes (module docstring).
        self.undo = undo if undo is not None else store.undo_capture
        self.blocks: list[WriteBlock] = []
        self._counters: dict[tuple[str, str], int] = {}
        self._records: list[Record] = []
        self.state: Literal["open", "committed", "failed"] = "open"
        self.read_state = False
        self._after: list[Callable[[], object]] = []
        self._ingest: tuple[frozenset[str], int] | None = None

    # ---- staging ----------------------------------------------------------------------

    def put_many(self, cf: str, keys: list[bytes] | Bytes,
                 values: list[bytes] | list[bytes | None] | Bytes, *,
                 prior: Prior = None) -> None:
        """Stage puts of ``keys`` -> ``values`` into ``cf`` (a None value deletes its key).

        The lists (or packed strings) are kept, not copied.  ``prior``: what the keys
        hold *before this transaction*, if the caller knows it for certain (it read
        them in this transaction, or the keys are new by construction: :data:`ABSENT`);
        the undo capture then records it instead of reading the keys again.  A wrong
        ``prior`` makes a rollback restore wrong bytes: declare only what is proven.
        """
        if len(keys):
            self.blocks.append(WriteBlock(cf, keys, cast("list[bytes | None] | Bytes", values),
                                          prior))

    def put(self, cf: str, key: bytes, value: bytes | None) -> None:
        """Stage one put (``value`` None: a delete)."""
        last = self.blocks[-1] if self.blocks else None
        if last is not None and last.column_family == cf and last._appendable():  # noqa: SLF001
            last._append(key, value)  # noqa: SLF001 (the block class is this module's)
        else:
            self.blocks.append(WriteBlock(cf, [key], [value]))

    def delete(self, cf: str, key: bytes) -> None:
        """Stage a delete of ``key`` in ``cf``."""
        self.put(cf, key, None)

    def add(self, cf: str, counter: str, delta: int) -> None:
        """Stage ``delta`` onto the counter ``counter`` of column family ``cf``."""
        if delta:
            k = (cf, counter)
            self._counters[k] = self._counters.get(k, 0) + int(delta)

    def record(self, key: bytes, value: bytes | None) -> None:
        """Stage a ``__meta__`` record (a commit record, a phase); None deletes it."""
        self._records.append((key, value))

    def note_read(self) -> None:
        """Record that staging read stored state.

        A bulk sink cannot take such a transaction: writes still pending in the sink
        are invisible to reads, so the check could have missed them.
        """
        self.read_state = True

    def ingest_into(self, families: Collection[str], min_rows: int | None = None) -> None:
        """Write this transaction's blind inserts into ``families`` as ingested SST files.

        See the module docstring.  ``min_rows``: a family given fewer such rows takes
        them through the WriteBatch (a file per small write would cost more than it saves;
        default :data:`INGEST_MIN_ROWS`).
        """
        self._ingest = (frozenset(families), INGEST_MIN_ROWS if min_rows is None else min_rows)

    def _ingestible(self) -> dict[str, list[int]]:
        """Per family, the positions of the blocks to write as an SST file."""
        if self._ingest is None or self.undo is not None:
            return {}
        families, min_rows = self._ingest
        found: dict[str, list[int]] = {}
        for i, block in enumerate(self.blocks):
            if block.column_family in families and block.prior == ABSENT \
                    and not block.deletes:
                found.setdefault(block.column_family, []).append(i)
        return {cf: ix for cf, ix in found.items()
                if sum(len(self.blocks[i]) for i in ix) >= min_rows}

    def _write_with_files(self, records: Sequence[Record], chosen: dict[str, list[int]]
                          ) -> None:
        """The commit of :meth:`ingest_into`: SST files, then the batch, then ingestion."""
        store = self.store
        folder = store.path / STAGING
        files: dict[str, list[str]] = {}
        try:
            with _rocks.rocks_errors(store.path, "write SST files of a transaction"):
                folder.mkdir(parents=True, exist_ok=True)
                for cf, positions in chosen.items():
                    parts = [self.blocks[i].arrow() for i in positions]
                    path = folder / f"{uuid.uuid4().hex}.sst"
                    files[cf] = [str(path)]
                    sstfiles.write_sst(store.cf_options(cf), path,
                                       pa.concat_arrays([k for k, _ in parts]),
                                       pa.concat_arrays([v for _, v in parts]))
            skip = frozenset(i for positions in chosen.values() for i in positions)
            store.write_then_ingest(self._write_batch(records, skip), files)
        finally:  # files not moved for ingestion (a failure before the batch) are junk
            for paths in files.values():
                for f in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(f)

    def after_commit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once the transaction has committed (in-memory bookkeeping)."""
        self._after.append(fn)

    # ---- commit -----------------------------------------------------------------------

    def _write_batch(self, records: Sequence[Record], skip: frozenset[int] = frozenset()
                     ) -> rd.WriteBatch:
        store = self.store
        wb = rd.WriteBatch(raw_mode=True)
        for i, block in enumerate(self.blocks):
            if i in skip:
                continue
            # Always name the family's handle: a WriteBatch put without one goes to the
            # default family.
            h = store.handle(block.column_family)
            keys, values = block.keys, block.values
            if block.deletes:
                for k, v in zip(keys, values, strict=True):
                    if v is None:
                        wb.delete(k, h)
                    else:
                        wb.put(k, v, h)
            else:
                put = wb.put
                for k, v in zip(keys, values, strict=True):
                    put(k, v, h)
        fill_records(wb, store.handle(META_CF), records)
        return wb

    def _undo_record(self, records: Sequence[Record], note: bytes) -> bytes:
        """The prior value of every key this commit writes, as one undo record.

        Keys whose prior value their block declares (:meth:`put_many`'s ``prior``) are
        not read; the others are, with one multi-get per column family.
        """
        store = self.store
        by_cf: dict[str, list[bytes]] = {}
        known: dict[str, tuple[list[bytes], list[bytes | None]]] = {}
        for block in self.blocks:
            if block.prior is None:
                by_cf.setdefault(block.column_family, []).extend(block.keys)
            else:
                ks, vs = known.setdefault(block.column_family, ([], []))
                ks.extend(block.keys)
                vs.extend(block.prior_values())
        by_cf.setdefault(META_CF, []).extend(k for k, _ in records)
        families = sorted({f for f, ks in by_cf.items() if ks} | set(known))
        cf_ids: list[np.ndarray] = []
        keys: list[bytes] = []
        values: list[bytes | None] = []
        for i, family in enumerate(families):
            wanted = by_cf.get(family, [])
            got = _rocks.multi_get(store.cf(family), wanted, store.path,
                                   f"read what {family!r} held (undo capture)"
                                   ) if wanted else []
            told_keys, told = known.get(family, ([], []))
            cf_ids.append(np.full(len(wanted) + len(told_keys), i, dtype=np.int32))
            keys.extend(wanted)
            values.extend(got)
            keys.extend(told_keys)
            values.extend(told)
        cf = np.concatenate(cf_ids) if cf_ids else np.zeros(0, dtype=np.int32)
        return _undo_table(families, cf, keys, values, note)

    def commit(self, sink: BulkSink | None = None) -> None:
        """Write everything staged, atomically; publish the new counters on success.

        Counters are checked against the int64 range before anything is written
        (:class:`~joinstate.errors.WeightOverflowError`).  With ``sink``, the data blocks
        and the ``__meta__`` records go to the sink instead (see :class:`BulkSink`).
        """
        if self.state != "open":
            msg = f"transaction already {self.state}"
            raise JoinStateError(msg)
        store = self.store
        try:
            new: dict[bytes, int] = {}
            for (cf, name), delta in self._counters.items():
                value = store.counter(cf, name) + delta
                new[counter_key(cf, name)] = checked_int(value, f"counter {name!r} of {cf}")
            records: list[Record] = [
                (key, value.to_bytes(8, "big", signed=True)) for key, value in new.items()
            ]
            records += self._records
            if sink is not None:
                if self.undo is not None:
                    msg = ("undo capture is on, but a bulk sink takes this transaction's "
                           "writes: undo needs a WriteBatch; nothing was written")
                    raise JoinStateError(msg)
                sink(self.blocks, records)
            else:
                # Families this batch writes that are still to be created are created
                # first (one re-open): the batch then holds live handles only.
                store.create_pending({b.column_family for b in self.blocks})
                chosen = self._ingestible()
                if chosen:
                    self._write_with_files(records, chosen)
                else:
                    wb = self._write_batch(records)
                    if self.undo is not None:
                        prefix, note = self.undo
                        key = prefix + (store.latest_sequence() + 1).to_bytes(8, "big")
                        wb.put(key, self._undo_record(records, note), store.handle(META_CF))
                    store.write(wb)
        except BaseException:
            self.state = "failed"
            raise
        store.publish_counters(new)
        self.state = "committed"
        for fn in self._after:
            fn()



# ---- undo ------------------------------------------------------------------------------------

_UNDO_FORMAT = b"JSU1"


def _undo_table(families: list[str], cf: np.ndarray, keys: list[bytes],
                values: list[bytes | None], note: bytes) -> bytes:
    table = pa.table({"cf": pa.array(cf, pa.int32()),
                      "key": pa.array(keys, pa.large_binary()),
                      "value": pa.array(values, pa.large_binary())})
    table = table.replace_schema_metadata({"families": json.dumps(families),
                                           "note": note.hex()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return _UNDO_FORMAT + sink.getvalue().to_pybytes()


def _read_undo(raw: bytes, where: str) -> tuple[pa.Table, list[str], bytes]:
    if not raw.startswith(_UNDO_FORMAT):
        msg = f"{where}: an undo record of an unknown format; nothing was changed"
        raise StateCorruptedError(msg)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(raw[len(_UNDO_FORMAT):])).read_all()
        meta = table.schema.metadata or {}
        families = json.loads(meta[b"families"])
        note = bytes.fromhex(meta[b"note"].decode())
    except (pa.ArrowInvalid, KeyError, ValueError) as exc:
        msg = f"{where}: an undo record is unreadable ({exc}); nothing was changed"
        raise StateCorruptedError(msg) from exc
    return table, families, note


def _records_of(store: Database, tag: str) -> list[tuple[bytes, bytes]]:
    return store.meta_items(undo_prefix(tag))


def undo_tags(store: Database) -> dict[str, bytes]:
    """The tags that have undo records in ``store``, each with its note."""
    out: dict[str, bytes] = {}
    for key, raw in store.meta_items(UNDO_PREFIX):
        tag = key[len(UNDO_PREFIX):-9].decode()
        if tag not in out:
            out[tag] = _read_undo(raw, f"{store.path} undo record {tag!r}")[2]
    return out


def apply_undo(store: Database, tag: str) -> int:
    """Restore what the transactions recorded under ``tag`` overwrote; drop the records.

    Newest record first, all in one WriteBatch with the records' removal, so a crash
    leaves either the undone store or the untouched one.  Cached counters are
    forgotten and derived files deleted (:meth:`~joinstate.db.Database.discard_derived`);
    nothing may be attached to the store (joins, pipelines hold in-memory state of
    what is undone): apply it on a freshly opened store.  Returns the records applied.
    """
    store.require_writable(f"undo operation {tag!r}")
    found = _records_of(store, tag)
    if not found:
        return 0
    wb = rd.WriteBatch(raw_mode=True)
    touched: set[str] = set()
    for key, raw in reversed(found):
        table, families, _ = _read_undo(raw, f"{store.path} undo record {tag!r}")
        handles = [store.handle(f) for f in families]
        touched.update(families)
        for i, k, v in zip(table.column("cf").to_pylist(), table.column("key").to_pylist(),
                           table.column("value").to_pylist(), strict=True):
            if v is None:
                wb.delete(k, handles[i])
            else:
                wb.put(k, v, handles[i])
        wb.delete(key, store.handle(META_CF))
    store.write(wb)
    store.forget_counters(sorted(touched | set(store.column_families())))
    store.discard_derived()
    return len(found)


def drop_undo(store: Database, tag: str) -> int:
    """Forget the undo records of ``tag`` (what they undo is final); returns how many."""
    store.require_writable(f"drop the undo records of {tag!r}")
    found = _records_of(store, tag)
    if found:
        wb = rd.WriteBatch(raw_mode=True)
        fill_records(wb, store.handle(META_CF), [(k, None) for k, _ in found])
        store.write(wb)
    return len(found)
