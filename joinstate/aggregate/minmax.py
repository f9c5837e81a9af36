"""The min/max multiset of a group-by: every (group, column, value) with its multiplicity.

``agg[<base>].minmax`` (:func:`joinstate.names.aggregate_values_cf`), only when the
group-by has a min or max: key = group key (:mod:`joinstate.aggregate.state`) + one slot
byte (which min/max input column) + the value's order-preserving bytes
(:mod:`joinstate.aggregate.values`); value = its multiplicity, int64 little-endian.
Bytewise key order is value order, so after a retraction of a group's extreme the new
one is the first (min) or last (max) surviving entry under ``group key + slot``: one
bounded iterator read per group whose extreme went away, never a scan of the group.
Counters: ``entries`` = distinct (group, column, value), ``rows`` = their total.

Why a family of its own and not a list in the group's row: a group can hold millions of
rows; rewriting its row on every change would cost O(group).  The group's row keeps only
the current extreme (:class:`~joinstate.aggregate.functions.Extreme`), which this module
recomputes for the groups a batch touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import rocksdict as rd

from joinstate import _rocks
from joinstate._bytes import Bytes
from joinstate.aggregate.values import (
    best,
    better,
    contiguous,
    group_bytes,
    order_encode,
    valid_mask,
)
from joinstate.errors import SchemaMismatchError
from joinstate.names import aggregate_values_cf
from joinstate.zset import checked_add, checked_sum, checked_sum_by

if TYPE_CHECKING:
    from collections.abc import Sequence

    from joinstate.aggregate.functions import Extreme, Fold
    from joinstate.db import Database

__all__ = ["MAX_SLOTS", "MinMax", "Writes"]

MAX_SLOTS = 255
"""Min/max input columns of one group-by: the slot byte, and slot + 1 bounds a seek."""
_BIN = pa.large_binary()


class _Pairs(NamedTuple):
    """The (group, value) multiset entries one batch changes, for one min/max column."""

    slot: int
    rows: np.ndarray  # a row of the batch holding each entry's value
    groups: np.ndarray  # each entry's group
    values: Bytes  # each entry's order bytes
    keys: list[bytes]
    dv: np.ndarray  # each entry's weight change (non-zero)


class _Left(NamedTuple):
    """What the multiset entries of one min/max column look like after the batch."""

    alive: np.ndarray  # entries (of _Pairs) still counted
    zeroed: np.ndarray  # entries the batch deletes
    values: pa.Array  # every entry's order bytes
    skip: set[bytes]  # the keys of the deleted entries


class Writes(NamedTuple):
    """The multiset writes of one batch: keys, values (None deletes), counter deltas."""

    keys: list[bytes]
    values: list[bytes | None]
    entries: int
    rows: int


class MinMax:
    """The value multiset of one group-by's min/max columns (``agg[<base>].minmax``)."""

    def __init__(self, store: Database, base: str) -> None:
        self.store = store
        self.base = base
        self.cf = aggregate_values_cf(base)
        self.slots: list[tuple[str, str]] = []  # (column, order kind) per min/max column

    def slot(self, column: str, kind: str) -> int:
        """The slot of min/max input ``column`` (several aggregates of one column share it)."""
        slot = next((s for s, (c, _) in enumerate(self.slots) if c == column), None)
        if slot is None:
            if len(self.slots) == MAX_SLOTS:
                raise SchemaMismatchError(
                    f"group-by {self.base!r}: more than {MAX_SLOTS} distinct min/max columns")
            slot = len(self.slots)
            self.slots.append((column, kind))
        return slot

    def _pairs(self, ctx: Fold, gkeys: Bytes) -> list[_Pairs]:
        """The multiset entries the batch changes, per min/max column (consolidated)."""
        found = []
        for slot, (column, kind) in enumerate(self.slots):
            vals, rows = ctx.valid_rows(column)
            if not len(rows):
                continue
            venc = order_encode(vals, kind)
            tag = Bytes.from_fixed(np.full((len(rows), 1), slot, dtype=np.uint8))
            pk = Bytes.concat_rows([gkeys.take(ctx.inv[rows]), tag, venc])
            pg = group_bytes(pk)
            dv = checked_sum_by(pg.inv, ctx.w[rows], len(pg),
                                f"group-by {self.base!r}: the weight of a {column!r} value")
            live = np.flatnonzero(dv)
            at = pg.first[live]
            found.append(_Pairs(slot, rows[at], ctx.inv[rows[at]], venc.take(at),
                                pk.take(at).to_list(), dv[live]))
        return found

    def fold(self, ctx: Fold, extremes: Sequence[Extreme], gkeys: Bytes,
             gkey_list: list[bytes]) -> Writes:
        """New min/max of every touched group; the multiset writes to stage.

        One multi-get reads every changed (group, value) count -- except where the
        group has no value of the column stored (a new group, or only NULLs so far):
        there is nothing to read, and loading a fresh group-by reads nothing at all.
        A group whose stored extreme is retracted to zero is re-read with one bounded
        seek under its prefix, skipping the entries this batch deletes (reads see the
        state before it).  Sets ``ctx.extremes`` for every handler of ``extremes``.
        """
        stored = {h.slot: valid_mask(contiguous(ctx.old.column(h.f))) for h in extremes}
        per_slot = {p.slot: p for p in self._pairs(ctx, gkeys)}
        reads = {slot: np.flatnonzero(stored[slot][p.groups]) for slot, p in per_slot.items()}
        got = _rocks.multi_get(
            self.store.cf(self.cf),
            [p.keys[i] for slot, p in per_slot.items() for i in reads[slot].tolist()],
            self.store.path, f"read {self.cf}",
        )
        got_counts = np.fromiter(
            (0 if v is None else int.from_bytes(v, "little", signed=True) for v in got),
            dtype=np.int64, count=len(got),
        )
        vkeys: list[bytes] = []
        vvalues: list[bytes | None] = []
        d_entries = d_rows = 0
        at = 0
        left: dict[int, _Left] = {}
        for slot, p in per_slot.items():
            column = self.slots[slot][0]
            old = np.zeros(len(p.keys), dtype=np.int64)
            old[reads[slot]] = got_counts[at : at + len(reads[slot])]
            at += len(reads[slot])
            what = f"group-by {self.base!r}: the multiplicity of a {column!r} value"
            new = checked_add(old, p.dv, what)
            bad = np.flatnonzero(new < 0)
            if len(bad):
                i = int(bad[0])
                value = ctx.table.column(column)[int(p.rows[i])].as_py()
                raise ctx.over(int(p.groups[i]), f"the multiplicity of {column} = {value!r}",
                               int(old[i]), int(new[i]))
            vkeys += p.keys
            vvalues += [None if c == 0 else c.to_bytes(8, "little", signed=True)
                        for c in new.tolist()]
            d_entries += int((new > 0).sum()) - int((old > 0).sum())
            d_rows += checked_sum(p.dv, what)
            zeroed = np.flatnonzero(new == 0)
            left[slot] = _Left(np.flatnonzero(new > 0), zeroed, p.values.arrow(),
                               {p.keys[i] for i in zeroed.tolist()})
        for h in extremes:
            ctx.extremes[h.f] = self._extreme(ctx, h, per_slot.get(h.slot), left.get(h.slot),
                                              gkey_list)
        return Writes(vkeys, vvalues, d_entries, d_rows)

    def _extreme(self, ctx: Fold, h: Extreme, p: _Pairs | None, left: _Left | None,
                 gkey_list: list[bytes]) -> pa.Array:
        """The new extreme of ``h`` for every touched group.

        The stored extreme stays a candidate unless the batch deleted its entry; then
        the group's surviving stored entries are sought.  The best value the batch
        leaves alive is the other candidate.
        """
        stored = contiguous(ctx.old.column(h.f)).cast(_BIN)
        if p is None or left is None:
            return stored
        alive = left.alive
        cand = best(p.groups[alive], left.values.take(pa.array(alive)), ctx.n_groups,
                     h.largest)
        gone = np.zeros(ctx.n_groups, dtype=bool)
        z = left.zeroed
        if len(z):
            zg = p.groups[z]
            hit = pc.fill_null(pc.equal(left.values.take(pa.array(z)), stored.take(pa.array(zg))),
                               False)
            gone[zg[np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)]] = True
        if gone.any():
            g_idx = np.flatnonzero(gone)
            tag = bytes([h.slot])
            found = self._seek([gkey_list[g] + tag for g in g_idx.tolist()], left.skip,
                               h.largest)
            pos = np.arange(ctx.n_groups, dtype=np.int64)
            pos[g_idx] = ctx.n_groups + np.arange(len(g_idx))
            stored = pa.concat_arrays([stored, pa.array(found, _BIN)]).take(pa.array(pos))
        return better(stored, cand, h.largest)

    def _seek(self, prefixes: list[bytes], skip: set[bytes], largest: bool) -> list[
        bytes | None
    ]:
        """Per prefix, the first (last) stored value under it whose key is not in ``skip``.

        Bounded: besides the answer, the walk only visits keys in ``skip`` (entries the
        batch deletes), so the cost is O(retractions), never O(group).
        """
        ro = rd.ReadOptions()
        ro.set_total_order_seek(True)
        out: list[bytes | None] = []
        path, what = self.store.path, f"read {self.cf}"
        with _rocks.rocks_errors(path, what):
            it = self.store.cf(self.cf).iter(ro)
            try:
                for p in prefixes:
                    found: bytes | None = None
                    upper = p
                    if largest:
                        upper = p[:-1] + bytes([p[-1] + 1])
                        it.seek_for_prev(upper)
                        step = it.prev
                    else:
                        it.seek(p)
                        step = it.next
                    while it.valid():
                        k = it.key()
                        if not k.startswith(p):
                            if largest and k >= upper:
                                step()  # exactly ``upper``: the next slot's empty value
                                continue
                            break
                        if k in skip:
                            step()
                            continue
                        found = k[len(p):]
                        break
                    it.status()  # raises if the walk stopped on an error, not the end
                    out.append(found)
            finally:
                del it
        return out
