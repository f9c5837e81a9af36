"""What the operators that read indexes share: their inputs' keys, and probing them.

A join and a ``join_all`` read their inputs through the physical plan's readers.  For a
push they need each changed input's canonical keys (under the operator's key plan) and,
for the keys that changed, every input's rows before and after the push
(:meth:`KeyedOperator.old_and_new`), probing an index read by several inputs (legs
filtered from one stream) once and evaluating its readers' filters in one pass.  On
the recompute path each index read is scanned whole instead of probed by key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from joinstate._bytes import Bytes
from joinstate._probe import Entries
from joinstate.keys import hash_prefix
from joinstate.ops.base import Delta, OperatorBase, PushContext
from joinstate.physical import first_masks
from joinstate.zset import group_keys

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from joinstate._index import Index
    from joinstate.nodes import JoinAllNode, JoinNode
    from joinstate.physical import IndexPlan, PhysicalPlan, Reader

__all__ = ["Keyed", "KeyedOperator"]

Keyed = tuple[pa.Table, np.ndarray, Bytes, np.ndarray, np.ndarray]
"""A changed input: rows, weights, canonical keys and hashes (non-NULL rows), their rows."""


class KeyedOperator(OperatorBase):
    """An operator whose inputs are read through indexes, by key."""

    node: JoinNode | JoinAllNode

    def __init__(self, node: JoinNode | JoinAllNode, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        n = len(node.inputs)
        self.readers: list[Reader] = [plan.readers[(node.id, pos)] for pos in range(n)]
        self.codecs = [plan.codecs[(node.id, pos)] for pos in range(n)]

    recomputable = True

    def explain_state(self) -> list[str]:
        """How its pushes read: by key, or by whole-index scans when chosen per batch."""
        return [f"{self.node.label}: reads its inputs' indexes by key (incremental) or by "
                "one scan of each (recompute), chosen per batch and operator by "
                "population.apply"]

    def scanned_indexes(self, indexes: Mapping[int, Index], changed: Sequence[bool]
                        ) -> list[Index]:
        """Every index its inputs read, each once (legs of one stream share one)."""
        return [indexes[id(ip)] for ip in self.reads()]

    def reads(self) -> list[IndexPlan]:
        """The indexes its inputs are read from (one per input, some shared)."""
        out: dict[int, IndexPlan] = {}
        for r in self.readers:
            out.setdefault(id(r.plan), r.plan)
        return list(out.values())

    def keys(self, pos: int, table: pa.Table) -> tuple[Bytes, np.ndarray, np.ndarray]:
        """Canonical keys, their hashes, and the rows whose key is not NULL."""
        canon, null = self.codecs[pos].encode(table)
        nn = np.flatnonzero(~null)
        if len(nn) != table.num_rows:
            canon = canon.take(nn)
        return canon, hash_prefix(canon), nn

    def keyed(self, ins: list[Delta | None]) -> list[Keyed | None]:
        """Each changed input with its canonical keys, key hashes and non-NULL-key rows."""
        keyed: list[Keyed | None] = []
        for pos, d in enumerate(ins):
            if d is None:
                keyed.append(None)
                continue
            canon, khash, nn = self.keys(pos, d[0])
            keyed.append((d[0], d[1], canon, khash, nn))
        return keyed

    def old_and_new(self, keyed: list[Keyed | None], ctx: PushContext
                    ) -> tuple[list[Entries], list[Entries], int] | None:
        """Every input's rows at the changed keys, before and after this push.

        ``q`` of the entries is the changed key's group (of ``G``); an index read by
        several inputs (legs filtered from one stream) is probed once.
        """
        present = [k for k in keyed if k is not None and len(k[4])]
        if not present:
            return None
        allc = Bytes.concat([k[2] for k in present])
        allh = np.concatenate([k[3] for k in present])
        kg = group_keys(allh, allc)
        qcanon, qhash = allc.take(kg.first), allh[kg.first]
        readers = self.readers
        probed: dict[int, Entries] = {}
        masks: dict[int, np.ndarray] = {}
        for r in readers:
            if id(r.plan) not in probed:
                probed[id(r.plan)] = raw = ctx.probe(self, ctx.index(r.plan), qcanon, qhash)
                masks.update(first_masks(raw, [s for s in readers if s.plan is r.plan]))
        olds: list[Entries] = []
        news: list[Entries] = []
        offset = 0
        for pos, k in enumerate(keyed):
            r = readers[pos]
            old = r.select(probed[id(r.plan)], ctx.index(r.plan).schema, masks.get(id(r)))
            olds.append(old)
            if k is None or not len(k[4]):
                news.append(old)
                continue
            table, w, _, _, nn = k
            q = kg.inv[offset:offset + len(nn)]
            offset += len(nn)
            add = table.take(pa.array(nn)).select(old.rows.column_names).cast(old.rows.schema)
            news.append(Entries(pa.concat_tables([old.rows, add]),
                                np.concatenate([old.w, w[nn]]), np.concatenate([old.q, q])))
        return olds, news, len(kg)
