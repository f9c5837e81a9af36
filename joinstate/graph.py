"""What a pipeline maintains: an immutable, store-less graph of operators over named sources.

A graph is built the same way by hand and by the SQL compiler, and never touches a
store::

    import joinstate as js

    sales = js.source("store_sales", schema=sales_schema)
    customer = js.source("customer", schema=customer_schema, unique_key="c_customer_sk")
    per_customer = (sales.join(customer, on=("ss_customer_sk", "c_customer_sk"))
                         .group_by("c_customer_id")
                         .aggregate(total=("sum", "ss_net_paid")))
    graph = js.Graph().output("per_customer", per_customer, materialize=True)
    print(graph.explain())
    with js.StateStore(path) as store:
        p = js.Pipeline(store, "q", graph)          # the runtime: graph + store

Why immutable and store-less: the same definition is shipped to Spark tasks (it
pickles: schemas and ``pyarrow.compute`` expressions are picklable), compared with the
definition a store already holds, explained without a store, and cut into stages; none
of that may depend on which object built it.

Streams are built with :mod:`joinstate.streams` (re-exported here), over nodes
(:mod:`joinstate.nodes`), which are frozen and compared by identity: using one stream
twice (a self-join, q4's six legs of ``year_total``) makes a DAG, not two copies.  A node
created by a :class:`Stream` method is *unnumbered*; a :class:`Graph` numbers the nodes
its outputs reach in creation order (inputs always first), so ascending ids are a
topological order and the labels that name state (``join3``, ``agg5``) follow the order
the definition was written in, whatever order its outputs were declared in.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from joinstate.errors import SchemaMismatchError
from joinstate.names import validate_name
from joinstate.nodes import (
    AGG_FUNCTIONS,
    JOIN_TYPES,
    AggNode,
    CheckNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    Node,
    ProjectNode,
    RepeatNode,
    SourceNode,
    UnionNode,
    UniqueNode,
    WindowNode,
    normalize_how,
)
from joinstate.ordering import OrderBy, check_order_by, sort_indices
from joinstate.schema import WEIGHT
from joinstate.streams import GroupedStream, Stream, as_stream, join_all, source

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "AGG_FUNCTIONS",
    "JOIN_TYPES",
    "SPEC_VERSION",
    "AggNode",
    "CheckNode",
    "FilterNode",
    "Graph",
    "GroupedStream",
    "JoinAllNode",
    "JoinNode",
    "Materialized",
    "Node",
    "ProjectNode",
    "RepeatNode",
    "SourceNode",
    "Stream",
    "UnionNode",
    "UniqueNode",
    "WindowNode",
    "join_all",
    "needed_columns",
    "normalize_how",
    "source",
]

SPEC_VERSION = 2
"""The stored definition's format.  2: sources keep row records and check retractions
(``retractions`` in each source's spec), and a global aggregate has its row from the
start; a version 1 pipeline has neither, so it is refused rather than taken for one."""


# ---- the graph -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Materialized:
    """A materialized output: a hidden count-per-row group-by keeps its contents.

    ``node`` is that group-by; ``order_by`` and ``limit`` apply when the output is read.
    """

    node: Node
    count: str
    order_by: OrderBy = ()
    limit: int | None = None
    hidden: tuple[str, ...] = ()
    """Columns kept only to order the output when it is read (not output columns)."""

    def present(self, held: pa.Table, *, hide: bool = True) -> pa.Table:
        """Rows held (each as often as held) as a read returns them: ordered and limited.

        ``hide=False`` keeps the hidden ordering columns: a shard's first ``limit`` rows
        in order, which a reader merges with other shards' and presents again.
        """
        rows = held
        if self.order_by and rows.num_rows:
            rows = rows.take(sort_indices(rows, self.order_by))
        if self.limit is not None:
            rows = rows.slice(0, self.limit)
        if hide and self.hidden:
            rows = rows.drop_columns(list(self.hidden))
        return rows

    def spec(self) -> dict[str, Any]:
        """JSON-able (stored with the pipeline)."""
        return {"node": self.node.id, "order_by": [list(o) for o in self.order_by],
                "limit": self.limit, **({"hidden": list(self.hidden)} if self.hidden else {})}


Entry = tuple[str, Node, Materialized | None]


class Graph:
    """Named outputs over streams from named sources: what a pipeline maintains.

    Immutable: :meth:`output` returns a new graph.  Nodes reachable from the outputs are
    numbered in creation order (:attr:`nodes`; ascending ids are a topological order).
    ``sources`` may name extra source streams that no output reads (pushes to them are
    accepted and checked, and change nothing downstream).
    """

    __slots__ = ("_entries", "_extra", "_needed", "checks", "materialized", "nodes", "outputs",
                 "sources")

    _entries: tuple[Entry, ...]
    _extra: tuple[Node, ...]
    _needed: dict[int, list[str]]
    nodes: tuple[Node, ...]
    """Every node, numbered: ``nodes[i].id == i``."""
    outputs: dict[str, Node]
    """Output name -> its (numbered) node, in declaration order."""
    materialized: dict[str, Materialized]
    """Output name -> how a materialized output is kept."""
    sources: dict[str, SourceNode]
    """Source name -> its node, in creation order."""
    checks: tuple[UniqueNode, ...]
    """The verifications of unique keys: one per key a source declares in
    ``also_unique`` (and any given as ``checks``), numbered after every other node."""

    def __init__(self, outputs: Mapping[str, Stream] | None = None, *,
                 sources: Iterable[Stream] = (), checks: Iterable[Stream] = ()) -> None:
        entries: list[Entry] = []
        for name, stream in (outputs or {}).items():
            entries.append((validate_name("output", name), as_stream(stream, name).node, None))
        extra = tuple(as_stream(s, "sources").node for s in sources)
        for n in extra:
            if not isinstance(n, SourceNode):
                raise SchemaMismatchError(f"Graph(sources=...): {n.describe()} is not a source")
        given = tuple(as_stream(s, "checks").node for s in checks)
        for n in given:
            if not isinstance(n, UniqueNode):
                raise SchemaMismatchError(f"Graph(checks=...): {n.describe()} is not a "
                                          "unique-key check")
        self._build(tuple(entries), extra + given)

    def _build(self, entries: tuple[Entry, ...], extra: tuple[Node, ...]) -> None:
        names = [e[0] for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaMismatchError(f"the graph names outputs {dup} twice")
        roots: list[Node] = [e[1] for e in entries] + list(extra)
        roots += [e[2].node for e in entries if e[2] is not None]
        reach: dict[int, Node] = {}
        stack = list(roots)
        while stack:
            n = stack.pop()
            if id(n) not in reach:
                reach[id(n)] = n
                stack.extend(n.inputs)
        # One source per name: equal declarations merge, different ones are an error.
        by_name: dict[str, SourceNode] = {}
        alias: dict[int, Node] = {}
        for n in sorted(reach.values(), key=lambda x: x.seq):
            if isinstance(n, SourceNode):
                seen = by_name.get(n.name)
                if seen is None:
                    by_name[n.name] = n
                elif (seen.schema.equals(n.schema) and seen.unique_key == n.unique_key
                      and seen.retractions == n.retractions
                      and seen.also_unique == n.also_unique):
                    alias[id(n)] = seen
                else:
                    raise SchemaMismatchError(
                        f"two different sources are named {n.name!r}: {seen.describe()} and "
                        f"{n.describe()}; give them different names")
        # Every declared further unique key is verified: a check per key not given.
        have = {(id(alias.get(id(c.inputs[0]), c.inputs[0])), c.key)
                for c in reach.values() if isinstance(c, UniqueNode)}
        for src in by_name.values():
            for key in src.also_unique:
                if (id(src), key) not in have:
                    check = UniqueNode((src,), src.schema, key=key, source=src.name,
                                       identity=src.unique_key or tuple(src.schema.names))
                    reach[id(check)] = check
        numbered: dict[int, Node] = {}
        nodes: list[Node] = []
        for n in _creation_order([n for n in reach.values() if id(n) not in alias], alias):
            ins = tuple(numbered[id(alias.get(id(x), x))] for x in n.inputs)
            copy = replace(n, inputs=ins, id=len(nodes), seq=n.seq)
            numbered[id(n)] = copy
            nodes.append(copy)

        def num(n: Node) -> Node:
            return numbered[id(alias.get(id(n), n))]

        object.__setattr__(self, "_entries", entries)
        object.__setattr__(self, "_extra", extra)
        object.__setattr__(self, "nodes", tuple(nodes))
        object.__setattr__(self, "outputs", {name: num(n) for name, n, _ in entries})
        object.__setattr__(self, "materialized", {
            name: replace(m, node=num(m.node)) for name, _, m in entries if m is not None})
        object.__setattr__(self, "sources", {
            n.name: n for n in nodes if isinstance(n, SourceNode)})
        object.__setattr__(self, "checks", tuple(n for n in nodes if isinstance(n, UniqueNode)))
        object.__setattr__(self, "_needed", _needed(self))

    def __setattr__(self, name: str, value: object) -> None:
        msg = "a joinstate.Graph is immutable; output() returns a new graph"
        raise AttributeError(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._entries, self._extra))

    def output(self, name: str, stream: Stream, *, materialize: bool = False,
               order_by: Sequence[tuple[str, ...]] | None = None,
               limit: int | None = None, hide: Sequence[str] = ()) -> Graph:
        """A new graph with ``stream`` as output ``name`` (pushes return its change sets).

        ``materialize=True`` also keeps the output's current contents in the store (a
        count per distinct row, in a group-by state), so that ``Pipeline.read`` can
        return them; ``order_by`` (``[(column, "ascending" | "descending"[, "at_start" |
        "at_end"])]``, NULLs last unless said) and ``limit`` are applied when it is read
        (a top-N over the maintained result, not maintained itself: a retraction could
        otherwise need rows beyond the N).  The hidden group-by is created now, so its
        number follows the streams built before this call.

        ``hide``: columns of ``stream`` that only order the materialized output (SQL's
        ``ORDER BY`` of an expression that is not selected): the materialized state
        keeps them and ``order_by`` may name them, but the output (its change sets and
        what ``read`` returns) is ``stream`` without them.
        """
        validate_name("output", name)
        node = as_stream(stream, f"output {name!r}").node
        if name in self.outputs:
            raise SchemaMismatchError(f"the graph already has an output {name!r}")
        if not isinstance(materialize, bool):
            raise SchemaMismatchError(f"output {name!r}: materialize={materialize!r} must be "
                                      "a bool")
        if (order_by is not None or limit is not None) and not materialize:
            raise SchemaMismatchError(
                f"output {name!r}: order_by and limit apply when a materialized output is "
                "read; pass materialize=True")
        hidden = tuple(hide)
        if hidden:
            unknown = [c for c in hidden if c not in node.schema.names]
            if not materialize or unknown or len(set(hidden)) >= len(node.schema.names):
                raise SchemaMismatchError(
                    f"output {name!r}: hide={list(hidden)} must name columns of the stream "
                    f"(not all of them; {node.schema.names}) of a materialized output")
        order = () if order_by is None else check_order_by(f"output {name!r}", node.schema,
                                                             order_by)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0):
            raise SchemaMismatchError(f"output {name!r}: limit={limit!r} must be an int >= 0")
        m = None
        if materialize:
            count = "__rows"
            while count in node.schema.names:
                count = "_" + count
            s = Stream(node)
            kept = s.group_by(s.columns).aggregate(**{count: ("count", None)})
            m = Materialized(kept.node, count, order, limit, hidden)
            if hidden:
                node = s.select([c for c in s.columns if c not in hidden]).node
        g = object.__new__(Graph)
        g._build((*self._entries, (name, node, m)), self._extra)
        return g

    # ---- read-only facts ---------------------------------------------------------------

    def source_schema(self, name: str) -> pa.Schema:
        """The declared schema of source ``name``."""
        return self.source(name).schema

    def source(self, name: str) -> SourceNode:
        """Source ``name``'s node."""
        if name not in self.sources:
            raise SchemaMismatchError(f"the graph has no source {name!r} (sources: "
                                      f"{list(self.sources)})")
        return self.sources[name]

    def output_schema(self, name: str) -> pa.Schema:
        """The schema of output ``name``'s change sets (its columns and ``_weight``)."""
        if name not in self.outputs:
            raise SchemaMismatchError(f"the graph has no output {name!r} (outputs: "
                                      f"{list(self.outputs)})")
        return self.outputs[name].schema.append(pa.field(WEIGHT, pa.int64(), nullable=False))

    def materialized_output(self, name: str) -> Materialized:
        """How materialized output ``name`` is kept (what reading it needs)."""
        m = self.materialized.get(name)
        if m is None:
            raise SchemaMismatchError(
                f"no materialized output {name!r} (materialized: {sorted(self.materialized)});"
                f" declare it with graph.output({name!r}, stream, materialize=True)")
        return m

    def consumers(self) -> dict[int, list[Node]]:
        """Node id -> the nodes reading it (each once per input it is)."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i.id, []).append(n)
        return out

    def reachable(self, start: Node) -> set[int]:
        """Ids of ``start`` and every node downstream of it."""
        cons = self.consumers()
        seen = {start.id}
        stack = [start]
        while stack:
            for c in cons.get(stack.pop().id, []):
                if c.id not in seen:
                    seen.add(c.id)
                    stack.append(c)
        return seen

    @property
    def needed(self) -> dict[int, list[str]]:
        """:func:`needed_columns` of this graph (computed once)."""
        return self._needed

    def spec(self) -> dict[str, Any]:
        """The JSON-able definition a pipeline stores: nodes, outputs, materialized outputs.

        Only nodes an output or a unique-key check depends on are listed (a source no
        output reads changes nothing downstream), in id order.
        """
        return {
            "version": SPEC_VERSION,
            "nodes": [n.spec() for n in self.nodes if n.id in self._needed],
            "outputs": {k: n.id for k, n in self.outputs.items()},
            **({"materialized": {k: m.spec() for k, m in self.materialized.items()}}
               if self.materialized else {}),
        }

    def explain(self) -> str:
        """The graph as a tree per output; a node read twice is shown once, then named."""
        lines = [f"graph: {len(self.outputs)} output(s) over source(s) "
                 f"{', '.join(self.sources) or '-'}"]
        shown: set[int] = set()

        def walk(n: Node, prefix: str, last: bool) -> None:
            branch = "└─ " if last else "├─ "
            if n.id in shown and n.inputs:
                lines.append(f"{prefix}{branch}{n.label} (shown above)")
                return
            shown.add(n.id)
            lines.append(f"{prefix}{branch}{n.describe()}")
            child = prefix + ("   " if last else "│  ")
            for i, inp in enumerate(n.inputs):
                walk(inp, child, i == len(n.inputs) - 1)

        for name, node in self.outputs.items():
            m = self.materialized.get(name)
            how = ""
            if m is not None:
                how = " (materialized" + (
                    f", order by {', '.join(f'{c} {d}' for c, d, _ in m.order_by)}"
                    if m.order_by else "") + (f", limit {m.limit}" if m.limit is not None
                                              else "") + ")"
            lines.append(f"output {name}{how}: {', '.join(node.schema.names)}")
            walk(node, "  ", True)
        for check in self.checks:
            lines.append(f"check {check.describe()}")
            walk(check.inputs[0], "  ", True)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Graph(outputs={list(self.outputs)}, sources={list(self.sources)}, "
                f"{len(self.nodes)} nodes)")


def _rebuild(entries: tuple[Entry, ...], extra: tuple[Node, ...]) -> Graph:
    g = object.__new__(Graph)
    g._build(entries, extra)
    return g


def _creation_order(nodes: list[Node], alias: Mapping[int, Node]) -> list[Node]:
    """``nodes`` in creation order, inputs always before their consumers.

    Creation order alone is topological for nodes made in one process; nodes unpickled
    from another process keep their sequence numbers, so new nodes built on them could
    sort before them: a node is taken only once its inputs are (Kahn's algorithm, the
    smallest sequence number first), which is creation order whenever that is valid.
    """
    waiting = {id(n): 0 for n in nodes}
    readers: dict[int, list[Node]] = {}
    for n in nodes:
        for i in {id(alias.get(id(x), x)): x for x in n.inputs}:
            waiting[id(n)] += 1
            readers.setdefault(i, []).append(n)
    ready = [(n.seq, k, n) for k, n in enumerate(nodes) if not waiting[id(n)]]
    heapq.heapify(ready)
    order: list[Node] = []
    position = {id(n): k for k, n in enumerate(nodes)}
    while ready:
        _, _, n = heapq.heappop(ready)
        order.append(n)
        for r in readers.get(id(n), []):
            waiting[id(r)] -= 1
            if not waiting[id(r)]:
                heapq.heappush(ready, (r.seq, position[id(r)], r))
    return order


# ---- helpers -------------------------------------------------------------------------------


def needed_columns(graph: Graph) -> dict[int, list[str]]:
    """For every node that feeds an output, the columns its change sets must carry.

    Outputs carry all their columns.  A node no output depends on is absent (its changes
    are never computed).  Never empty: a node whose rows matter but none of its columns
    (``count(*)`` over it) keeps its first column, so a change set has a column to hold
    its rows.  A source keeps its unique key.
    """
    return {k: list(v) for k, v in graph.needed.items()}


def _needed(graph: Graph) -> dict[int, list[str]]:
    need: dict[int, set[str]] = {}
    for node in [*graph.outputs.values(), *(m.node for m in graph.materialized.values()),
                 *graph.checks]:
        need[node.id] = set(node.schema.names)
    for node in reversed(graph.nodes):
        if node.id not in need:
            continue
        if isinstance(node, SourceNode) and node.unique_key:
            need[node.id] |= set(node.unique_key)
        if not need[node.id]:
            need[node.id] = {node.schema.names[0]}
        for inp, cols in zip(node.inputs, node.input_needs(need[node.id]), strict=True):
            need.setdefault(inp.id, set()).update(cols)
    out = {}
    for nid in sorted(need):
        cols = need[nid]
        names = graph.nodes[nid].schema.names
        unknown = cols - set(names)
        if unknown:  # a bug in an input_needs, not a user error
            msg = f"internal: node {graph.nodes[nid].label} asked for missing columns {unknown}"
            raise SchemaMismatchError(msg)
        out[nid] = [n for n in names if n in cols]
    return out
