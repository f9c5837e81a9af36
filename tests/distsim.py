"""Run a :class:`planner.distribute.DistributedPlan` in-process: N shard pipelines per stage.

The simulator routes rows exactly as the plan says (sources to their deliveries, stage
outputs through exchanges), with one :class:`joinstate.StateStore` per (stage, shard),
no Spark.  An operation (population, a change batch) runs the stages in order; every
(stage, shard) pushes its inputs one after the other, deliveries in the plan's
population order first, then what earlier stages sent.  The result is what the plan
computes, to compare with one pipeline over the whole graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

import joinstate
from joinstate.testing import consolidate
from planner.partitioning import Replicated
from spark_io.stagerun import ROWS, StageRun, deliveries, from_ipc

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from joinstate.graph import Graph
    from planner.distribute import DistributedPlan

WEIGHT = "_weight"


def attach(store: joinstate.StateStore, name: str, graph: Graph) -> joinstate.Pipeline:
    """The runtime maintaining ``graph`` in ``store``."""
    return joinstate.Pipeline(store, name, graph)


class Simulator:
    """Every (stage, shard) pipeline of a plan, each in its own store under ``root``."""

    def __init__(self, plan: DistributedPlan, root: Path, name: str = "dist") -> None:
        self.plan = plan
        self.stores: list[joinstate.StateStore] = []
        self.pipes: dict[tuple[int, int], Any] = {}
        for st in plan.stages:
            for shard in range(plan.shards):
                g = st.graph_for(shard)
                if g is None:
                    continue
                store = joinstate.StateStore(str(root / f"stage{st.index}-shard{shard}"))
                self.stores.append(store)
                self.pipes[(st.index, shard)] = attach(store, name, g)
        self.pushes: dict[tuple[int, int], int] = {}

    def close(self) -> None:
        """Close every store."""
        for s in self.stores:
            s.close()

    def apply(self, changes: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
        """One operation: ``changes`` per source through every stage; output change sets.

        Each (stage, shard) runs :class:`spark_io.stagerun.StageRun`, the code a Spark
        task runs; records go from stage to stage as the shuffle would deliver them.
        """
        plan = self.plan
        live = any(t.num_rows and np.any(t.column(WEIGHT).to_numpy()) for t in changes.values())
        inbox: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
        finals: dict[str, list[pa.Table]] = {o: [] for o in plan.outputs}
        for st in plan.stages:
            for shard in range(plan.shards):
                pipe = self.pipes.get((st.index, shard))
                run = StageRun(plan, st.index, shard, pipe)
                todo: dict[str, list[pa.Table]] = {}
                for source in plan.order:
                    if source in changes:
                        for name, rows in deliveries(plan, st.index, shard, source,
                                                     changes[source]):
                            todo.setdefault(name, []).append(rows)
                for rec in inbox.pop((st.index, shard), []):
                    kind, _, name, blob = rec
                    assert kind == ROWS
                    todo.setdefault(name, []).append(from_ipc(blob))
                unread = [x for x in todo if not st.reads(shard, x)]
                assert not unread, f"rows of {unread} for stage {st.index}, shard {shard}, " \
                    "which does not read them"
                g = st.graph_for(shard)
                if (live and g is not None and not self.pushes.get((st.index, shard))
                        and _owes_row(st, shard) and not todo):
                    name, nothing = _nothing(g, next(iter(g.sources)))
                    todo[name] = [nothing]
                sent = []
                for name in run.order(todo):
                    table = pa.concat_tables(todo[name])
                    sent += run.push(name, table)
                    self.pushes[(st.index, shard)] = self.pushes.get((st.index, shard), 0) + 1
                sent += run.finish()
                for target, payload in sent:
                    inbox.setdefault((payload[1], target), []).append(payload)
                for o in finals:
                    got = run.output(o)
                    if got is not None:
                        finals[o].append(got)
        assert not any(inbox.values()), f"rows sent to no stage: {list(inbox)}"
        out = {}
        for name, parts in finals.items():
            schema = plan.graph.output_schema(name)
            if parts:
                t = pa.concat_tables([p.select(schema.names).cast(schema) for p in parts])
                out[name] = consolidate(t)
            else:
                out[name] = schema.empty_table()
        return out

    def read(self, name: str) -> pa.Table:
        """A materialized output's contents: every shard's rows (order and limit applied
        by the caller over the union)."""
        st = self.plan.stages[self.plan.outputs[name]]
        parts = [p.read(name) for (k, shard), p in self.pipes.items() if k == st.index
                 and name in getattr(st.graph_for(shard), "materialized", {})]
        return pa.concat_tables(parts) if parts else self.plan.graph.outputs[name].schema \
            .empty_table()


def _owes_row(stage: Any, shard: int) -> bool:
    """Whether the stage's pipeline on ``shard`` has a global aggregate (its row is owed
    to the outputs from the first operation that changes anything)."""
    g = stage.graph_for(shard)
    return g is not None and any(n.kind == "agg" and not n.keys for n in g.nodes)


def _nothing(graph: Graph, name: str) -> tuple[str, pa.Table]:
    """A change set of one row inserted and deleted: changes nothing, yet counts as a
    change, so that a pipeline delivers the rows it owes since its creation.

    Stands in for a runtime call that delivers them (the single pipeline returns them
    with the first push that has a row of non-zero weight).
    """
    schema = graph.source_schema(name)
    row = pa.table({f.name: pa.nulls(1, f.type) if f.nullable else _zero(f.type)
                    for f in schema})
    both = pa.concat_tables([row, row])
    return name, both.append_column(WEIGHT, pa.array([1, -1], pa.int64()))


def _zero(t: pa.DataType) -> pa.Array:
    """One value of type ``t`` (for a column that takes no NULL)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([""], t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([b""], t)
    if pa.types.is_boolean(t):
        return pa.array([False])
    return pa.array([0], pa.int64()).cast(t)


def replicated_sources(plan: DistributedPlan) -> list[str]:
    """The sources the plan copies to every shard."""
    return [s for s, p in plan.sources.items() if isinstance(p, Replicated)]
