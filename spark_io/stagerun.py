"""One stage of a distributed plan, on one shard, for one operation: what a task runs.

A :class:`planner.distribute.DistributedPlan` cuts a graph into stages; an operation
(a population, an ``apply``, a micro-batch) runs every stage as one task per shard,
chained by Spark's shuffle in one job (:mod:`spark_io.dag`).  This module is the task's
work, without Spark: :class:`StageRun` pushes a (stage, shard)'s inputs into its
:class:`joinstate.Pipeline` and routes what comes out (an exchange's rows to the shards
of the stage that reads them, the graph's outputs to the caller), so that the tests'
in-process simulator and the Spark task run the same code.

**Records.**  What crosses the shuffle between stages is a record
``(shard, payload)``; Spark's ``partitionBy(shards, identity)`` sends it to partition
``shard`` of the next stage.  Payloads:

* ``("x", stage, exchange, ipc)`` -- rows of an exchange for ``stage``, as an Arrow IPC
  stream with a ``_weight`` column;
* ``("r", report)`` -- one task's report (a JSON-able dict), passed on to the end;
* ``("e", detail)`` -- a task met an error a retry cannot cure (an over-retraction, a
  conflicting commit id): the tasks of later stages pass it on and apply nothing, and
  the driver raises it and rolls the operation back.

A record for a later stage than the next is passed on by the stages in between.

**Consolidation.**  What a task sends through an exchange is a Z-set: only the sum of
its changes matters.  Changes that only insert are sent as they come (a population's
join output); changes with a retraction (an aggregate replacing its row) are held and
sent once, consolidated, when the task ends, so a population sends each group's last
row, not each of its intermediate values.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from joinstate.codec import RowCodec
from joinstate.keys import row_hash
from joinstate.schema import WEIGHT
from joinstate.zset import consolidate
from planner.partitioning import Replicated, route

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from joinstate import Pipeline
    from planner.distribute import DistributedPlan

__all__ = [
    "ABORT",
    "REPORT",
    "ROWS",
    "PlanRef",
    "StageRun",
    "consolidated",
    "deliveries",
    "from_ipc",
    "to_ipc",
]

ROWS = "x"
REPORT = "r"
ABORT = "e"


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as Arrow IPC stream bytes."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(data: bytes) -> pa.Table:
    """The table :func:`to_ipc` wrote."""
    return pa.ipc.open_stream(data).read_all()


def consolidated(table: pa.Table, what: str) -> pa.Table:
    """Equal rows of a change set merged, their weights summed (checked), zeros dropped.

    Rows are equal when their encodings are, as everywhere in the core
    (:func:`joinstate.zset.consolidate`).
    """
    if not table.num_rows:
        return table
    data = table.drop_columns([WEIGHT])
    w = np.asarray(table.column(WEIGHT).to_numpy(), dtype=np.int64)
    enc = RowCodec(data.schema).encode(data)
    idx, sums = consolidate(row_hash(enc), enc, w, what)
    if len(idx) == table.num_rows and (idx == np.arange(len(idx))).all():
        return table
    out = data.take(pa.array(idx))
    return out.append_column(table.schema.field(WEIGHT), pa.array(sums, pa.int64()))


_PLANS: dict[str, DistributedPlan] = {}
"""Plans unpickled in this process, by digest: a reused Python worker unpickles a plan
(its stage graphs check their expressions as they are rebuilt) once, not per task."""


@dataclass(frozen=True)
class PlanRef:
    """A distributed plan as shipped to tasks: pickled once, unpickled once per process."""

    digest: str
    blob: bytes = field(repr=False)

    @staticmethod
    def of(plan: DistributedPlan) -> PlanRef:
        """The reference of ``plan``."""
        blob = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        return PlanRef(hashlib.sha256(blob).hexdigest()[:24], blob)

    def get(self) -> DistributedPlan:
        """The plan (from this process's cache when it was unpickled here before)."""
        plan = _PLANS.get(self.digest)
        if plan is None:
            plan = pickle.loads(self.blob)  # the driver's own pickle of the plan
            if len(_PLANS) > 8:
                _PLANS.clear()
            _PLANS[self.digest] = plan
        return plan


@dataclass
class StageRun:
    """The pushes of one (stage, shard) in one operation, and where their outputs go.

    ``pipeline`` maintains the stage's sub-graph for this shard (None: the shard runs
    nothing in this stage).  :meth:`push` applies one input and returns the records to
    send on; :meth:`finish` returns the held ones, consolidated; the graph's outputs
    accumulate in :attr:`outputs`.
    """

    plan: DistributedPlan
    stage: int
    shard: int
    pipeline: Pipeline | None
    order_of: tuple[str, ...] | None = None
    held: dict[str, list[pa.Table]] = field(default_factory=dict)
    outputs: dict[str, list[pa.Table]] = field(default_factory=dict)
    pushes: int = 0
    rows_in: int = 0
    rows_sent: int = 0

    def inputs(self) -> tuple[str, ...]:
        """The names of the stage graph's inputs on this shard, deliveries first."""
        st = self.plan.stages[self.stage]
        return tuple(n for n in st.inputs() if st.reads(self.shard, n))

    def order(self, names: Iterable[str]) -> list[str]:
        """``names`` in push order.

        Deliveries by the plan's population order (small sources first), then exchanges
        by id.
        """
        st = self.plan.stages[self.stage]
        sources = self.order_of or self.plan.order
        rank = {s: i for i, s in enumerate(sources)}
        rank.update({s: len(rank) + i for i, s in enumerate(self.plan.order) if s not in rank})
        by_name = {d.name: rank[d.source] for d in st.deliveries}
        return sorted(names, key=lambda n: (n not in by_name, by_name.get(n, 0), n))

    def push(self, name: str, table: pa.Table, **kw: Any) -> list[tuple[int, tuple[Any, ...]]]:
        """Push ``table`` (with ``_weight``) into input ``name``; records to send now.

        ``kw`` go to :meth:`joinstate.Pipeline.push` (``commit_id``, ``progress`` ...).
        """
        if self.pipeline is None:
            msg = (f"internal: shard {self.shard} runs nothing in stage {self.stage}, yet "
                   f"got rows for {name!r}")
            raise RuntimeError(msg)
        outs = self.pipeline.push(name, table, **kw)
        self.pushes += 1
        self.rows_in += table.num_rows
        return self.route(outs)

    def route(self, outs: Mapping[str, pa.Table]) -> list[tuple[int, tuple[Any, ...]]]:
        """Records for the exchanges among ``outs``; the graph's outputs are kept."""
        sent: list[tuple[int, tuple[Any, ...]]] = []
        for name, delta in outs.items():
            if not delta.num_rows:
                continue
            e = self.plan.exchanges.get(name)
            if e is None:
                self.outputs.setdefault(name, []).append(delta)
            elif bool((delta.column(WEIGHT).to_numpy() < 0).any()) or name in self.held:
                self.held.setdefault(name, []).append(delta)
            else:
                sent += self._send(name, delta)
        return sent

    def finish(self) -> list[tuple[int, tuple[Any, ...]]]:
        """The held exchange rows, each exchange's consolidated once."""
        sent: list[tuple[int, tuple[Any, ...]]] = []
        for name, parts in self.held.items():
            net = consolidated(pa.concat_tables(parts), f"exchange {name}: a row's weight")
            if net.num_rows:
                sent += self._send(name, net)
        self.held.clear()
        return sent

    def output(self, name: str) -> pa.Table | None:
        """Output ``name``'s changes from this task, consolidated (None: none)."""
        parts = [p for p in self.outputs.get(name, []) if p.num_rows]
        if not parts:
            return None
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if len(parts) > 1 or bool((table.column(WEIGHT).to_numpy() < 0).any()):
            table = consolidated(table, f"output {name}: a row's weight")
        return table if table.num_rows else None

    def _send(self, name: str, delta: pa.Table) -> list[tuple[int, tuple[Any, ...]]]:
        e = self.plan.exchanges[name]
        if e.partitioning is None:  # a stage boundary only: the rows stay on this shard
            self.rows_sent += delta.num_rows
            return [(self.shard, (ROWS, e.to_stage, name, to_ipc(delta)))]
        dest = route(e.partitioning, delta, self.plan.shards)
        assert dest is not None
        if e.copies:  # every shard holds these rows: each sends the ones routed to itself
            keep = dest == self.shard
            if not keep.all():
                delta, dest = delta.filter(pa.array(keep)), dest[keep]
        out = []
        targets = np.unique(dest)
        for t in targets.tolist():
            part = delta if len(targets) == 1 else delta.filter(pa.array(dest == t))
            self.rows_sent += part.num_rows
            out.append((int(t), (ROWS, e.to_stage, name, to_ipc(part))))
        return out


def deliveries(plan: DistributedPlan, stage: int, shard: int, source: str,
               table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """The rows of ``table`` (a change to ``source``) that (``stage``, ``shard``) reads.

    One ``(input name, rows)`` per delivery of the source to the stage that the shard's
    graph reads; empty pieces are left out.
    """
    st = plan.stages[stage]
    for d in st.deliveries:
        if d.source != source or not st.reads(shard, d.name):
            continue
        if isinstance(d.partitioning, Replicated):
            piece = table
        else:
            dest = route(d.partitioning, table, plan.shards)
            assert dest is not None
            piece = table.filter(pa.array(dest == shard))
        if piece.num_rows:
            yield d.name, piece
