r"""Aggregation state of one ``group_by(...).aggregate(...)``, kept in RocksDB.

A pipeline's group-by turns a Z-set of input rows into a Z-set of output rows (one per
group: the key values, then the aggregates).  This module keeps what that needs, so that
a batch costs O(groups it touches), never a rescan of a group's rows:

``agg[<base>]`` (:func:`joinstate.names.aggregate_cf`), one entry per group
    key: 8-byte big-endian ``xxh3`` of the group's canonical key, then the canonical key
    itself.  The canonical key is, per key column, one marker byte (0 NULL, 1 a value)
    followed by the column's :class:`~joinstate.keys.KeyCodec` bytes (zeros for NULL):
    the join keys' encoding, so ``-0.0``/``0.0`` and every NaN form one group, plus the
    marker because a join key never matches NULL while SQL ``GROUP BY`` makes NULL one
    group.  Prefix-free, so one group's key never starts another's.
    value: a :class:`~joinstate.codec.RowCodec` row of the *state schema*: the key
    values (``k0``..), ``n`` = count(*) (the weight of the group's rows), then each
    aggregate's fields (``a<i>``...; :mod:`joinstate.aggregate.functions`): count(col)
    its count; sum of integers / decimals the exact sum (int64 / decimal128(38,s)) and
    the count of non-NULL values that says NULL from 0; sum of floats a compensated pair
    (hi, lo) of the finite values plus the counts of non-NULL values, NaNs, +inf and
    -inf, so that inserting and retracting a NaN or an infinity leaves no trace;
    min/max the order-preserving bytes (:mod:`joinstate.aggregate.values`) of the
    current extreme, NULL when the group has no non-NULL value.
    Counters: ``entries`` = groups stored, ``rows`` = the summed count(*).

``agg[<base>].minmax``, only with min/max: the value multiset
    (:mod:`joinstate.aggregate.minmax`), from which a retracted extreme's successor is
    read.

Everything a batch changes is *staged* into the caller's transaction after every check
passed (over-retraction, int64 / decimal overflow), so a failing batch changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate.aggregate.functions import FUNCS, AggSpec, Extreme, Fold, make
from joinstate.aggregate.minmax import MinMax
from joinstate.aggregate.values import canonical, contiguous, group_bytes, i64
from joinstate.codec import RowCodec
from joinstate.errors import SchemaMismatchError
from joinstate.keys import KeyCodec, hash_prefix, prefix_bytes, single_plan
from joinstate.names import aggregate_cf
from joinstate.schema import WEIGHT
from joinstate.zset import checked_add, checked_sum, checked_sum_by

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate.db import Database
    from joinstate.transaction import Transaction

__all__ = ["GroupState"]

_I64 = pa.int64()


class GroupState:
    """Aggregation state of one group-by, kept in RocksDB column families.

    ``base`` names the state (the families are ``agg[<base>]`` and, with min/max,
    ``agg[<base>].minmax``); ``input_schema`` holds the key and aggregated columns,
    already evaluated by the caller.  See the module docstring for the layout.  A push
    calls :meth:`stage` once per transaction.
    """

    def __init__(self, store: Database, base: str, input_schema: pa.Schema,
                 keys: Sequence[str], aggs: Sequence[AggSpec]) -> None:
        self.store = store
        self.base = base
        self.input_schema = input_schema
        self.keys = list(keys)
        self.aggs = [AggSpec(*a) for a in aggs]
        self.cf = aggregate_cf(base)
        self._minmax = MinMax(store, base)
        self.values_cf = self._minmax.cf
        self._check_keys()
        self._key_codecs: list[KeyCodec] = []
        for k in self.keys:
            try:
                plan = single_plan(input_schema, [k])
            except SchemaMismatchError as exc:
                raise SchemaMismatchError(
                    f"group-by {base!r}: key column {k!r} has type "
                    f"{input_schema.field(k).type}, which cannot be grouped on"
                ) from exc
            self._key_codecs.append(KeyCodec([k], plan, f"group-by {base!r}"))
        self._handlers = [make(i, spec, input_schema, self._fail, self._minmax.slot)
                          for i, spec in enumerate(self.aggs)]
        self._extremes = [h for h in self._handlers if isinstance(h, Extreme)]
        self.state_schema = pa.schema(
            [pa.field(f"k{j}", input_schema.field(k).type) for j, k in enumerate(self.keys)]
            + [pa.field("n", _I64)]
            + [f for h in self._handlers for f in h.fields()]
        )
        self.output_schema: pa.Schema = pa.schema(
            [input_schema.field(k) for k in self.keys]
            + [pa.field(h.spec.name, h.out_type()) for h in self._handlers]
        )
        self._codec = RowCodec(self.state_schema)
        # Old and new output rows of a stored group share their key columns (both are
        # the group's canonical key), so whether a group's output changed is decided on
        # the aggregate columns alone: encoding the keys (q4: seven strings) twice per
        # push cost more than the rest of the comparison.
        self._value_codec = RowCodec(pa.schema(list(self.output_schema)[len(self.keys):]))
        self._columns = list(dict.fromkeys(
            self.keys + [a.column for a in self.aggs if a.column is not None]
        ))
        for name in self.column_families():
            store.cf(name)

    # ---- validation -------------------------------------------------------------------

    def _fail(self, msg: str) -> SchemaMismatchError:
        return SchemaMismatchError(f"group-by {self.base!r}: {msg}")

    def _check_keys(self) -> None:
        names = self.input_schema.names
        for k in self.keys:
            if not isinstance(k, str) or k not in names:
                raise self._fail(f"key column {k!r} is not an input column (columns: {names})")
        if len(set(self.keys)) != len(self.keys):
            raise self._fail(f"key columns {self.keys} repeat a column")
        seen: set[str] = set(self.keys)
        for a in self.aggs:
            if not isinstance(a.name, str) or not a.name or a.name == WEIGHT:
                raise self._fail(f"aggregate name {a.name!r} is not a usable column name")
            if a.name in seen:
                raise self._fail(f"output column {a.name!r} appears twice (keys and aggregates "
                                 "share one namespace)")
            seen.add(a.name)
            if a.func not in FUNCS:
                raise self._fail(f"aggregate {a.name!r}: unknown function {a.func!r} "
                                 f"(supported: {', '.join(FUNCS)})")
            if a.column is None:
                if a.func != "count":
                    raise self._fail(f"aggregate {a.name!r}: {a.func} needs a column; only "
                                     "count takes None (count(*))")
            elif a.column not in names:
                raise self._fail(f"aggregate {a.name!r}: {a.func}({a.column!r}): no such input "
                                 f"column (columns: {names})")

    def _conform(self, delta: pa.Table | pa.RecordBatch, w: np.ndarray) -> tuple[
        pa.Table, np.ndarray
    ]:
        if isinstance(delta, pa.RecordBatch):
            delta = pa.Table.from_batches([delta])
        if not isinstance(delta, pa.Table):
            raise self._fail(f"a delta must be a pyarrow Table, got {type(delta).__name__}")
        w = np.asarray(w)
        if w.shape != (delta.num_rows,) or not np.issubdtype(w.dtype, np.integer):
            raise self._fail(f"weights must be {delta.num_rows} integers, got {w.dtype} "
                             f"{w.shape}")
        w = w.astype(np.int64, copy=False)
        arrays = []
        for c in self._columns:
            if c not in delta.column_names:
                raise self._fail(f"the delta has no column {c!r}")
            want = self.input_schema.field(c).type
            col = contiguous(delta.column(c))
            if not col.type.equals(want):
                try:
                    col = pc.cast(col, want, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise self._fail(f"column {c!r} has type {col.type}, not the declared "
                                     f"{want}: {exc}") from exc
            arrays.append(col)
        names = self._columns
        if not names:  # count(*) of everything: a table without columns would lose its rows
            arrays, names = [pa.nulls(delta.num_rows)], ["__rows"]
        table = pa.Table.from_arrays(arrays, names=names)
        if (w == 0).any():
            keep = np.flatnonzero(w)
            table, w = table.take(pa.array(keep)), w[keep]
        return table, np.ascontiguousarray(w)

    # ---- public -----------------------------------------------------------------------

    def column_families(self) -> tuple[str, ...]:
        """The groups' family, and the min/max multiset's if there is a min or max."""
        return (self.cf, self.values_cf) if self._extremes else (self.cf,)

    def rows(self) -> int:
        """Number of groups stored (a counter: O(1))."""
        return self.store.counter(self.cf, "entries")

    def state(self) -> pa.Table:
        """The full current output: one row per group (no ``_weight``).

        Without group keys there is always exactly one row: :meth:`empty_row` while no
        row is counted (SQL's aggregate over no input).
        """
        values = _rocks.iter_values(self.store.cf(self.cf), self.store.path, f"scan {self.cf}")
        if not values:
            return self.output_schema.empty_table() if self.keys else self.empty_row()
        return self._output(self._codec.decode(Bytes.from_list(values)))

    def empty_row(self) -> pa.Table:
        """The output row of a group without rows: count(*) and counts 0, the rest NULL.

        What an aggregate without group keys reads over an empty input (SQL, DuckDB).
        """
        state = pa.Table.from_arrays([pa.nulls(1, f.type) for f in self.state_schema],
                                     schema=self.state_schema)
        return self._output(state)

    def stage(self, delta: pa.Table | pa.RecordBatch, w: np.ndarray, txn: Transaction) -> tuple[
        pa.Table, np.ndarray
    ]:
        """Fold a change set into the state (staged into ``txn``); return the output change.

        ``w`` are the rows' weights (int64, unconsolidated: repeated rows and +/- are
        fine).  Reads the stored state of the touched groups (one multi-get), validates
        everything, then stages the writes -- so an :class:`OverRetractionError` or
        :class:`WeightOverflowError` leaves nothing staged.  The output holds, for every
        group whose output row changed, the old row with -1 (if it existed) and the new
        row with +1 (if the group still has rows); without group keys the row always
        exists (see :meth:`empty_row`), so the output replaces it.  Reads see the state
        before ``txn``: call it at most once per transaction.
        """
        table, w = self._conform(delta, w)
        if table.num_rows == 0:
            return self.output_schema.empty_table(), np.zeros(0, np.int64)
        canon = self._key_canon(table)
        groups = group_bytes(canon)
        n_groups, inv, first = len(groups), groups.inv, groups.first
        gcanon = canon.take(first)
        gkeys = Bytes.concat_rows([prefix_bytes(hash_prefix(gcanon)), gcanon])
        gkey_list = gkeys.to_list()

        txn.note_read()
        raw = _rocks.multi_get(self.store.cf(self.cf), gkey_list, self.store.path,
                               f"read {self.cf}")
        present = np.fromiter((v is not None for v in raw), dtype=bool, count=n_groups)
        old = self._expand(raw, present)

        def describe(g: int) -> str:
            r = int(first[g])
            vals = tuple(table.column(k)[r].as_py() for k in self.keys)
            key = f"{self.keys} = {vals[0] if len(vals) == 1 else vals!r}" if vals else "()"
            return f"group-by {self.base!r}, group {key}"

        n_old = i64(old.column("n"))
        n_delta = checked_sum_by(inv, w, n_groups, "a group's count(*)")
        n_new = checked_add(n_old, n_delta, "a group's count(*)")
        bad = np.flatnonzero(n_new < 0)
        ctx = Fold(table, w, inv, n_groups, old, n_new, describe, n_delta)
        if len(bad):
            g = int(bad[0])
            raise ctx.over(g, "count(*)", int(n_old[g]), int(n_new[g]))
        writes = (self._minmax.fold(ctx, self._extremes, gkeys, gkey_list)
                  if self._extremes else None)
        firsts = table.take(pa.array(first))
        new_cols: list[pa.Array] = [canonical(contiguous(firsts.column(k))) for k in self.keys]
        new_cols.append(pa.array(n_new, _I64))
        for h in self._handlers:
            new_cols += h.fold(ctx)
        new = pa.Table.from_arrays(new_cols, schema=self.state_schema)

        # Every check passed: compute the output change and stage the writes.  The old
        # and the new rows go through the output functions together (rows g and
        # n_groups + g): one call per function, not two.
        both = self._output(pa.concat_tables([old, new]))
        same = self._same_values(both, n_groups)
        alive = n_new > 0
        # Without group keys the one group's output row exists whether or not it has
        # rows (its empty form is empty_row(), what _output makes of an absent state):
        # it changes, never appears or disappears.
        shown, kept = (present, alive) if self.keys else (np.ones_like(present),) * 2
        emit_old = np.flatnonzero(shown & ~(kept & same))
        emit_new = np.flatnonzero(kept & ~(shown & same))
        out = both.take(pa.array(np.concatenate([emit_old, emit_new + n_groups])))
        out_w = np.concatenate([np.full(len(emit_old), -1, np.int64),
                                np.ones(len(emit_new), np.int64)])

        new_enc = self._codec.encode(new)
        unchanged = present & new_enc.equals(
            Bytes.from_list([b"" if v is None else v for v in raw]))
        put = np.flatnonzero(alive & ~unchanged)
        gone = np.flatnonzero(present & ~alive)
        put_values = new_enc.take(put).to_list()
        written = put.tolist() + gone.tolist()
        keys = [gkey_list[i] for i in written]
        values: list[bytes | None] = [*put_values, *([None] * len(gone))]
        # ``raw`` is what these keys held before ``txn``: an undo capture need not read it.
        txn.put_many(self.cf, keys, values,
                     prior=None if txn.undo is None else [raw[i] for i in written])
        txn.add(self.cf, "entries", int((alive & ~present).sum()) - len(gone))
        txn.add(self.cf, "rows", checked_sum(n_new - n_old, f"rows of {self.cf}"))
        if writes is not None:
            vkeys, vvalues, d_entries, d_rows = writes
            txn.put_many(self.values_cf, vkeys, vvalues)
            txn.add(self.values_cf, "entries", d_entries)
            txn.add(self.values_cf, "rows", d_rows)
        return out, out_w

    # ---- internals --------------------------------------------------------------------

    def _key_canon(self, table: pa.Table) -> Bytes:
        """Per row: for each key column a NULL marker byte then its canonical key bytes."""
        n = table.num_rows
        parts: list[Bytes] = []
        for codec in self._key_codecs:
            body, null = codec.encode(table)
            parts.append(Bytes.from_fixed((~null).astype(np.uint8).reshape(n, 1)))
            parts.append(body)
        if not parts:
            return Bytes.from_fixed(np.zeros((n, 0), dtype=np.uint8))
        return Bytes.concat_rows(parts)

    def _expand(self, raw: list[bytes | None], present: np.ndarray) -> pa.Table:
        """The stored state of every touched group (NULL fields for absent groups)."""
        idx = np.flatnonzero(present)
        if len(idx):
            stored = self._codec.decode(Bytes.from_list([raw[i] or b"" for i in idx.tolist()]))
        else:
            stored = self.state_schema.empty_table()
        pos = np.full(len(raw), -1, dtype=np.int64)
        pos[idx] = np.arange(len(idx))
        return stored.take(pa.array(pos, type=_I64, mask=pos < 0))

    def _same_values(self, both: pa.Table, n: int) -> np.ndarray:
        """Per group, whether its aggregate values are unchanged (meaningful where stored).

        ``both``: the ``n`` groups' old output rows, then their new ones.
        """
        if not self._handlers:  # keys only: a stored group's output row never changes
            return np.ones(n, dtype=bool)
        k = len(self.keys)
        vals = pa.Table.from_arrays(both.columns[k:], schema=self._value_codec.schema)
        enc = self._value_codec.encode(vals)
        return enc.take(np.arange(n)).equals(enc.take(np.arange(n, 2 * n)))

    def _output(self, st: pa.Table) -> pa.Table:
        cols = [contiguous(st.column(f"k{j}")) for j in range(len(self.keys))]
        cols += [h.output(st) for h in self._handlers]
        return pa.Table.from_arrays(cols, schema=self.output_schema)
