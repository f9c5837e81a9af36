"""The join operator: push a change set into one side, get the output change set.

For a push of Δ into side S with other side O , the output is
Δ ⋈ O, and then S := S + Δ.  Outer, semi and anti joins add terms that depend on how
the per-key multiplicity ("degree") of a side crosses zero:

* S preserved (its unmatched rows are null-extended): Δ rows whose key has no O rows.
* O preserved: when S's degree for key k goes 0 -> >0, O's rows of k lose their
  null-extended row (-); when it goes >0 -> 0 they get it back (+).
* left_semi / left_anti: only left rows are output, filtered by right degree > 0 / == 0.

A push is one :class:`~joinstate.transaction.Transaction`: own-side rows, degree
changes, counters and the commit record are written together or not at all, after
validation.  The output is assembled with Arrow ``take``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import pyarrow as pa

from joinstate._bytes import is_identity
from joinstate._index import Index, Staged
from joinstate._probe import Entries
from joinstate.activity import auto_compaction_flags
from joinstate.catalog import spec_diff
from joinstate.errors import (
    BulkWriteRefused,
    CommitConflictError,
    JoinSpecMismatchError,
    SchemaMismatchError,
    StateClosedError,
)
from joinstate.keys import KeyCodec, key_plan, single_plan
from joinstate.names import (
    commit_key,
    commit_prefix,
    index_cf,
    phase_key,
    progress_key,
    source_of_join_side,
)
from joinstate.schema import WEIGHT
from joinstate.side import Side, SideName
from joinstate.transaction import Transaction
from joinstate.zset import checked_mul, checked_sum_by, expand

if TYPE_CHECKING:
    from collections.abc import Callable

    from joinstate._bytes import Bytes
    from joinstate.batch import PreparedBatch
    from joinstate.db import Database
    from joinstate.transaction import BulkSink
    from joinstate.views import IndexInfo

__all__ = ["How", "Join", "Phase", "output_schema"]

log = logging.getLogger(__name__)

How = Literal["inner", "left", "right", "full", "left_semi", "left_anti"]
Phase = Literal["population", "live"]
_HOWS: tuple[str, ...] = get_args(How)
SPEC_VERSION = 1
_COMMIT_FORMAT = b"JSC1"  # commit record: format tag, 16-byte delta digest, Arrow IPC output


class Join:
    """A symmetric hash join whose two sides live in a :class:`StateStore`.

    Obtain one with :meth:`joinstate.StateStore.join`.  Safe to use from several threads: every
    push, ``state()`` and ``stats()`` holds the store's lock, so pushes are serialized
    (RocksDB writes from Python hold the GIL anyway; threads buy no write parallelism).
    """

    def __init__(
        self, store: Database, name: str, left: Side, right: Side, how: str,
        suffixes: tuple[str, str],
    ) -> None:
        if how not in _HOWS:
            raise SchemaMismatchError(f"how={how!r} must be one of {_HOWS}")
        for label, side in (("left", left), ("right", right)):
            if not isinstance(side, Side):
                raise SchemaMismatchError(
                    f"{label} must be a joinstate.Side, got {type(side).__name__}"
                )
            side.validate_types(label)
        if (
            not isinstance(suffixes, tuple | list) or len(suffixes) != 2
            or not all(isinstance(s, str) for s in suffixes)
        ):
            raise SchemaMismatchError(f"suffixes={suffixes!r} must be a pair of strings")
        self.store: Database | None = store
        self.name = name
        self.how = how
        self.left_side, self.right_side = left, right
        self.suffixes = (suffixes[0], suffixes[1])
        self.spec: dict[str, Any] = {
            "version": SPEC_VERSION, "how": how, "suffixes": list(self.suffixes),
            "left": left.to_spec(), "right": right.to_spec(),
        }
        self.output_schema = output_schema(left, right, how, self.suffixes)
        plan = key_plan(left.schema, left.key, right.schema, right.key)
        self.left = Index(
            store, index_cf(source_of_join_side(name, "left"), left.key), "left", left,
            KeyCodec(left.key, plan, "left"), track_degree=how in ("right", "full"),
        )
        self.right = Index(
            store, index_cf(source_of_join_side(name, "right"), right.key), "right", right,
            KeyCodec(right.key, plan, "right"),
            track_degree=how in ("left", "full", "left_semi", "left_anti"),
        )
        stored = store.catalog_get(name)
        if stored is None and store.read_only:
            raise JoinSpecMismatchError(
                f"join {name!r} does not exist in {store.path} (opened read-only); joins "
                f"there: {store.joins()}"
            )
        if stored is None:
            store.catalog_put(name, self.spec)
        elif stored != self.spec:
            self.raise_spec_mismatch(stored)
        for idx in (self.left, self.right):
            for cf in idx.column_families():
                store.cf(cf)
        for idx in (self.left, self.right):
            idx.restore_cache()

    def raise_spec_mismatch(self, stored: dict[str, Any]) -> None:
        """Raise :class:`JoinSpecMismatchError` naming every field that differs."""
        diffs = spec_diff(stored, self.spec)
        raise JoinSpecMismatchError(
            f"join {self.name!r} already exists in {self.store.path if self.store else '?'} "
            f"with a different spec ({'; '.join(diffs) or 'schema metadata differs'}); use a "
            "new join name or drop the old state"
        )

    def detach(self) -> None:
        """Called by the store on close: derived state is saved, the join becomes unusable."""
        store = self.store
        if store is not None and not store.closed and not store.read_only:
            for idx in (self.left, self.right):
                try:
                    idx.save()
                except OSError as exc:  # derived state only: the next open rebuilds it
                    log.warning("could not save derived state of join %r: %s", self.name, exc)
        self.store = None
        self.left.cache = None
        self.right.cache = None

    def _require_store(self) -> Database:
        if self.store is None or self.store.closed:
            raise StateClosedError(f"join {self.name!r} is bound to a closed state store")
        return self.store

    # ---- output rows ------------------------------------------------------------------

    def _assemble(
        self, left: pa.Table | None, right: pa.Table | None, w: np.ndarray
    ) -> pa.Table:
        n = len(w)
        cols: list[pa.Array] = []
        if left is not None:
            cols += [c.combine_chunks() for c in left.columns]
        else:
            cols += [pa.nulls(n, f.type) for f in self.left_side.schema]
        if self.how not in ("left_semi", "left_anti"):
            if right is not None:
                cols += [c.combine_chunks() for c in right.columns]
            else:
                cols += [pa.nulls(n, f.type) for f in self.right_side.schema]
        cols.append(pa.array(w, type=pa.int64()))
        return pa.Table.from_arrays(cols, schema=self.output_schema)

    # ---- push -------------------------------------------------------------------------

    def push(
        self, side: SideName, delta: pa.Table | pa.RecordBatch, *,
        commit_id: str | None = None,
    ) -> pa.Table:
        """Apply a change set to ``side``; return the join's output change set.

        Atomic: a batch that would take a row's multiplicity below zero, break a
        declared unique key or overflow a weight raises and changes nothing.

        ``commit_id`` makes the push idempotent (exactly-once under retries): the id, a
        digest of (side, consolidated delta) and the output are committed in the same
        WriteBatch as the state change.  A push with an id already committed returns the
        recorded output without applying anything if its side and consolidated delta
        are the same, and raises :class:`~joinstate.errors.CommitConflictError`
        otherwise.  Ids are kept until :meth:`forget_commits`.
        """
        store = self._require_store()
        with store.lock:
            return self.apply(side, self.prepare(side, delta), commit_id=commit_id)

    def prepare(self, side: SideName, delta: pa.Table | pa.RecordBatch) -> PreparedBatch:
        """Conform, encode and consolidate a delta without touching state.

        Drivers (population, Spark workers) use this with :meth:`apply` to inspect or
        redirect a batch; :meth:`push` is ``apply(prepare(...))``.
        """
        self._require_store()
        return self._sides(side)[0].prepare(delta)

    def apply(
        self, side: SideName, batch: PreparedBatch, *, commit_id: str | None = None,
        sink: BulkSink | None = None, progress: bytes | None = None,
        before_commit: Callable[[pa.Table], object] | None = None,
        output: pa.Table | None = None,
    ) -> pa.Table:
        """Apply a prepared batch as one transaction; see :meth:`push`.

        ``sink``, if given, receives the data writes (:class:`~joinstate.WriteBlock`
        per column family; a None value deletes) instead of the WriteBatch, e.g. to
        write them as sorted SST files for ingestion; counters and the commit record
        go to the sink with them, to be made durable together.  If the sink raises,
        nothing of the batch is written.  ``progress`` is a driver's marker for this
        side (:meth:`progress`), committed in the same transaction as the batch.
        ``before_commit`` receives the output after validation and before anything is
        written: a driver that must never lose output delivers it there (if it raises,
        nothing is written).

        ``output``, if given, is the batch's output computed by the caller (e.g. by a
        hash join against :meth:`scan` snapshots, as ``population.recompute`` does): the
        join then stages the state change exactly as a push does (same validation,
        same writes) but does not probe the other side, and records and returns
        ``output``.  Nothing checks that it is what the join would have computed; it
        must have the join's :attr:`output_schema` (names and types).
        """
        store = self._require_store()
        s, o = self._sides(side)
        if output is not None:
            output = self._conform_output(output)
        if batch.side != side:
            raise SchemaMismatchError(
                f"the batch was prepared for the {batch.side} side, not the {side} side"
            )
        with store.lock:
            ckey = commit_key(self.name, commit_id) if commit_id is not None else None
            digest = batch.digest() if ckey is not None else b""
            if ckey is not None:
                recorded = store.meta_get(ckey)
                if recorded is not None:
                    return self._replay(commit_id or "", recorded, side, digest)
            store.require_writable(f"push to the {side} side of join {self.name!r}")
            out = self.output_schema.empty_table()
            txn = Transaction(store)
            staged = Staged()
            if batch.rows:
                staged = s.stage(batch, txn)
                out = self._output(side, s, o, batch, staged) if output is None else output
            elif output is not None and output.num_rows:
                raise SchemaMismatchError(
                    f"join {self.name!r}: an output of {output.num_rows} rows was given for a "
                    "batch that consolidates to nothing (its output is empty); nothing was "
                    "applied"
                )
            if ckey is not None:
                txn.record(ckey, _COMMIT_FORMAT + digest + _ipc_write(out))
            if progress is not None:
                txn.record(progress_key(self.name, side), progress)
            if sink is not None and txn.read_state:
                raise BulkWriteRefused(
                    f"join {self.name!r}, {side} side: the batch retracts rows or may repeat "
                    "stored unique keys, so it was checked by reading the index; it cannot "
                    "be bulk-written; nothing was written"
                )
            if before_commit is not None:
                before_commit(out)
            txn.commit(sink)
            if batch.rows:
                s.after_write(batch)
            return out

    def _conform_output(self, output: pa.Table) -> pa.Table:
        """``output`` with exactly :attr:`output_schema`, or SchemaMismatchError naming why."""
        want = self.output_schema
        if not isinstance(output, pa.Table):
            raise SchemaMismatchError(
                f"join {self.name!r}: output must be a pyarrow Table, got "
                f"{type(output).__name__}"
            )
        if output.schema.names != want.names:
            raise SchemaMismatchError(
                f"join {self.name!r}: the given output has columns {output.schema.names}, the "
                f"join outputs {want.names}; build it with the join's output_schema"
            )
        for f, g in zip(output.schema, want, strict=True):
            if not f.type.equals(g.type):
                raise SchemaMismatchError(
                    f"join {self.name!r}: output column {f.name!r} is {f.type}, the join "
                    f"outputs {g.type}; cast it to the join's output_schema"
                )
        return pa.Table.from_arrays(output.columns, schema=want)

    def _replay(self, commit_id: str, recorded: bytes, side: str, digest: bytes) -> pa.Table:
        if not recorded.startswith(_COMMIT_FORMAT):
            raise CommitConflictError(
                f"commit id {commit_id!r} of join {self.name!r} was recorded in an older "
                "format without a digest of its change set; use a new commit id"
            )
        n = len(_COMMIT_FORMAT)
        if recorded[n:n + 16] != digest:
            raise CommitConflictError(
                f"commit id {commit_id!r} of join {self.name!r} was already committed with "
                f"a different change set or side (this push: the {side} side); a retry must "
                "repeat the same change to the same side, a new change needs a new commit "
                "id; nothing was applied"
            )
        return _ipc_read(recorded[n + 16:])

    def _sides(self, side: str) -> tuple[Index, Index]:
        if side == "left":
            return self.left, self.right
        if side == "right":
            return self.right, self.left
        raise SchemaMismatchError(f"side={side!r} must be 'left' or 'right'")

    def progress(self, side: SideName) -> bytes | None:
        """The durable progress marker a driver committed with ``side``'s batches."""
        self._sides(side)
        return self._require_store().meta_get(progress_key(self.name, side))

    def clear_progress(self) -> None:
        """Remove both sides' progress markers (a driver does so when it finishes)."""
        store = self._require_store()
        with store.lock:
            txn = Transaction(store)
            for side in ("left", "right"):
                txn.record(progress_key(self.name, side), None)
            txn.commit()

    def settle(self) -> None:
        """Finish in-memory work deferred during a load, before the live phase.

        Bulk appends only queue their entries for the retraction map; this sorts them
        in, so the first retraction after population costs what later ones do.
        """
        store = self._require_store()
        with store.lock:
            for idx in (self.left, self.right):
                idx.settle()

    def reload(self) -> None:
        """Forget what is cached in memory (probe caches, counters) and re-read it.

        For drivers whose work failed after transactions were handed to a bulk sink
        that never made them durable: the in-memory counters ran ahead of the store.
        """
        store = self._require_store()
        with store.lock:
            store.forget_counters(self.column_families())
            for idx in (self.left, self.right):
                idx.reset()

    def column_families(self) -> tuple[str, ...]:
        """Every column family of both sides."""
        return self.left.column_families() + self.right.column_families()

    def committed(self, commit_id: str) -> bool:
        """Whether a push with ``commit_id`` has been applied."""
        store = self._require_store()
        return store.meta_get(commit_key(self.name, commit_id)) is not None

    def forget_commits(self, keep: Callable[[str], bool] | None = None) -> int:
        """Drop recorded commit ids (and their outputs) for which ``keep`` is false."""
        store = self._require_store()
        prefix = commit_prefix(self.name)
        with store.lock:
            txn = Transaction(store)
            n = 0
            for k in store.meta_keys(prefix):
                if keep is None or not keep(k[len(prefix):].decode()):
                    txn.record(k, None)
                    n += 1
            txn.commit()
        return n

    # ---- phase ------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """``"population"`` until a driver calls :meth:`set_phase` ``("live")``."""
        store = self._require_store()
        return "live" if store.meta_get(phase_key(self.name)) == b"live" else "population"

    def set_phase(self, phase: Phase) -> None:
        """Record the join's phase (persisted in ``__meta__``)."""
        if phase not in ("population", "live"):
            raise SchemaMismatchError(f"phase={phase!r} must be 'population' or 'live'")
        store = self._require_store()
        with store.lock:
            store.meta_put(phase_key(self.name), phase.encode())

    def go_live(self) -> None:
        """End population: the phase becomes ``live`` and both progress markers go.

        One write, so a crash leaves either the interrupted population with its markers
        or a live join with none left over.
        """
        store = self._require_store()
        with store.lock:
            txn = Transaction(store)
            for side in ("left", "right"):
                txn.record(progress_key(self.name, side), None)
            txn.record(phase_key(self.name), b"live")
            txn.commit()

    def rows(self, side: SideName) -> int:
        """Total multiplicity stored on ``side`` (NULL-key rows included); O(1)."""
        self._require_store()
        return self._sides(side)[0].rows

    def index(self, side: SideName) -> IndexInfo:
        """A read-only view of one side's index: column families, layout, counters."""
        self._require_store()
        return self._sides(side)[0].info()

    def shard_of(
        self, side: SideName, table: pa.Table | pa.RecordBatch, shards: int
    ) -> np.ndarray:
        """Shard number of every row: ``xxh3(canonical key) % shards``.

        Equal keys get equal shards on both sides whatever their integer widths; rows
        with a NULL key go to shard 0 (they never match, any shard is correct).
        """
        return self._sides(side)[0].key_codec.shard_of(table, shards)

    def _output(
        self, side: str, s: Index, o: Index, batch: PreparedBatch, staged: Staged
    ) -> pa.Table:
        is_left = side == "left"
        how = self.how
        kg = batch.keys
        G = len(kg)
        qcanon: Bytes = batch.canon.take(kg.first)
        qhash = batch.khash[kg.first]
        parts: list[pa.Table] = []

        def orient(mine: pa.Table | None, other: pa.Table | None, w: np.ndarray) -> pa.Table:
            return self._assemble(mine, other, w) if is_left else self._assemble(other, mine, w)

        if how in ("left_semi", "left_anti"):
            if is_left:
                deg = o.degrees(qcanon, qhash)
                matched = np.zeros(batch.rows, dtype=bool)
                nn = kg.inv >= 0
                matched[nn] = deg[kg.inv[nn]] > 0
                keep = matched if how == "left_semi" else ~matched
                idx = np.flatnonzero(keep)
                if len(idx):
                    parts.append(self._assemble(batch.table.take(pa.array(idx)), None,
                                                batch.w[idx]))
            else:
                self._transitions(staged, o, qcanon, qhash, parts, sign=(
                    1 if how == "left_semi" else -1))
            return _concat(parts, self.output_schema)

        entries = o.probe(qcanon, qhash) if G else None
        if entries is not None and len(entries.w):
            ri, ei = expand(kg.inv, entries.q, G)
            if len(ri):
                parts.append(orient(
                    _take(batch.table, ri), _take(entries.rows, ei),
                    checked_mul(batch.w[ri], entries.w[ei], "the weight of a joined pair"),
                ))
        s_preserved = (is_left and how in ("left", "full")) or (
            not is_left and how in ("right", "full"))
        o_preserved = (is_left and how in ("right", "full")) or (
            not is_left and how in ("left", "full"))
        if s_preserved:
            odeg = (checked_sum_by(entries.q, entries.w, G, "a key's degree")
                    if entries is not None else np.zeros(0, np.int64))
            unmatched = batch.null.copy()
            nn = kg.inv >= 0
            unmatched[nn] = odeg[kg.inv[nn]] == 0
            idx = np.flatnonzero(unmatched)
            if len(idx):
                parts.append(orient(batch.table.take(pa.array(idx)), None, batch.w[idx]))
        if o_preserved:
            self._transitions(staged, o, qcanon, qhash, parts, sign=-1, entries=entries,
                              other_is_left=not is_left)
        return _concat(parts, self.output_schema)

    def _transitions(
        self, staged: Staged, o: Index, qcanon: Bytes, qhash: np.ndarray,
        parts: list[pa.Table], sign: int, entries: Entries | None = None,
        other_is_left: bool = True,
    ) -> None:
        """Emit O's rows for keys whose own-side degree crossed zero.

        ``sign`` is the sign for a 0 -> >0 crossing (the opposite for >0 -> 0).
        """
        if staged.deg_old is None or staged.deg_new is None:
            return  # the batch had only NULL keys: no degree changed
        old, new = staged.deg_old, staged.deg_new
        up = (old == 0) & (new > 0)
        down = (old > 0) & (new == 0)
        crossing = np.flatnonzero(up | down)
        if not len(crossing):
            return
        if entries is None:
            sub = o.probe(qcanon.take(crossing), qhash[crossing])
            q = crossing[sub.q]
            entries = Entries(sub.rows, sub.w, q)
        sel = np.flatnonzero(up[entries.q] | down[entries.q])
        if not len(sel):
            return
        factor = np.where(up[entries.q[sel]], sign, -sign)
        rows = entries.rows.take(pa.array(sel))
        w = entries.w[sel] * factor
        if other_is_left:
            parts.append(self._assemble(rows, None, w))
        else:
            parts.append(self._assemble(None, rows, w))

    # ---- inspection -------------------------------------------------------------------

    def state(self, side: SideName) -> pa.Table:
        """The consolidated content of ``side``: its columns plus ``_weight`` (> 0)."""
        store = self._require_store()
        idx = self._sides(side)[0]
        with store.lock:
            rows, w = idx.state()
        return rows.append_column(pa.field(WEIGHT, pa.int64(), nullable=False),
                                  pa.array(w, pa.int64()))

    def scan(self, side: SideName, batch: PreparedBatch | None = None) -> pa.Table:
        """Every stored entry of ``side`` as one Arrow table, for whole-table work.

        For callers that compute from snapshots with hash joins and group-bys (e.g.
        ``population.recompute``) and must compare rows and keys exactly as the join
        does.  Columns: the side's own; ``_weight``, the entry's multiplicity (on a side
        without a unique key a row inserted by several batches has one entry per batch:
        sum ``_weight`` by ``_row`` to consolidate); ``_key``, ``large_binary``
        canonical join-key bytes, equal on both sides exactly when the keys match
        (integer widths, ``-0.0`` and NaN folded as the join folds them), null when a
        key column is NULL (such rows never match); ``_row``, ``large_binary``, the
        row's canonical encoding, equal exactly when the join takes two rows for one;
        and, on a side declaring a unique key, ``_unique``, its canonical bytes.

        With ``batch`` (from :meth:`prepare` for ``side``), the batch's consolidated
        rows instead, in the same form, as :meth:`push` would output them.  One read of
        every entry of the side (plus its NULL-key rows) under the store's lock.
        """
        store = self._require_store()
        idx = self._sides(side)[0]
        if batch is not None:
            if batch.side != side:
                raise SchemaMismatchError(
                    f"the batch was prepared for the {batch.side} side, not the {side} side"
                )
            rows, w, enc, canon, null = batch.table, batch.w, batch.enc, batch.canon, batch.null
        else:
            with store.lock:
                rows, w, enc = idx.scan_all()
            canon, null = idx.key_codec.encode(rows)
        cols = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                for c in rows.columns]
        fields = list(rows.schema)
        extra: list[tuple[str, pa.DataType, pa.Array]] = [
            (WEIGHT, pa.int64(), pa.array(w, pa.int64())),
            ("_key", pa.large_binary(), _binary(canon, null)),
            ("_row", pa.large_binary(), enc.arrow()),
        ]
        uk = idx.side.unique_key
        if uk:
            ucanon, unull = KeyCodec(uk, single_plan(idx.schema, uk), side).encode(rows)
            extra.append(("_unique", pa.large_binary(), _binary(ucanon, unull)))
        for name, typ, arr in extra:
            fields.append(pa.field(name, typ, nullable=name != WEIGHT))
            cols.append(arr)
        return pa.Table.from_arrays(cols, schema=pa.schema(fields))

    def stats(self) -> dict[str, Any]:
        """Per-index counters and RocksDB properties.

        ``distinct_keys`` is exact: kept as a counter where the layout or a degree index
        makes that free, counted by a pass over the side otherwise.
        """
        store = self._require_store()
        with store.lock:
            out: dict[str, Any] = {
                "join": self.name, "how": self.how, "phase": self.phase,
                # DB-wide and cumulative since the store was opened (RocksDB keeps no
                # per-family statistics): compaction, flush and WAL bytes, stalls.
                "rocksdb_activity": store.activity(),
            }
            compaction_off = auto_compaction_flags(store.path)
            for label, idx in (("left", self.left), ("right", self.right)):
                props: dict[str, dict[str, Any]] = {}
                total_bytes = 0
                for cf in idx.column_families():
                    p: dict[str, Any] = {
                        name: store.property_int(cf, "rocksdb." + name) for name in _PROPERTIES
                    }
                    p["auto_compaction_disabled"] = compaction_off.get(cf)
                    props[cf] = p
                    total_bytes += (p["total-sst-files-size"] or 0) + (
                        p["cur-size-all-mem-tables"] or 0)
                out[label] = {
                    "layout": idx.side.layout,
                    "rows": idx.rows,
                    "null_key_rows": store.counter(idx.cf_nulls, "rows"),
                    "entries": idx.entries,
                    "distinct_keys": idx.count_distinct_keys(),
                    "bytes": total_bytes,
                    "probe_cache_rows": None if idx.cache is None else len(idx.cache),
                    "rocksdb": props,
                }
        return out

    def verify(self) -> dict[str, dict[str, int]]:
        """Read every stored entry of both sides and check it against the counters.

        Returns ``{side: {"rows": n, "entries": m, "null_rows": k}}``; raises
        :class:`~joinstate.errors.StateCorruptedError` if a block fails its checksum, a
        count disagrees with its counter, or in-memory state derived from an index (the
        bag entry map, the unique key set) disagrees with it (it is rebuilt first).
        """
        from joinstate.errors import StateCorruptedError

        store = self._require_store()
        out: dict[str, dict[str, int]] = {}
        with store.lock:
            for label, idx in (("left", self.left), ("right", self.right)):
                counted: dict[str, int] = {}
                for layout, part in ((idx.layout, ""), (idx.nulls, "null_")):
                    _, w, _ = layout.scan()
                    rows = int(w.sum()) if len(w) else 0
                    counted[part + "rows"] = rows
                    counted[part + "entries"] = len(w)
                    for name, got in (("rows", rows), ("entries", len(w))):
                        want = store.counter(layout.cf, name)
                        if got != want:
                            raise StateCorruptedError(
                                f"join {self.name!r}, {label} side: {layout.cf} holds {got} "
                                f"{name} but its counter says {want}; the state is "
                                "inconsistent: restore it from a copy or repopulate"
                            )
                    # Derived state that decides writes without reading (the entry
                    # map, the key set) must agree with what was just read.
                    layout.check_derived()
                out[label] = counted
        return out

    def summary(self, stats: dict[str, Any] | None = None) -> str:
        """A small readable table of the join, one row per side.

        Per side: layout, rows, entries, distinct keys, bytes (SST files + memtables),
        L0 files and whether auto-compaction is on.  ``stats``: a :meth:`stats` dict
        already taken (``stats()`` counts distinct keys by a pass over a side when no
        counter has them, so a caller holding one passes it instead of paying twice).
        What ``joinstate inspect`` prints per join.
        """
        from joinstate.summary import human_bytes, side_facts

        st = self.stats() if stats is None else stats

        def num(v: object) -> str:
            return f"{v:,}" if isinstance(v, int) else "?"

        table = [["side", "layout", "rows", "entries", "distinct keys", "bytes", "L0 files",
                  "auto-compaction"]]
        for label in ("left", "right"):
            side = st.get(label)
            if not isinstance(side, dict):
                continue
            f = side_facts(side)
            rows = num(f["rows"]) + (f" (+{f['null_key_rows']:,} NULL key)"
                                     if f["null_key_rows"] else "")
            table.append([label, str(f["layout"]), rows, num(side.get("entries")),
                          num(f["distinct_keys"]), human_bytes(f["bytes"]),
                          num(f["l0_files"]), str(f["auto_compaction"])])
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        left_aligned = {0, 1, len(widths) - 1}
        lines = [f"join {st.get('join', self.name)} ({st.get('how', self.how)}, phase "
                 f"{st.get('phase', '?')})"]
        lines += ["  " + "  ".join(c.ljust(w) if i in left_aligned else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths, strict=True))
                                   ).rstrip() for r in table]
        act = st.get("rocksdb_activity") or {}
        if any(act.values()):
            lines.append(
                f"  RocksDB since open: compaction {human_bytes(act.get('compaction_read_bytes'))}"
                f" read, {human_bytes(act.get('compaction_write_bytes'))} written; flush "
                f"{human_bytes(act.get('flush_write_bytes'))}; WAL "
                f"{human_bytes(act.get('wal_bytes'))}; stalls "
                f"{act.get('stall_micros', 0) / 1e6:.2f} s")
        return "\n".join(lines)


_PROPERTIES = (
    "num-files-at-level0", "num-files-at-level1", "estimate-num-keys", "total-sst-files-size",
    "live-sst-files-size", "cur-size-all-mem-tables", "estimate-pending-compaction-bytes",
    "compaction-pending", "num-running-compactions", "estimate-live-data-size",
)


def output_schema(
    left: Side, right: Side, how: str = "inner", suffixes: tuple[str, str] = ("", "_right")
) -> pa.Schema:
    """The schema of a join's output deltas, without creating a store.

    Left columns, then right columns (names colliding with a left name get
    ``suffixes``), then ``_weight``; semi and anti joins output left columns only.
    """
    lnames = left.schema.names
    if how in ("left_semi", "left_anti"):
        fields = [pa.field(f.name, f.type) for f in left.schema]
        return pa.schema([*fields, pa.field(WEIGHT, pa.int64(), nullable=False)])
    rnames = right.schema.names
    both = set(lnames) & set(rnames)
    lout = [n + suffixes[0] if n in both else n for n in lnames]
    rout = [n + suffixes[1] if n in both else n for n in rnames]
    names = lout + rout
    if len(set(names)) != len(names) or WEIGHT in names:
        raise SchemaMismatchError(
            f"output column names collide after applying suffixes {suffixes}: "
            f"{names}; choose other suffixes"
        )
    fields = [pa.field(n, f.type) for n, f in zip(lout, left.schema, strict=True)]
    fields += [pa.field(n, f.type) for n, f in zip(rout, right.schema, strict=True)]
    return pa.schema([*fields, pa.field(WEIGHT, pa.int64(), nullable=False)])


def _ipc_write(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _ipc_read(raw: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(raw)).read_all()


def _binary(values: Bytes, null: np.ndarray) -> pa.Array:
    """``values`` as a ``large_binary`` Arrow array, null where ``null`` is set."""
    if not null.any():
        return values.arrow()
    validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(pa.large_binary(), len(values), [
        validity, pa.py_buffer(np.ascontiguousarray(values.offsets, np.int64)),
        pa.py_buffer(values.data)])


def _take(table: pa.Table, idx: np.ndarray) -> pa.Table:
    """``table.take(idx)``, without the copy when ``idx`` takes every row in order."""
    return table if is_identity(idx, table.num_rows) else table.take(pa.array(idx))


def _concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    if not parts:
        return schema.empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
