"""The binary join operator: an equi-join of two streams, from their indexes.

What a join outputs is :class:`joinstate.joinrule.JoinRule`'s to say (the rule
:class:`joinstate.Join` and population's recompute apply too); this operator decides
what to read:

* An inner join with one changed input uses the classic rule ΔS ⋈ O: probe the other
  input's index with the changed keys (:meth:`JoinOp.one_side`).
* An inner join with both inputs changed (a self-join, a diamond, a push to several
  sources) adds the two one-sided probes and the changes joined to each other
  (:meth:`JoinOp.both_sides`).
* Any other join recomputes the join on the changed keys only: read both inputs'
  stored rows of those keys, and emit J(new) - J(old) for them
  (:meth:`JoinOp.recompute`); outer, semi and anti joins are not bilinear.
* Rows whose key is NULL never match: a preserved side emits them as they come.

Either way the stored rows are read by key, or, on the recompute path, by one scan of
each index read (:meth:`~joinstate.ops.base.PushContext.probe`): the same rows, so the
same output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa

from joinstate._bytes import Bytes
from joinstate._probe import Entries
from joinstate.joinrule import JoinRule
from joinstate.ops.keyed import KeyedOperator
from joinstate.zset import group_keys

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from joinstate._index import Index
    from joinstate.nodes import JoinNode
    from joinstate.ops.base import Delta, PushContext
    from joinstate.ops.keyed import Keyed
    from joinstate.physical import PhysicalPlan

__all__ = ["JoinOp"]


class JoinOp(KeyedOperator):
    """Inner, left, right, full, left semi and left anti equi-joins."""

    node: JoinNode

    def __init__(self, node: JoinNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        lmap = dict(zip(node.out_left, node.inputs[0].schema.names, strict=True))
        rmap = (dict(zip(node.out_right, node.inputs[1].schema.names, strict=True))
                if node.out_right else {})
        sources = [(0, lmap[f.name]) if f.name in lmap else (1, rmap[f.name])
                   for f in self.schema]
        self.rule = JoinRule(node.how, self.schema, sources, node.label)

    def scanned_indexes(self, indexes: Mapping[int, Index], changed: Sequence[bool]
                        ) -> list[Index]:
        """The other input's index when one input of an inner join changes, else both."""
        if self.node.how == "inner" and sum(changed) == 1:
            return [indexes[id(self.readers[1 - list(changed).index(True)].plan)]]
        return super().scanned_indexes(indexes, changed)

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """ΔS ⋈ O for an inner join with one changed input, else a recomputation.

        A change that cancels out (``-X, +X``) is consolidated: it changes nothing, and
        probed it would fan out.  It is consolidated before probing, so the keys of
        what cancels are not read, unless the other input's index is held in memory
        with one entry per key (a dimension): then the probe is a hash lookup that finds
        at most one row per changed key, and only the rows whose key found a partner
        are consolidated, after it (:meth:`one_side`).  A change that has fanned out
        from a dimension row reaches the next join as thousands of rows, most of whose
        keys a filtered dimension does not hold: hashing them all to find the few that
        cancel would cost more than the lookup.
        """
        if self.node.how == "inner" and sum(d is not None for d in ins) == 1:
            s = 0 if ins[0] is not None else 1
            other = ctx.index(self.readers[1 - s].plan)
            held = other.cache is not None and other.layout.one_entry_per_key
            return self.one_side(ins if held else self.cancelled(ins), ctx,
                                 cancel_matched=held)
        ins = self.cancelled(ins)
        if all(d is None for d in ins):
            return None
        if self.node.how == "inner":
            if any(d is None for d in ins):
                return self.one_side(ins, ctx)
            return self.both_sides(ins, ctx)
        return self.recompute(ins, ctx)

    def both_sides(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """An inner join with both inputs changed: ΔL ⋈ R + L ⋈ ΔR + ΔL ⋈ ΔR.

        L and R are the inputs before the push (what the indexes hold), so each
        one-sided term probes only the other input's index, with only its own changed
        keys: a batch that changes a fact table and its dimension together reads the
        dimension for the facts' keys and the facts for the dimension's keys, as two
        pushes would, never the fact index for the facts' own keys (which
        :meth:`recompute` would).  The last term pairs the two changes in memory.
        """
        keyed = self.keyed(ins)
        parts = [out for out in (self.one_side([ins[0], None], ctx, keyed=keyed[0]),
                                 self.one_side([None, ins[1]], ctx, keyed=keyed[1]))
                 if out is not None]
        if all(k is not None and len(k[4]) for k in keyed):
            # Only rows whose key the other change also has can pair: a dimension row's
            # fan-out (a million rows) meeting a few facts' changes is not grouped whole.
            present = cast("list[Keyed]", keyed)
            hit = [np.flatnonzero(np.isin(present[0][3], present[1][3])),
                   np.flatnonzero(np.isin(present[1][3], present[0][3]))]
            if not len(hit[0]) or not len(hit[1]):
                return _summed(parts)
            present = [(t, w, canon.take(h) if len(h) != len(nn) else canon, kh[h], nn[h])
                       for (t, w, canon, kh, nn), h in zip(present, hit, strict=True)]
            kg = group_keys(np.concatenate([k[3] for k in present]),
                            Bytes.concat([k[2] for k in present]))
            sides: list[Entries] = []
            offset = 0
            for pos, (table, w, _, _, nn) in enumerate(present):
                r = self.readers[pos]
                schema = r.empty(ctx.index(r.plan).schema).schema
                rows = table.take(pa.array(nn)).select(r.columns).cast(schema)
                sides.append(Entries(rows, w[nn], kg.inv[offset:offset + len(nn)]))
                offset += len(nn)
            parts += self.rule.join(sides[0], sides[1], len(kg))
        return _summed(parts)

    def one_side(self, ins: list[Delta | None], ctx: PushContext, *,
                 cancel_matched: bool = False, keyed: Keyed | None = None) -> Delta | None:
        """ΔS ⋈ O: probe the other input's index with the changed keys.

        ``cancel_matched``: consolidate the changed rows whose key was found (those
        that pair) before pairing them; rows of other keys pair with nothing, so
        consolidating all rows or only these gives the same output.  ``keyed``: the
        change's keys, already computed (:meth:`keyed`).
        """
        s = 0 if ins[0] is not None else 1
        d = ins[s]
        if d is None:  # the whole change cancelled out
            return None
        table, w = d
        canon, khash, nn = self.keys(s, table) if keyed is None else keyed[2:]
        if not len(nn):
            return None
        kg = group_keys(khash, canon)
        inv = np.full(table.num_rows, -1, dtype=np.int64)
        inv[nn] = kg.inv
        r = self.readers[1 - s]
        index = ctx.index(r.plan)
        found = r.select(ctx.probe(self, index, canon.take(kg.first), khash[kg.first]),
                         index.schema)
        if not len(found.w):
            return None
        if cancel_matched:
            hit = np.zeros(len(kg), dtype=bool)
            hit[found.q] = True
            rows = nn[hit[kg.inv]]
            if len(rows) < table.num_rows:
                table, w, inv = table.take(pa.array(rows)), w[rows], inv[rows]
            kept = self.cancel_rows(s, table, w)
            if kept is not None:
                idx, w = kept
                if not len(w):
                    return None
                table, inv = table.take(pa.array(idx)), inv[idx]
        parts = self.rule.pairs(table, w, inv, found, len(kg), s)
        return parts[0] if parts else None

    def recompute(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """J(new) - J(old) over the keys that changed (any join type, any inputs changed)."""
        keyed = self.keyed(ins)
        parts: list[Delta] = []
        both = self.old_and_new(keyed, ctx)
        if both is not None:
            sides_old, sides_new, g = both
            parts += self.rule.join(sides_new[0], sides_new[1], g)
            parts += [(t, -w) for t, w in self.rule.join(sides_old[0], sides_old[1], g)]
        for pos, k in enumerate(keyed):
            if k is None:
                continue
            table, w, _, _, nn = k
            nulls = np.setdiff1d(np.arange(table.num_rows), nn)
            if len(nulls):
                parts += self.rule.null_keyed(table.take(pa.array(nulls)), w[nulls], pos)
        return self.consolidated(parts)


def _summed(parts: list[Delta]) -> Delta | None:
    """The non-empty ``parts`` as one change (None if there is none)."""
    parts = [p for p in parts if len(p[1])]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return (pa.concat_tables([t for t, _ in parts]), np.concatenate([w for _, w in parts]))
