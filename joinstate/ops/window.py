"""The window operator: window functions kept by recomputing the partitions a change touches.

State: an index of the input's rows by partition (its own column families, named
``ix.<pipeline>~<input>~<window>[<key>]`` so that inspect, verify and drop see an index
of the input owned by this operator).  The key is a column the operator adds: the
partition columns encoded as one value (:class:`~joinstate.codec.RowCodec`, NULL-aware),
so a NULL partition value is a partition like any other and a window without
PARTITION BY keys every row alike (one partition).

A push, for the partitions its change touches (one probe of the index for all of them):

1. the stored rows are read (the state before the push), the change is staged into the
   index (an over-retraction raises here, nothing written);
2. the partitions' rows before and after the change are put side by side as two
   partitions each (``2q`` old, ``2q + 1`` new), every row repeated as many times as it
   is held, and the window functions of all of them are computed in one vectorised pass
   (:func:`joinstate.windowfn.evaluate`);
3. the output is the new rows' outputs minus the old ones', consolidated: a row whose
   outputs did not change cancels out (a rank above an inserted row, any row of a
   partition a ROWS frame reaches only after the change).

With ``top`` (a maintained top-N) only rows within the bound are emitted, before and
after: a retraction that pulls a row from beyond N into the top emits it, because the
whole partition was recomputed from its stored rows.

Cost: every push re-reads and re-sorts each partition it touches, O(r log r) for r rows
held there, whatever the size of the change: a change of one row of a window without
PARTITION BY reads every row (from the index's in-memory probe cache once the index
decides that scanning is cheaper than seeking, as a join's index does).  The output is
as large as the window values that change: a SUM over a partition changes on every row
of it.  On the recompute path (chosen per push) the touched partitions are read by one
scan of the whole index instead of by key: cheaper when the change touches most of them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate import windowfn
from joinstate._bytes import Bytes
from joinstate._index import Index
from joinstate.codec import RowCodec
from joinstate.errors import StateCorruptedError, WeightOverflowError
from joinstate.keys import KeyCodec, key_plan, row_hash
from joinstate.names import window_rows_cf
from joinstate.ops.base import Delta, IndexedOperator, PushContext, as_schema
from joinstate.schema import WEIGHT
from joinstate.side import Side
from joinstate.zset import consolidate

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from joinstate._probe import Entries
    from joinstate.batch import PreparedBatch
    from joinstate.db import Database
    from joinstate.nodes import WindowNode
    from joinstate.physical import PhysicalPlan

__all__ = ["WindowOp"]

_PART = "__partition"
MAX_ROWS = 100_000_000
"""Rows (with multiplicity) one push may recompute: every copy of a row is a row of its
partition (row_number and ROWS frames number them), expanded in memory."""


class WindowOp(IndexedOperator):
    """Window functions of a :class:`~joinstate.nodes.WindowNode` over its input's rows."""

    node: WindowNode

    def __init__(self, node: WindowNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        inp = node.inputs[0]
        self.in_columns: list[str] = list(plan.columns[inp.id])
        in_schema = plan.schemas[inp.id]
        key = _PART
        while key in self.in_columns:
            key = "_" + key
        self.key = key
        self.stored = in_schema.append(pa.field(key, pa.large_binary(), nullable=False))
        self.part_codec = RowCodec(pa.schema([in_schema.field(c) for c in node.partition_by]))
        tops = {c for c, _ in node.top}
        self.funcs = [f for f in node.funcs if f[0] in self.columns or f[0] in tops]
        self.types = [node.schema.field(f[0]).type for f in self.funcs]
        self.match = _match_column(in_schema, node)
        """A column telling stored rows apart from a retracted one cheaply (see _after)."""

    # ---- state ---------------------------------------------------------------------------

    def open(self, store: Database, pipeline: str) -> None:
        """The index of the input's rows by partition (created if new)."""
        node = self.node
        plan = key_plan(self.stored, [self.key], self.stored, [self.key])
        side = Side(self.stored, [self.key])
        cf = window_rows_cf(pipeline, node.inputs[0].label, node.label, self.key)
        idx = Index(store, cf, node.label, side,  # type: ignore[arg-type]
                    KeyCodec([self.key], plan, node.label), track_degree=False)
        for name in idx.column_families():
            store.cf(name)
        idx.restore_cache()
        self.index = idx

    recomputable = True

    def scanned_indexes(self, indexes: Mapping[int, Index], changed: Sequence[bool]
                        ) -> list[Index]:
        """Its own index: the recompute path reads every partition in one scan."""
        return [self.state()]

    def explain_state(self) -> list[str]:
        """Where the rows are, and what a change costs (rows per touched partition)."""
        idx = self.state()
        rows = idx.rows
        parts = idx.count_distinct_keys() if rows else 0
        per = f"{rows / parts:,.0f}" if parts else "0"
        top = (" (maintained top-N: emits only rows where "
               + " or ".join(f"{c} <= {n}" for c, n in self.node.top) + ")"
               if self.node.top else "")
        return [f"window {self.node.label}: rows by partition in {idx.cf} ({rows:,} rows in "
                f"{parts:,} partition(s), {per} per partition); a change re-reads and "
                f"recomputes each partition it touches: cost ~ rows of the touched "
                f"partitions, not of the change{top}; reads them by key (incremental) or "
                "by one scan of the index (recompute), chosen per batch by population.apply"]

    # ---- pushes --------------------------------------------------------------------------

    def partitions(self, rows: pa.Table) -> pa.Array:
        """Each row's partition, encoded (NULL-aware); the same for all without PARTITION BY."""
        n = rows.num_rows
        if not self.node.partition_by:
            empty = Bytes(np.zeros(0, np.uint8), np.zeros(n + 1, np.int64), 0)
            return empty.arrow()
        return self.part_codec.encode(rows.select(list(self.node.partition_by))).arrow()

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """Stage the change; the touched partitions' new outputs minus their old ones."""
        assert ins[0] is not None
        table, w = ins[0]
        idx = self.state()
        rows = table.select(self.in_columns)
        rows = rows.append_column(self.stored.field(self.key), self.partitions(rows))
        batch = idx.prepare(rows.append_column(pa.field(WEIGHT, pa.int64()),
                                               pa.array(w, pa.int64())))
        if not batch.rows:
            return None
        first = batch.keys.first
        old = ctx.probe(self, idx, batch.canon.take(first), batch.khash[first])
        idx.stage(batch, ctx.txn)  # raises (nothing written) for an over-retraction
        ctx.txn.after_commit(functools.partial(idx.after_write, batch))
        return self._difference(old, batch, len(first))

    def _difference(self, old: Entries, batch: PreparedBatch, groups: int) -> Delta | None:
        if len(old.w) and int(old.w.min()) <= 0:
            raise StateCorruptedError(
                f"window {self.node.label}: its index {self.state().cf} holds a row with "
                f"multiplicity {int(old.w.min())}; restore the state from a copy or "
                "repopulate")
        # Every distinct row once (the stored ones, then the change's); each partition
        # before (2q) and after (2q + 1) the change is a list of indexes into it, a row
        # repeated as many times as it is held.
        base = pa.concat_tables([old.rows, batch.table])
        new_idx, new_w, new_q = self._after(old, batch, groups)
        total = float(old.w.sum()) + float(new_w.sum())
        if total > MAX_ROWS:
            raise WeightOverflowError(
                f"window {self.node.label}: the partitions this change touches hold "
                f"{total:,.0f} rows counted with their multiplicities (a row held k times is "
                f"k rows of its partition), more than the {MAX_ROWS:,} one push recomputes; "
                "nothing was applied (split the partitions, or hold fewer copies of a row)")
        o = np.repeat(np.arange(len(old.w), dtype=np.int64), old.w)
        rows = np.concatenate([o, np.repeat(new_idx, new_w)])
        part = np.concatenate([old.q[o] * 2, np.repeat(new_q, new_w) * 2 + 1])
        label = self.node.label
        perm, values = windowfn.evaluate(base, rows, part, self.node.order_by, self.funcs,
                                         self.types, lambda: f"window {label}")
        sign = np.where(part[perm] & 1 == 1, 1, -1).astype(np.int64)
        at = rows[perm]
        by_name = dict(zip([f[0] for f in self.funcs], values, strict=True))
        keep = self._top(base, at, by_name)
        if keep is not None:
            sel = np.flatnonzero(keep)
            at, sign = at[sel], sign[sel]
            by_name = {k: v.take(pa.array(sel)) for k, v in by_name.items()}
        if not len(at):
            return None
        take = pa.array(at)
        cols = [by_name[c] if c in by_name else base.column(c).take(take)
                for c in self.columns]
        out = as_schema(pa.Table.from_arrays(cols, names=self.columns), self.schema)
        if not len(old.w):  # nothing to cancel: every output row is new
            return out, sign
        return self.consolidated([(out, sign)])

    def _after(self, old: Entries, batch: PreparedBatch, groups: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The touched partitions after the change: rows, multiplicities, partitions.

        Rows are indexes of the stored rows, then of the change's.
        Partitions the change only inserts into are their stored rows plus the new ones.
        Where it retracts, a retracted row cancels stored copies equal to it in every
        column: only stored rows equal to a retracted one in one (non-float) column are
        candidates, and those and the change are consolidated; the others are kept as
        they are, so a retraction costs a pass of ``is_in`` over the partition, not an
        encoding of each of its rows.
        """
        d_w, d_q = batch.w, batch.keys.inv
        n_old = len(old.w)
        retracts = np.zeros(groups, dtype=bool)
        retracts[d_q[d_w < 0]] = True
        if not retracts.any():
            return (np.arange(n_old + len(d_w), dtype=np.int64), np.concatenate([old.w, d_w]),
                    np.concatenate([old.q, d_q]))
        cand = retracts[old.q]
        d_mix = retracts[d_q]
        if self.match is not None and n_old:
            gone = batch.table.column(self.match).take(pa.array(np.flatnonzero(d_w < 0)))
            cand &= pc.is_in(old.rows.column(self.match), value_set=gone.combine_chunks(),
                             skip_nulls=False).to_numpy(zero_copy_only=False)
        o_c, d_c = np.flatnonzero(cand), np.flatnonzero(d_mix)
        mixed = np.concatenate([o_c, n_old + d_c])
        mw = np.concatenate([old.w[o_c], d_w[d_c]])
        mq = np.concatenate([old.q[o_c], d_q[d_c]])
        enc = self.state().row_codec.encode(
            pa.concat_tables([old.rows.take(pa.array(o_c)), batch.table.take(pa.array(d_c))]))
        first, sums = consolidate(row_hash(enc), enc, mw,
                                  f"window {self.node.label}: the summed weight of a row")
        if len(sums) and int(sums.min()) < 0:  # the index's stage refuses this first
            raise StateCorruptedError(f"window {self.node.label}: a partition would hold a "
                                      "row a negative number of times")
        o_p, d_p = np.flatnonzero(~cand), np.flatnonzero(~d_mix)
        return (np.concatenate([o_p, n_old + d_p, mixed[first]]),
                np.concatenate([old.w[o_p], d_w[d_p], sums]),
                np.concatenate([old.q[o_p], d_q[d_p], mq[first]]))

    def _top(self, table: pa.Table, at: np.ndarray, values: dict[str, pa.Array]
             ) -> np.ndarray | None:
        """Rows within the top-N bound (None: no bound, every row)."""
        if not self.node.top:
            return None
        keep = np.zeros(len(at), dtype=bool)
        for col, n in self.node.top:
            v = values[col] if col in values else table.column(col).take(pa.array(at))
            arr = v.to_numpy(zero_copy_only=False) if v.null_count == 0 else \
                np.asarray(v.fill_null(n + 1).to_numpy(zero_copy_only=False))
            keep |= arr <= n
        return keep


def _match_column(schema: pa.Schema, node: WindowNode) -> str | None:
    """The first column whose equality ``is_in`` decides as the row encoding does.

    Floats are not (NaN, -0.0); partition columns are the same on every row of a
    partition.  ORDER BY columns first: they tell rows apart best.
    """
    order = [c for c, _, _ in node.order_by]
    rest = [c for c in schema.names if c not in order and c not in node.partition_by]
    for c in order + rest:
        t = schema.field(c).type
        if not (pa.types.is_floating(t) or pa.types.is_nested(t)):
            return c
    return None
