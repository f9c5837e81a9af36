"""A :class:`joinstate.Pipeline` cut into stages that Spark runs sharded by key.

**Stages.**  The pipeline is cut at its stateful operators (joins, aggregates,
``join_all``).  A stage is one stateful operator plus the stateless operators (filter,
projection, union) between it and its *stage inputs*: pipeline sources, outputs of other
stages, or a projection that computes a key (below).  Its state is sharded by its key:
a join's inputs by their join keys, an aggregate by its group keys, a ``join_all`` by its
common key.  Every (stage, shard) owns one RocksDB store,
``<state_dir>/<stage>/shard-NNNNN``, holding a small ``joinstate.Pipeline`` rebuilt from
the stage (:meth:`Stage.build`): its sources are the stage inputs, its outputs the
stateful operator and whatever else the driver needs from this stage, so the core does
all the incremental work (index sharing included: the six filtered legs of TPC-DS q4's
``year_total`` self-join are six filters of one stage input, hence one index).

**Routing.**  A row of a stage input goes to shard ``xxh3(canonical key) % shards``
(:meth:`joinstate.keys.KeyCodec.shard_of`, with the stateful operator's key plan, so an
``int`` key on one side and a ``long`` key on the other meet).  The key is traced back
from the stateful operator through its stateless inputs to columns of the stage input:
through filters, unions, and projections that pass a column on (``pc.field(c)``, perhaps
renamed).  Where a projection *computes* a key column, the trace stops there and that
projection becomes a stage input of its own, computed by the stage(s) upstream of it.
If one stage input reaches the operator keyed by different columns (a self-join
``t.join(t, on=("a", "b"))``), the stage pipeline gets one source per key, each routed by
its own columns, so every row that reaches the operator in a shard has a key of that
shard.

**Materialised nodes.**  The change sets that cross Spark (Parquet files between jobs)
are those of the pipeline's outputs and of stage inputs other than sources.  A stateful
operator's changes come from its stage.  A stateless node's changes are a linear
function of its nearest stateful or source ancestors, so each of those stages (a source
gets a stateless *tail stage*) computes the part that flows from it; the parts are
summed (a union of two stages' outputs is the union of their files).

Nothing here imports pyspark: the driver (:mod:`spark_io.pipeline`) plans with it and
pickles :class:`Stage` objects into the executor tasks defined at the end.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc

import joinstate
from joinstate import (
    CommitConflictError,
    Graph,
    Pipeline,
    SchemaMismatchError,
    StateStore,
    Stream,
    Transaction,
)
from joinstate.graph import (
    AggNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    Node,
    ProjectNode,
    SourceNode,
    UnionNode,
)
from joinstate.keys import KeyCodec, KeyColumn, key_plan, single_plan
from joinstate.names import commit_prefix, pipeline_owner
from spark_io._worker import (
    OUTPUT_PARQUET,
    OpenShard,
    UndoPlan,
    _report,
    by_shard,
    open_store,
    options_from_dict,
    reports_errors,
)
from spark_io.manifest import ShardStorage, shard_key
from spark_io.outputs import OutputDir, parquet_out
from spark_io.routing import SHARD
from spark_io.types import conform_batch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "Stage",
    "StageControlTask",
    "StageInput",
    "StagePlan",
    "StageRouter",
    "StageTask",
    "forget_commits",
    "open_stage_shard",
    "plan_stages",
]

# ---- stages --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StageInput:
    """A source of a stage pipeline: the change sets of ``boundary``, routed by ``key``."""

    name: str  # the source's name in the stage pipeline
    boundary: int  # id of the node whose change sets feed it
    boundary_label: str
    key: tuple[str, ...]  # columns of the boundary that rows are routed by
    plan: tuple[KeyColumn, ...]
    schema: pa.Schema  # the boundary's columns (without ``_weight``)


@dataclass(frozen=True, eq=False)
class Stage:
    """One stateful operator (or a source's stateless tail) and its stateless inputs."""

    label: str  # directory name: the operator's label (join5, agg9, ...) or tail-<source>
    kind: str  # join | agg | joinall | tail
    node: int | None  # the stateful node's id (None for a tail stage)
    key: tuple[str, ...]  # the operator's key (per input for joins: the left one)
    inputs: tuple[StageInput, ...]
    graph: Graph
    """The stage's own graph: its inputs are its sources, its outputs ``n<node id>``."""
    produces: tuple[int, ...]  # node ids whose (partial) change sets this stage writes

    @property
    def outputs(self) -> tuple[str, ...]:
        """The stage graph's outputs, ``n<id>`` of each node in :attr:`produces`."""
        return tuple(self.graph.outputs)

    def input(self, name: str) -> StageInput:
        """The stage input called ``name``."""
        for inp in self.inputs:
            if inp.name == name:
                return inp
        msg = f"internal: stage {self.label} has no input {name!r}"
        raise SchemaMismatchError(msg)

    def build(self, store: StateStore, name: str) -> Pipeline:
        """The stage's pipeline: its graph attached to ``store``."""
        return Pipeline(store, name, self.graph)

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (manifest, :meth:`SparkPipeline.explain`)."""
        return {
            "stage": self.label, "kind": self.kind, "key": list(self.key),
            "inputs": [{"name": i.name, "from": i.boundary_label, "key": list(i.key)}
                       for i in self.inputs],
            "outputs": list(self.outputs),
        }


@dataclass(frozen=True, eq=False)
class StagePlan:
    """Every stage in run order, and what the driver needs to connect them."""

    nodes: dict[int, Node]
    outputs: dict[str, int]  # user output -> node id
    stages: tuple[Stage, ...]
    materialized: dict[int, pa.Schema] = field(default_factory=dict)

    def consumers(self, node_id: int) -> list[tuple[Stage, StageInput]]:
        """The stage inputs fed by node ``node_id``'s change sets, in run order."""
        return [(s, i) for s in self.stages for i in s.inputs if i.boundary == node_id]


# ---- planning ----------------------------------------------------------------------------


def _positions(node: Node) -> list[tuple[Node, tuple[str, ...]]]:
    """Each input of a stateful node with the columns of its key."""
    if isinstance(node, JoinNode):
        return [(node.inputs[0], node.left_key), (node.inputs[1], node.right_key)]
    if isinstance(node, AggNode):
        return [(node.inputs[0], node.keys)]
    if isinstance(node, JoinAllNode):
        return [(i, (k,)) for i, k in zip(node.inputs, node.keys, strict=True)]
    msg = f"internal: {node.label} is not stateful"
    raise SchemaMismatchError(msg)


def _key_plan(node: Node) -> list[KeyColumn]:
    if isinstance(node, JoinNode):
        return key_plan(node.inputs[0].schema, node.left_key,
                        node.inputs[1].schema, node.right_key)
    if isinstance(node, AggNode):
        return single_plan(node.inputs[0].schema, node.keys)
    assert isinstance(node, JoinAllNode)
    return key_plan(node.inputs[0].schema, [node.keys[0]], node.inputs[1].schema,
                    [node.keys[1]])


def _step(node: Node, cols: tuple[str, ...]) -> list[tuple[Node, tuple[str, ...]]] | None:
    """Where ``node``'s key columns ``cols`` come from; None: ``node`` is a stage input."""
    if isinstance(node, SourceNode) or node.stateful:
        return None
    if isinstance(node, FilterNode):
        return [(node.inputs[0], cols)]
    if isinstance(node, UnionNode):
        return [(i, cols) for i in node.inputs]
    if isinstance(node, ProjectNode):
        src = node.inputs[0]
        mapped = []
        for c in cols:
            expr = node.exprs[node.schema.get_field_index(c)]
            found = next((n for n in src.schema.names if expr.equals(pc.field(n))), None)
            if found is None:
                return None  # a computed key: this projection is a stage input
            mapped.append(found)
        return [(src, tuple(mapped))]
    msg = f"internal: no routing rule for {node.label}"
    raise SchemaMismatchError(msg)


def _trace(node: Node, cols: tuple[str, ...], out: list[tuple[Node, tuple[str, ...]]]) -> None:
    nxt = _step(node, cols)
    if nxt is None:
        if (node, cols) not in out:
            out.append((node, cols))
        return
    for n, c in nxt:
        _trace(n, c, out)


def _bounds(node: Node, out: dict[int, Node]) -> None:
    """The nearest stateful or source ancestors of a stateless node."""
    if isinstance(node, SourceNode) or node.stateful:
        out[node.id] = node
        return
    for i in node.inputs:
        _bounds(i, out)


def _label(node: Node) -> str:
    return node.name if isinstance(node, SourceNode) else f"{node.label}-out"


class _Builder:
    """Builds one stage's graph: streams made in the order they are asked for.

    The stage graph is built from the pipeline graph's nodes with the public stream
    methods, in a fixed order (inputs, then the key traces, the operator, the tails), so
    its numbering, hence its stored definition, is the same on every run.
    """

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.key_memo: dict[tuple[int, tuple[str, ...]], Stream] = {}
        self.sources: dict[tuple[int, tuple[str, ...]], Stream] = {}
        self.tail_memo: dict[int, Stream | None] = {}

    def add(self, stream: Stream) -> Stream:
        self.streams.append(stream)
        return stream

    def keyed(self, node: Node, cols: tuple[str, ...]) -> Stream:
        """``node`` rebuilt along its key trace (stopping where :func:`_trace` stops)."""
        memo = (node.id, cols)
        if memo in self.key_memo:
            return self.key_memo[memo]
        nxt = _step(node, cols)
        if nxt is None:
            out = self.sources[memo]
        elif isinstance(node, UnionNode):
            parts = [self.keyed(n, c) for n, c in nxt]
            out = self.add(parts[0].union_all(*parts[1:]))
        else:
            out = self.add(_stateless(node, [self.keyed(*nxt[0])]))
        self.key_memo[memo] = out
        return out

    def tail(self, node: Node, base: Node, base_stream: Stream) -> Stream | None:
        """The part of stateless ``node``'s changes that flows from ``base``."""
        if node.id == base.id:
            return base_stream
        if isinstance(node, SourceNode | JoinNode | AggNode | JoinAllNode):
            return None
        if node.id in self.tail_memo:
            return self.tail_memo[node.id]
        ins = [self.tail(i, base, base_stream) for i in node.inputs]
        present = [i for i in ins if i is not None]
        out: Stream | None = None
        if present:
            out = self.add(present[0].union_all(*present[1:]) if isinstance(node, UnionNode)
                           else _stateless(node, present))
        self.tail_memo[node.id] = out
        return out


def _stateless(node: Node, ins: list[Stream]) -> Stream:
    if isinstance(node, FilterNode):
        return ins[0].filter(node.expr)
    if isinstance(node, ProjectNode):
        return ins[0].select(dict(zip(node.schema.names, node.exprs, strict=True)))
    msg = f"internal: {node.label} is not a filter or projection"
    raise SchemaMismatchError(msg)


def _stateful(node: Node, ins: list[Stream]) -> Stream:
    if isinstance(node, JoinNode):
        return ins[0].join(ins[1], on=list(zip(node.left_key, node.right_key, strict=True)),
                           how=node.how, suffixes=node.suffixes)
    if isinstance(node, AggNode):
        return ins[0].group_by(list(node.keys)).aggregate(
            **{n: (f, e) for n, f, e in node.aggs})
    assert isinstance(node, JoinAllNode)
    return joinstate.join_all(dict(zip(node.legs, ins, strict=True)),
                              on=dict(zip(node.legs, node.keys, strict=True)))


def _stage_graph(outputs: list[tuple[str, Stream]]) -> Graph:
    graph = Graph()
    for name, stream in outputs:
        graph = graph.output(name, stream)
    return graph


def plan_stages(graph: Graph, pipeline: str) -> StagePlan:
    """Cut ``graph`` into stages (see the module docstring)."""
    nodes = dict(enumerate(graph.nodes))
    if not graph.outputs:
        raise SchemaMismatchError(
            f"pipeline {pipeline!r}: the graph has no outputs; name every result you want "
            "back with graph.output(name, stream)")
    if graph.materialized:
        raise SchemaMismatchError(
            f"output {next(iter(graph.materialized))!r}: SparkPipeline returns change sets "
            "and does not keep materialized outputs (materialize=True, order_by, limit); "
            "integrate the change sets (sum _weight per row) or use joinstate.Pipeline "
            "in-process")
    outputs = {o: n.id for o, n in graph.outputs.items()}
    live = graph.needed
    stateful = [nodes[i] for i in sorted(live) if nodes[i].stateful]

    # Stage inputs of every stateful node: (boundary, key columns) pairs.
    traces: dict[int, list[tuple[Node, tuple[str, ...]]]] = {}
    for st in stateful:
        found: list[tuple[Node, tuple[str, ...]]] = []
        for inp, key in _positions(st):
            _trace(inp, key, found)
        traces[st.id] = found
    materialized: dict[int, Node] = {outputs[o]: nodes[outputs[o]] for o in outputs}
    for found in traces.values():
        for node, _ in found:
            if not isinstance(node, SourceNode):
                materialized[node.id] = node
    # Who computes the stateless materialized nodes: each of their boundaries' stages.
    tails: dict[int, list[Node]] = {}
    for m in sorted(materialized.values(), key=lambda n: n.id):
        if isinstance(m, SourceNode) or m.stateful:
            continue
        bounds: dict[int, Node] = {}
        _bounds(m, bounds)
        for bid in bounds:
            tails.setdefault(bid, []).append(m)

    stages: list[Stage] = []
    for src in graph.sources.values():
        if src.id not in tails:
            continue
        bld = _Builder()
        base = bld.add(joinstate.source(src.name, src.schema, unique_key=src.unique_key,
                                        retractions=src.retractions))
        made = [(f"n{m.id}", bld.tail(m, src, base)) for m in tails[src.id]]
        names = tuple(src.schema.names)
        stages.append(Stage(
            label=f"tail-{src.name}", kind="tail", node=None, key=names,
            inputs=(StageInput(src.name, src.id, src.name, names,
                               tuple(single_plan(src.schema, names)), src.schema),),
            graph=_stage_graph([(n, cast("Stream", t)) for n, t in made]),
            produces=tuple(m.id for m in tails[src.id]),
        ))
    for st in stateful:
        bld = _Builder()
        plan = tuple(_key_plan(st))
        variants: dict[int, list[tuple[str, ...]]] = {}
        for node, cols in traces[st.id]:
            variants.setdefault(node.id, []).append(cols)
        inputs: list[StageInput] = []
        taken: set[str] = set()
        for node, cols in traces[st.id]:
            name = _label(node)
            if len(variants[node.id]) > 1:
                name = f"{name}-v{variants[node.id].index(cols)}"
            while name in taken:
                name += "_"
            taken.add(name)
            uk = node.unique_key if isinstance(node, SourceNode) else None
            mode = node.retractions if isinstance(node, SourceNode) else "unchecked"
            bld.sources[(node.id, cols)] = bld.add(
                joinstate.source(name, node.schema, unique_key=uk, retractions=mode))
            inputs.append(StageInput(name, node.id, node.label, cols, plan, node.schema))
        ins = [bld.keyed(inp, key) for inp, key in _positions(st)]
        me = bld.add(_stateful(st, ins))
        outs: list[tuple[str, Stream]] = []
        produces: list[int] = []
        if st.id in materialized:
            outs.append((f"n{st.id}", me))
            produces.append(st.id)
        for m in tails.get(st.id, []):
            made_m = bld.tail(m, st, me)
            assert made_m is not None
            outs.append((f"n{m.id}", made_m))
            produces.append(m.id)
        stages.append(Stage(
            label=st.label, kind=st.kind, node=st.id, key=_positions(st)[0][1],
            inputs=tuple(inputs), graph=_stage_graph(outs), produces=tuple(produces),
        ))
    plan_ = StagePlan(nodes=nodes, outputs=outputs, stages=tuple(stages),
                      materialized={i: n.schema for i, n in materialized.items()})
    _check(plan_)
    return plan_


def _check(plan: StagePlan) -> None:
    """Every stage graph's outputs have their nodes' columns."""
    for stage in plan.stages:
        for out, nid in zip(stage.outputs, stage.produces, strict=True):
            got = stage.graph.outputs[out].schema
            want = plan.nodes[nid].schema
            if [(f.name, f.type) for f in got] != [(f.name, f.type) for f in want]:
                msg = (f"internal: stage {stage.label} computes {plan.nodes[nid].label} as "
                       f"{got}, the pipeline declares {want}")
                raise SchemaMismatchError(msg)


# ---- executors ---------------------------------------------------------------------------


class StageRouter:
    """``mapInArrow`` function: append the ``_shard`` of every row of one stage input."""

    def __init__(self, inp: StageInput, shards: int, stage: str) -> None:
        self.schema = inp.schema
        self.key = list(inp.key)
        self.shards = shards
        self.codec = KeyCodec(self.key, list(inp.plan), f"stage {stage} input {inp.name}")

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Yield each batch with its ``_shard`` column appended."""
        for batch in batches:
            keys = conform_batch(batch, self.schema).select(self.key)
            shard = pa.array(self.codec.shard_of(keys, self.shards).astype("int32"), pa.int32())
            yield pa.RecordBatch.from_arrays([*batch.columns, shard],
                                             names=[*batch.schema.names, SHARD])


@contextmanager
def open_stage_shard(storage: ShardStorage, pipeline: str, stage: str, shard: int,
                     options: dict[str, Any] | None, *, read_only: bool = False,
                     undo: UndoPlan | None = None) -> Iterator[OpenShard]:
    """The store of one (stage, shard), open for the ``with`` block.

    With a ``checkpoint_uri`` it is checkpointed after writes; ``undo`` settles other
    operations' undo records and captures this one's (see
    :func:`spark_io._worker.open_store`).
    """
    with open_store(storage, shard_key(shard, stage), options_from_dict(options),
                    read_only=read_only,
                    owner=f"shard {shard} of stage {stage} of pipeline {pipeline!r}",
                    hint="run one SparkPipeline operation", undo=undo) as opened:
        yield opened


def forget_commits(store: StateStore, pipeline: str, keep: Callable[[str], bool]) -> int:
    """Drop the commit records (ids and recorded outputs) of ``pipeline`` not kept."""
    prefix = commit_prefix(pipeline_owner(pipeline))
    with store.lock:
        txn = Transaction(store)
        n = 0
        for k in store.meta_keys(prefix):
            if not keep(k[len(prefix):].decode()):
                txn.record(k, None)
                n += 1
        if n:
            txn.commit()
    return n


def batch_of(commit_id: str, prefix: str) -> int | None:
    """The micro-batch number of a stream commit id ``<prefix><batch>:...``."""
    if not commit_id.startswith(prefix):
        return None
    head = commit_id[len(prefix):].split(":", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass(frozen=True)
class StageTask:
    """Push one stage input's change rows into every shard this task receives.

    Each shard's rows are one push with ``commit_id`` (one transaction; a retried task
    or operation finds the id and gets the recorded outputs back).  Every output of the
    stage pipeline goes to ``<output_dir>/<output>/<tag>-shard-NNNNN.parquet``.
    ``forget_prefix``/``keep_after``: after the push, drop this stream's commit records
    of micro-batches before ``keep_after``.  ``undo`` and ``replay_only`` as for
    :class:`spark_io._worker.ApplyTask`.
    """

    pipeline: str
    stage: Stage
    storage: ShardStorage
    options: dict[str, Any] | None
    source: str
    output_dir: str
    tag: str
    commit_id: str
    forget_prefix: str | None = None
    keep_after: int | None = None
    undo: UndoPlan | None = None
    replay_only: bool = False

    @reports_errors
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Apply each shard's rows; yield one report row per shard."""
        schema = self.stage.input(self.source).schema
        for shard, pieces in by_shard(batches):
            t0 = time.perf_counter()
            tables = [conform_batch(t, schema) for t in pieces]
            delta = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            with open_stage_shard(self.storage, self.pipeline, self.stage.label, shard,
                                  self.options, undo=self.undo) as opened:
                p = self.stage.build(opened.store, self.pipeline)
                replayed = p.committed(self.commit_id)
                if self.replay_only and not replayed:
                    raise CommitConflictError(
                        f"shard {shard} of stage {self.stage.label} of pipeline "
                        f"{self.pipeline!r}: commit id {self.commit_id!r} is recorded as "
                        "committed by the driver, but this store no longer holds it "
                        "(forgotten after the stream's retain= batches?), so its output "
                        "cannot be replayed; nothing was applied")
                outs = p.push(self.source, delta, commit_id=self.commit_id)
                if self.forget_prefix is not None and self.keep_after is not None:
                    forget_commits(opened.store, self.pipeline, self._keep)
            rows = {}
            out_dir = OutputDir(self.output_dir)
            for name, table in outs.items():
                with parquet_out(out_dir, f"{name}/{self.tag}-shard-{shard:05d}.parquet",
                                 OUTPUT_PARQUET) as f:
                    f.write(table)
                rows[name] = table.num_rows
            yield _report(shard, f"{self.stage.label}:{self.source}", delta.num_rows,
                          sum(rows.values()), time.perf_counter() - t0, replayed=replayed,
                          detail={"rows": rows, "checkpoint": opened.report()})

    def _keep(self, commit_id: str) -> bool:
        assert self.forget_prefix is not None and self.keep_after is not None
        batch = batch_of(commit_id, self.forget_prefix)
        return batch is None or batch >= self.keep_after


@dataclass(frozen=True)
class StageControlTask:
    """Visit shards by number (a ``spark.range`` column), every stage's store of each.

    Drops commit records whose id starts with ``forget_prefix`` (if given), sets each
    store's stage pipeline live if ``go_live`` (a completed population), and reports
    each existing store; a (stage, shard) no row ever reached has no store (no
    directory, no checkpoint) and is skipped.
    """

    pipeline: str
    stages: tuple[Stage, ...]
    storage: ShardStorage
    options: dict[str, Any] | None
    forget_prefix: str | None = None
    go_live: bool = False

    @reports_errors
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """One report row per existing (stage, shard) store."""
        prefix = self.forget_prefix
        for batch in batches:
            for shard in batch.column(0).to_pylist():
                for stage in self.stages:
                    if not self.storage.exists(shard_key(int(shard), stage.label)):
                        continue
                    t0 = time.perf_counter()
                    with open_stage_shard(self.storage, self.pipeline, stage.label,
                                          int(shard), self.options) as opened:
                        dropped = 0
                        if prefix is not None:
                            dropped = forget_commits(
                                opened.store, self.pipeline, lambda c: not c.startswith(prefix))
                        if self.go_live:
                            p = stage.build(opened.store, self.pipeline)
                            if p.phase != "live":
                                p.set_phase("live")
                    yield _report(int(shard), stage.label, 0, 0, time.perf_counter() - t0,
                                  detail={"forgotten": dropped, "checkpoint": opened.report()})
