"""The join operator: push a change set into one side, get the output change set.

For a push of Δ into side S with other side O , the output is
Δ ⋈ O, and then S := S + Δ.  Outer, semi and anti joins add terms that depend on how
the per-key multiplicity ("degree") of a side crosses zero:

* S preserved (its unmatched rows are null-extended): Δ rows whose key has no O rows.
* O preserved: when S's degree for key k goes 0 -> >0, O's rows of k lose their
  null-extended row (-); when it goes >0 -> 0 they get it back (+).
* left_semi / left_anti: only left rows are output, filtered by right degree > 0 / == 0.

These terms are :class:`joinstate.joinrule.JoinRule`'s (the rule the pipeline's join
operator and population's recompute apply too); a :class:`Join` supplies the reads: the
other side's rows by one probe of its index (or its in-memory probe cache), its degrees
by a multi-get of its degree index where no rows are needed, and this side's degree
crossings from staging the batch.

A push is one :class:`~joinstate.transaction.Transaction`: own-side rows, degree
changes, counters and the commit record are written together or not at all, after
validation.  The output is assembled with Arrow ``take``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import pyarrow as pa

from joinstate import commits
from joinstate._index import Index, Staged
from joinstate._probe import Entries
from joinstate.activity import auto_compaction_flags
from joinstate.catalog import spec_diff
from joinstate.errors import (
    BulkWriteRefused,
    JoinSpecMismatchError,
    SchemaMismatchError,
    StateClosedError,
)
from joinstate.joinrule import Crossings, JoinRule, is_semi, tracks_degree
from joinstate.keys import KeyCodec, key_plan, single_plan
from joinstate.maintained import Bookkeeping, Kind, Phase
from joinstate.names import index_cf, source_of_join_side
from joinstate.schema import WEIGHT
from joinstate.side import Side, SideName
from joinstate.summary import stats_summary
from joinstate.transaction import Transaction
from joinstate.zset import checked_sum_by

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
_HOWS: tuple[str, ...] = get_args(How)
SPEC_VERSION = 1
_SIDES: tuple[SideName, SideName] = ("left", "right")


class Join:
    """A symmetric hash join whose two sides live in a :class:`StateStore`.

    Obtain one with :meth:`joinstate.StateStore.join`.  Safe to use from several threads: every
    push, ``state()`` and ``stats()`` holds the store's lock, so pushes are serialized
    (RocksDB writes from Python hold the GIL anyway; threads buy no write parallelism).

    A :class:`~joinstate.maintained.Maintained` object: its inputs are the two sides, its
    one output is named after the join (:meth:`push_change` returns ``{name: output}``).
    """

    kind: Kind = "join"
    inputs: tuple[str, ...] = _SIDES

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
        self.records = Bookkeeping(name, _SIDES, f"join {name!r}")
        self.how = how
        self.left_side, self.right_side = left, right
        self.suffixes = (suffixes[0], suffixes[1])
        self.spec: dict[str, Any] = {
            "version": SPEC_VERSION, "how": how, "suffixes": list(self.suffixes),
            "left": left.to_spec(), "right": right.to_spec(),
        }
        self.output_schema = output_schema(left, right, how, self.suffixes)
        self.rule = JoinRule.of_sides(how, left.schema, right.schema, self.output_schema)
        plan = key_plan(left.schema, left.key, right.schema, right.key)
        self.left = Index(
            store, index_cf(source_of_join_side(name, "left"), left.key), "left", left,
            KeyCodec(left.key, plan, "left"), track_degree=tracks_degree(how, 0),
        )
        self.right = Index(
            store, index_cf(source_of_join_side(name, "right"), right.key), "right", right,
            KeyCodec(right.key, plan, "right"), track_degree=tracks_degree(how, 1),
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
            digest = b"" if commit_id is None else commits.change_digest(side, batch.rh, batch.w)
            replayed = self.records.replay(store, commit_id, digest, f"the {side} side",
                                           self.output_names)
            if replayed is not None:
                return replayed[self.name]
            store.require_writable(f"push to the {side} side of join {self.name!r}")
            out = self.output_schema.empty_table()
            txn = Transaction(store)
            staged = Staged()
            if batch.rows:
                staged = s.stage(batch, txn)
                out = self._output(side, o, batch, staged) if output is None else output
            elif output is not None and output.num_rows:
                raise SchemaMismatchError(
                    f"join {self.name!r}: an output of {output.num_rows} rows was given for a "
                    "batch that consolidates to nothing (its output is empty); nothing was "
                    "applied"
                )
            if commit_id is not None:
                self.records.stage_commit(txn, commit_id, digest, {self.name: out})
            if progress is not None:
                self.records.stage_progress(txn, side, progress)
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

    def _sides(self, side: str) -> tuple[Index, Index]:
        if side == "left":
            return self.left, self.right
        if side == "right":
            return self.right, self.left
        raise SchemaMismatchError(f"side={side!r} must be 'left' or 'right'")

    def progress(self, side: str) -> bytes | None:
        """The durable progress marker a driver committed with ``side``'s batches."""
        self._sides(side)
        return self.records.progress(self._require_store(), side)

    def clear_progress(self) -> None:
        """Remove both sides' progress markers (a driver does so when it finishes)."""
        self.records.clear_progress(self._require_store())

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
        return self.records.committed(self._require_store(), commit_id)

    def forget_commits(self, keep: Callable[[str], bool] | None = None) -> int:
        """Drop recorded commit ids (and their outputs) for which ``keep`` is false."""
        return self.records.forget_commits(self._require_store(), keep)

    # ---- phase ------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """``"population"`` until a driver calls :meth:`go_live` (or :meth:`set_phase`)."""
        return self.records.phase(self._require_store())

    def set_phase(self, phase: Phase) -> None:
        """Record the join's phase (persisted in ``__meta__``)."""
        self.records.set_phase(self._require_store(), phase)

    def go_live(self, before_commit: Callable[[dict[str, pa.Table]], object] | None = None
                ) -> dict[str, pa.Table]:
        """End population: the phase becomes ``live`` and both progress markers go.

        One write, so a crash leaves either the interrupted population with its markers
        or a live join with none left over.  A join owes its output nothing at that point
        (every output row came with the push that made it): returns ``{}``.
        """
        store = self._require_store()
        with store.lock:
            txn = Transaction(store)
            self.records.go_live(txn)
            if before_commit is not None:
                before_commit({})
            txn.commit()
        return {}

    # ---- the Maintained protocol ----------------------------------------------------------

    @property
    def owner(self) -> str:
        """The name of the join's ``__meta__`` records: the join's name."""
        return self.name

    @property
    def output_names(self) -> tuple[str, ...]:
        """The join's one output, named after the join."""
        return (self.name,)

    def input_label(self, input_name: str) -> str:
        """``"the left side"`` / ``"the right side"``."""
        return f"the {input_name} side"

    def input_schema(self, input_name: str) -> pa.Schema:
        """The schema of a side's change sets (without ``_weight``)."""
        return self._sides(input_name)[0].side.schema

    def input_unique_key(self, input_name: str) -> tuple[str, ...] | None:
        """The side's declared unique key."""
        uk = self._sides(input_name)[0].side.unique_key
        return tuple(uk) if uk is not None else None

    def input_keys(self, input_name: str) -> tuple[tuple[str, ...], ...]:
        """The side's join key (population samples its statistics by it)."""
        return (tuple(self._sides(input_name)[0].side.key),)

    def push_change(
        self, input_name: str, delta: pa.Table | pa.RecordBatch, *,
        commit_id: str | None = None, progress: bytes | None = None,
        before_commit: Callable[[dict[str, pa.Table]], object] | None = None,
        sink: BulkSink | None = None,
    ) -> dict[str, pa.Table]:
        """:meth:`push` as the protocol has it: ``{join name: output}`` (see :meth:`apply`)."""
        side: SideName = "left" if input_name == "left" else "right"
        self._sides(input_name)
        store = self._require_store()
        deliver = None if before_commit is None else (
            lambda out: before_commit({self.name: out}))
        with store.lock:
            out = self.apply(side, self.prepare(side, delta), commit_id=commit_id, sink=sink,
                             progress=progress, before_commit=deliver)
        return {self.name: out}

    def indexes(self) -> list[IndexInfo]:
        """Views of both sides' indexes (left, right)."""
        self._require_store()
        return [self.left.info(), self.right.info()]

    def written_indexes(self, input_name: str) -> list[IndexInfo]:
        """The index a push to ``input_name`` writes: its own side's."""
        self._require_store()
        return [self._sides(input_name)[0].info()]

    def probed_indexes(self, input_name: str) -> list[IndexInfo]:
        """The index a push to ``input_name`` probes: the other side's."""
        self._require_store()
        return [self._sides(input_name)[1].info()]

    def bulk_loadable(self, input_name: str) -> bool:
        """Whether the side's batches may go to a bulk sink (no degree family)."""
        return self.index(input_name).bulk_loadable  # type: ignore[arg-type]

    def operator_rows(self) -> dict[str, int]:
        """A join is one operator; its rows of change are in the population report."""
        return {}

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

    def _output(self, side: str, o: Index, batch: PreparedBatch, staged: Staged) -> pa.Table:
        """The output of a staged batch: the join rule against the other side's index."""
        kg = batch.keys
        crossings = None
        if staged.deg_old is not None and staged.deg_new is not None:
            crossings = Crossings.of(staged.deg_old, staged.deg_new)
        other = _Probe(o, batch.canon.take(kg.first), batch.khash[kg.first])
        parts = self.rule.push(0 if side == "left" else 1, batch.table, batch.w, kg.inv,
                               len(kg), other, crossings)
        return self.rule.table(parts)

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
        store = self._require_store()
        with store.lock:
            return {label: idx.verify(f"join {self.name!r}, {label} side")
                    for label, idx in (("left", self.left), ("right", self.right))}

    def summary(self, stats: dict[str, Any] | None = None) -> str:
        """A small readable table of the join, one row per side.

        Per side: layout, rows, entries, distinct keys, bytes (SST files + memtables),
        L0 files and whether auto-compaction is on.  ``stats``: a :meth:`stats` dict
        already taken (``stats()`` counts distinct keys by a pass over a side when no
        counter has them, so a caller holding one passes it instead of paying twice).
        What ``joinstate inspect`` prints per join.
        """
        return stats_summary(self.stats() if stats is None else stats)


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
    if is_semi(how):
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


def _binary(values: Bytes, null: np.ndarray) -> pa.Array:
    """``values`` as a ``large_binary`` Arrow array, null where ``null`` is set."""
    if not null.any():
        return values.arrow()
    validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(pa.large_binary(), len(values), [
        validity, pa.py_buffer(np.ascontiguousarray(values.offsets, np.int64)),
        pa.py_buffer(values.data)])


class _Probe:
    """The other side's index at a batch's distinct keys, read at most once per kind.

    The join rule's :class:`~joinstate.joinrule.OtherSide`: rows by one probe (probe
    cache or RocksDB), degrees from those rows once probed and otherwise by the degree
    index's multi-get (a semi join's left push reads no rows), and the rows of a few
    keys (those whose degree crossed zero) by a probe of just those keys.
    """

    __slots__ = ("_entries", "_index", "_qcanon", "_qhash")

    def __init__(self, index: Index, qcanon: Bytes, qhash: np.ndarray) -> None:
        self._index = index
        self._qcanon = qcanon
        self._qhash = qhash
        self._entries: Entries | None = None

    def entries(self) -> Entries:
        if self._entries is None:
            if len(self._qhash):
                self._entries = self._index.probe(self._qcanon, self._qhash)
            else:
                self._entries = Entries(self._index.schema.empty_table(),
                                        np.zeros(0, np.int64), np.zeros(0, np.int64))
        return self._entries

    def degrees(self) -> np.ndarray:
        e = self._entries
        if e is None:
            return self._index.degrees(self._qcanon, self._qhash)
        return checked_sum_by(e.q, e.w, len(self._qhash), "a key's degree")

    def entries_at(self, groups: np.ndarray) -> Entries:
        if self._entries is not None:
            return self._entries
        sub = self._index.probe(self._qcanon.take(groups), self._qhash[groups])
        return Entries(sub.rows, sub.w, groups[sub.q])
