"""Where the rows of each stream live on N shards, and which operators run where they lie.

The vocabulary of :mod:`planner.distribute` and its rules (``planner/rules/partition_*``).

**Partitionings** (of a stream: which shard holds a row):

* :class:`Hash` -- shard ``xxh3(canonical key) % shards`` over some columns encoded with a
  key plan (:meth:`joinstate.keys.KeyCodec.shard_of`, the one routing function); a row
  whose key has a NULL goes to shard 0.  ``slots`` holds, per key position, the columns
  that are equal in every row (an inner join's two key columns), any of which locates
  the row.  ``nulls`` says whether rows with a NULL in the key are on shard 0 too (a full
  outer join's output is hashed by either side's key only for non-NULL keys).
* :class:`Replicated` -- every shard holds every row (a small dimension copied).
* :class:`Single` -- shard 0 holds every row (what a global aggregate needs).
* :class:`Located` -- hashed by columns the stream no longer has, which one column it
  has determines through verified unique keys (an aggregate by ``c_customer_id`` of
  rows hashed by ``c_customer_sk``): rows equal on that column lie together, and so do
  those of another stream located by the same function (the same dependencies, the
  same key plan), which a delta join on that column needs.
* :class:`Anywhere` -- each row on one shard, by no rule an operator can use.
* :class:`Duplicated` -- a union of a copy and something partitioned: valid for nobody.

**Key lineage.**  A declared unique key ``K`` of a source determines every column of it
(``K -> X``), in the source and in anything that keeps its rows whole: filters,
projections, inner joins, the preserved side of outer joins, aggregates grouping by
columns that contain ``K``.  Inner join keys are equal (``l.k <-> r.k``).  A group key
``G`` whose closure contains the partition columns ``P`` keeps groups together: rows
equal on ``G`` are equal on ``P``, hence on one shard.  The converse direction is not
sound: hashing by ``K`` keeps equal ``K`` together, not equal ``X`` (two customers may
share a ``c_customer_id`` unless it too is declared unique), so an aggregate by
``c_customer_id`` over rows hashed by ``c_customer_sk`` needs an exchange.  A source's
further unique keys (``also_unique``) are verified (:class:`joinstate.nodes.UniqueNode`)
and give dependencies of their own: with ``c_customer_id`` declared so, that aggregate
runs where its input lies, and its output is :class:`Located` by ``c_customer_id``.

**Look-ahead.**  :func:`desires` lists, for every stream, the partitionings its
consumers downstream would take as they lie; :mod:`planner.placement` uses them to pick
exchange keys, and the source rule to pick each source's hash key.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate.errors import SchemaMismatchError
from joinstate.keys import KeyCodec, KeyColumn, key_plan, single_plan
from joinstate.nodes import (
    AggNode,
    CheckNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    ProjectNode,
    RepeatNode,
    SourceNode,
    UnionNode,
    UniqueNode,
    WindowNode,
)
from planner.errors import PlannerError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from joinstate.graph import Graph
    from joinstate.nodes import Node
    from planner.stats import SourceStats

__all__ = [
    "CHAIN_KINDS",
    "FD",
    "PRESERVED",
    "Anywhere",
    "Desire",
    "Duplicated",
    "GraphFacts",
    "Hash",
    "Located",
    "Partitioning",
    "Replicated",
    "Single",
    "candidates",
    "closure",
    "desires",
    "equal_keys",
    "from_json",
    "join_plan",
    "map_target",
    "out_names",
    "picks",
    "plan_ok",
    "route",
    "spread",
]

# ---- partitionings --------------------------------------------------------------------


@dataclass(frozen=True)
class Hash:
    """Rows hashed by one column per slot (any of the slot's equal columns) with ``plan``."""

    slots: tuple[tuple[str, ...], ...]
    plan: tuple[KeyColumn, ...]
    nulls: bool = True
    kind: ClassVar[str] = "hash"

    def __post_init__(self) -> None:
        if not self.slots or len(self.slots) != len(self.plan) or any(
                not s for s in self.slots):
            raise PlannerError(f"internal: Hash{self.slots} with plan of {len(self.plan)}")

    @property
    def columns(self) -> tuple[str, ...]:
        """The column hashed at each position (the first of each slot)."""
        return tuple(s[0] for s in self.slots)

    def describe(self) -> str:
        """``hash(a, b)``; equal columns as ``a=c``; ``(NULLs anywhere)`` if so."""
        cols = ", ".join("=".join(s) if len(s) <= 2 else f"{s[0]} (= {len(s) - 1} equal "
                         "columns)" for s in self.slots)
        return f"hash({cols})" + ("" if self.nulls else " (NULL keys anywhere)")

    def to_json(self) -> dict[str, Any]:
        """JSON-able (inverse: :func:`from_json`)."""
        return {"kind": "hash", "slots": [list(s) for s in self.slots],
                "plan": [[str(k.common), k.kind] for k in self.plan], "nulls": self.nulls}


@dataclass(frozen=True)
class Located:
    """Rows hashed (with ``plan``) by values that column ``columns[0]`` determines.

    ``columns``: equal columns of the stream, any of which locates a row; ``via``: the
    dependencies (their reasons, in order) that map a value of those columns to the
    hashed values, which identify the function: two streams located with equal ``via``
    and ``plan`` put rows with equal locating values on one shard.  Only dependencies
    that hold across streams are used (declared unique keys of sources, equal join
    keys, renames).  ``hashed``: the hashed columns, for the description only.  Never
    a routing (the hashed columns are gone): what moves is routed by a :class:`Hash`.
    """

    columns: tuple[str, ...]
    plan: tuple[KeyColumn, ...]
    via: tuple[str, ...]
    hashed: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    kind: ClassVar[str] = "located"

    def describe(self) -> str:
        """``located by c (hash(h), which c determines: ...)``."""
        c = self.columns
        cols = "=".join(c) if len(c) <= 2 else f"{c[0]} (= {len(c) - 1} equal columns)"
        return (f"located by {cols}: hash({', '.join(self.hashed) or '?'}), which it "
                f"determines ({self.via[0]})")

    def to_json(self) -> dict[str, Any]:
        """JSON-able (inverse: :func:`from_json`)."""
        return {"kind": "located", "columns": list(self.columns),
                "plan": [[str(k.common), k.kind] for k in self.plan], "via": list(self.via),
                "hashed": list(self.hashed)}


@dataclass(frozen=True)
class Replicated:
    """Every shard holds every row."""

    kind: ClassVar[str] = "replicated"

    def describe(self) -> str:
        """``replicated``."""
        return "replicated"

    def to_json(self) -> dict[str, Any]:
        """JSON-able."""
        return {"kind": "replicated"}


@dataclass(frozen=True)
class Single:
    """Shard 0 holds every row."""

    kind: ClassVar[str] = "single"

    def describe(self) -> str:
        """``single (shard 0)``."""
        return "single (shard 0)"

    def to_json(self) -> dict[str, Any]:
        """JSON-able."""
        return {"kind": "single"}


@dataclass(frozen=True)
class Anywhere:
    """Each row on one shard, by no rule an operator can use."""

    kind: ClassVar[str] = "anywhere"

    def describe(self) -> str:
        """``anywhere``."""
        return "anywhere"

    def to_json(self) -> dict[str, Any]:
        """JSON-able."""
        return {"kind": "anywhere"}


@dataclass(frozen=True)
class Duplicated:
    """Some rows on every shard, others on one: a union of a copy with a partitioned stream.

    No consumer takes it as it lies (the copied rows would count once per shard); its
    sources are delivered otherwise where it is read.
    """

    kind: ClassVar[str] = "duplicated"

    def describe(self) -> str:
        """``partly copied``."""
        return "partly copied"

    def to_json(self) -> dict[str, Any]:
        """JSON-able."""
        return {"kind": "duplicated"}


Partitioning = Hash | Located | Replicated | Single | Anywhere | Duplicated


@functools.cache
def _plan_types() -> dict[str, pa.DataType]:
    """Every common key type :func:`joinstate.keys.key_plan` can give, by its text."""
    types: list[pa.DataType] = [pa.int64(), pa.uint64(), pa.float64(), pa.bool_(),
                                pa.large_string(), pa.large_binary(), pa.date32(), pa.date64()]
    for unit in ("s", "ms", "us", "ns"):
        types += [pa.timestamp(unit), pa.timestamp(unit, tz="UTC"), pa.duration(unit)]
    types += [pa.time32("s"), pa.time32("ms"), pa.time64("us"), pa.time64("ns")]
    types += [pa.decimal128(38, s) for s in range(39)]
    return {str(t): t for t in types}


def from_json(value: Mapping[str, Any]) -> Partitioning:
    """The partitioning a ``to_json()`` gave."""
    kind = value.get("kind")
    if kind == "hash":
        table = _plan_types()
        try:
            plan = tuple(KeyColumn(table[t], k) for t, k in value["plan"])
        except KeyError as exc:
            raise PlannerError(f"a hash partitioning's key plan names an unknown type {exc}") \
                from exc
        return Hash(tuple(tuple(s) for s in value["slots"]), plan, bool(value.get("nulls", True)))
    if kind == "located":
        table = _plan_types()
        try:
            lplan = tuple(KeyColumn(table[t], k) for t, k in value["plan"])
        except KeyError as exc:
            raise PlannerError(f"a located partitioning's key plan names an unknown type "
                               f"{exc}") from exc
        return Located(tuple(value["columns"]), lplan, tuple(value["via"]),
                       tuple(value.get("hashed", ())))
    simple: dict[str, Partitioning] = {"replicated": Replicated(), "single": Single(),
                                       "anywhere": Anywhere(), "duplicated": Duplicated()}
    if kind not in simple:
        raise PlannerError(f"not a partitioning: {dict(value)!r}")
    return simple[kind]


def route(partitioning: Partitioning, table: pa.Table | pa.RecordBatch,
          shards: int) -> np.ndarray | None:
    """The shard of every row of ``table`` under ``partitioning`` (int64).

    None for :class:`Replicated` (every shard gets every row).  :class:`Anywhere` is not
    a routing: rows that must move need a key.
    """
    if isinstance(partitioning, Replicated):
        return None
    if isinstance(partitioning, Single):
        return np.zeros(table.num_rows, dtype=np.int64)
    if isinstance(partitioning, Hash):
        codec = KeyCodec(partitioning.columns, partitioning.plan, "partition")
        return codec.shard_of(table, shards)
    raise PlannerError(f"internal: rows cannot be routed '{partitioning.describe()}'")


# ---- functional dependencies ----------------------------------------------------------


@dataclass(frozen=True)
class FD:
    """``lhs`` determines ``rhs`` in every row of a stream (non-NULL ``lhs`` as declared).

    ``origin``: for a source's verified unique key (``also_unique``: checked, never
    NULL), (column here, the source's column it holds) of every column of ``rhs``: such
    a dependency is one function of the source's contents in every stream it reaches,
    whatever the columns are called there, and holds for every row.
    """

    lhs: frozenset[str]
    rhs: frozenset[str]
    why: str
    origin: frozenset[tuple[str, str]] = frozenset()

    def renamed(self, names: Mapping[str, Sequence[str]]) -> FD | None:
        """The dependency after a rename ``column -> its new names`` (None if lost)."""
        if not all(names.get(c) for c in self.lhs):
            return None
        rhs = frozenset(o for c in self.rhs for o in names.get(c, ()))
        if not rhs:
            return None
        origin = frozenset((o, src) for c, src in self.origin for o in names.get(c, ()))
        return FD(frozenset(names[c][0] for c in self.lhs), rhs, self.why, origin)

    def keeping(self, columns: frozenset[str] | set[str]) -> FD:
        """The dependency with ``rhs`` (and ``origin``) cut to ``columns``."""
        return FD(self.lhs, self.rhs & columns, self.why,
                  frozenset(x for x in self.origin if x[0] in columns))


def closure(columns: Iterable[str], fds: Iterable[FD]) -> tuple[set[str], list[FD]]:
    """Every column ``columns`` determine, and the dependencies used to get there."""
    have = set(columns)
    used: list[FD] = []
    pending = list(fds)
    grew = True
    while grew:
        grew = False
        for fd in pending:
            if fd.lhs <= have and not fd.rhs <= have:
                have |= fd.rhs
                used.append(fd)
                grew = True
    return have, used


# ---- facts about a graph ----------------------------------------------------------------

CHAIN_KINDS = ("source", "filter", "project", "union")
"""Operators without state: a stream made only of these from sources can be recomputed
wherever its sources are delivered."""

PRESERVED: dict[str, tuple[int, ...]] = {
    "inner": (), "left": (0,), "right": (1,), "full": (0, 1),
    "left_semi": (0,), "left_anti": (0,),
}
"""Input positions whose rows a join emits without a match (a copy would emit them once
per shard); the other side may be replicated (semi and anti joins: only the right)."""

DEFAULT_ROWS = 1_000_000
"""Rows assumed for a source without statistics, for costs only (never to replicate)."""


def picks(node: ProjectNode) -> dict[str, list[str]]:
    """A projection's plain column picks: input column -> its output names."""
    src = node.inputs[0].schema.names
    out: dict[str, list[str]] = {}
    for f, e in zip(node.schema, node.exprs, strict=True):
        for c in src:
            if e.equals(pc.field(c)):
                out.setdefault(c, []).append(f.name)
                break
    return out


def join_plan(node: JoinNode | JoinAllNode) -> tuple[KeyColumn, ...]:
    """The key plan a join (or ``join_all``) compares keys with."""
    a, b = node.inputs[0], node.inputs[1]
    return tuple(key_plan(a.schema, node.key(0), b.schema, node.key(1)))


def out_names(node: JoinNode | JoinAllNode, pos: int) -> dict[str, str]:
    """Input ``pos``'s column -> its output name, for a join or ``join_all``."""
    inp = node.inputs[pos]
    if isinstance(node, JoinNode):
        names = node.out_left if pos == 0 else node.out_right
        return dict(zip(inp.schema.names, names, strict=False)) if names else {}
    leg = node.legs[pos]
    return {c: node.out_name(leg, c) for c in inp.schema.names}


@dataclass(frozen=True)
class GraphFacts:
    """What the partitioning rules read about a graph: live nodes, chains, estimates.

    ``nodes``: the nodes the outputs need (the hidden group-by of a materialized output
    is not one: a materialized output keeps a count per row, which adds up over shards,
    so it runs wherever its output lies).  ``rows``: estimated rows of each node (a
    source's statistics, else :data:`DEFAULT_ROWS`; a foreign-key join keeps its
    referencing input's rows).  ``fds``: functional dependencies per node.
    """

    graph: Graph
    nodes: Mapping[int, Node]
    order: tuple[int, ...]
    consumers: Mapping[int, tuple[tuple[int, int], ...]]
    outputs: Mapping[str, int]
    chain: frozenset[int]
    rows: Mapping[int, float]
    known: Mapping[str, int | None]
    fds: Mapping[int, tuple[FD, ...]]
    uniques: Mapping[int, tuple[frozenset[str], ...]]
    extra_sources: tuple[str, ...] = ()

    @staticmethod
    def of(graph: Graph, stats: Mapping[str, SourceStats] | None = None) -> GraphFacts:
        """The facts of ``graph`` with ``stats`` per source (absent: unknown size)."""
        stats = stats or {}
        live: dict[int, Node] = {}
        stack = [*graph.outputs.values(), *graph.checks]
        while stack:
            n = stack.pop()
            if n.id not in live:
                live[n.id] = n
                stack.extend(n.inputs)
        order = tuple(sorted(live))
        consumers: dict[int, list[tuple[int, int]]] = {i: [] for i in order}
        for i in order:
            for pos, inp in enumerate(live[i].inputs):
                consumers[inp.id].append((i, pos))
        chain: set[int] = set()
        for i in order:
            n = live[i]
            if n.kind in CHAIN_KINDS and all(x.id in chain for x in n.inputs):
                chain.add(i)
        known: dict[str, int | None] = {}
        for name in graph.sources:
            s = stats.get(name)
            known[name] = None if s is None else s.rows
        fds: dict[int, tuple[FD, ...]] = {}
        uniques: dict[int, tuple[frozenset[str], ...]] = {}
        rows: dict[int, float] = {}
        for i in order:
            n = live[i]
            fds[i] = _fds(n, fds)
            uniques[i] = _uniques(n, uniques)
            rows[i] = _rows(n, rows, uniques, known)
        extra = tuple(s for s, n in graph.sources.items() if n.id not in live)
        return GraphFacts(graph, live, order, {k: tuple(v) for k, v in consumers.items()},
                          {k: n.id for k, n in graph.outputs.items()}, frozenset(chain),
                          rows, known, fds, uniques, extra)

    def node(self, nid: int) -> Node:
        """The node with id ``nid``."""
        return self.nodes[nid]

    def sources_of(self, nid: int) -> tuple[str, ...]:
        """Names of the sources whose rows flow into node ``nid``, in graph order."""
        out: set[str] = set()
        stack = [self.nodes[nid]]
        while stack:
            n = stack.pop()
            if isinstance(n, SourceNode):
                out.add(n.name)
            stack.extend(n.inputs)
        return tuple(s for s in self.graph.sources if s in out)

    def source_rows(self, name: str) -> float:
        """Rows of source ``name`` (assumed :data:`DEFAULT_ROWS` when unknown)."""
        r = self.known.get(name)
        return float(DEFAULT_ROWS if r is None else r)

    def largest_source(self) -> int:
        """The most rows any source with statistics has (0 if none has)."""
        return max((r for r in self.known.values() if r is not None), default=0)


def _fds(n: Node, fds: Mapping[int, tuple[FD, ...]]) -> tuple[FD, ...]:
    if isinstance(n, SourceNode):
        out_src: list[FD] = []
        every = frozenset(n.schema.names)
        origin = frozenset((c, c) for c in every)
        if n.unique_key:  # trusted as declared, NULLs not excluded: no origin
            out_src.append(FD(frozenset(n.unique_key), every,
                              f"{', '.join(n.unique_key)} is the declared unique key of "
                              f"source {n.name}"))
        for key in n.also_unique:
            out_src.append(FD(frozenset(key), every,
                              f"{', '.join(key)} is a verified unique key of source {n.name}",
                              origin))
        return tuple(out_src)
    if isinstance(n, FilterNode | CheckNode | WindowNode):
        # The input's rows (a window's with columns added, a top-N's fewer): what
        # determined what still does.
        return fds[n.inputs[0].id]
    if isinstance(n, RepeatNode):  # the same rows, copied, without the count column
        return tuple(fd.keeping(fd.rhs - {n.count}) for fd in fds[n.inputs[0].id]
                     if n.count not in fd.lhs and fd.rhs - {n.count})
    out: list[FD] = []
    if isinstance(n, ProjectNode):
        names = picks(n)
        for fd in fds[n.inputs[0].id]:
            moved = fd.renamed(names)
            if moved is not None:
                out.append(moved)
        for c, outs in names.items():
            if len(outs) > 1:
                out.append(FD(frozenset([outs[0]]), frozenset(outs),
                              f"{', '.join(outs)} are all column {c} ({n.label})"))
        return tuple(out)
    if isinstance(n, AggNode):
        keys = frozenset(n.keys)
        own = [FD(keys, frozenset(a for a, _, _ in n.aggs),
                  f"{n.label} has one row per group")] if keys else []
        kept = [fd for fd in fds[n.inputs[0].id] if fd.lhs <= keys and fd.rhs & keys]
        return tuple(own + [fd.keeping(keys) for fd in kept])
    if isinstance(n, JoinNode | JoinAllNode):
        sides: tuple[int, ...] = tuple(range(len(n.inputs)))
        if isinstance(n, JoinNode):
            sides = {"inner": (0, 1), "left": (0,), "left_semi": (0,), "left_anti": (0,),
                     "right": (1,), "full": ()}[n.how]
        for pos in sides:
            names1 = {c: [o] for c, o in out_names(n, pos).items()}
            for fd in fds[n.inputs[pos].id]:
                moved = fd.renamed(names1)
                if moved is not None:
                    out.append(moved)
        for a, b, why in equal_keys(n):
            out += [FD(frozenset([a]), frozenset([b]), why), FD(frozenset([b]),
                                                                  frozenset([a]), why)]
        return tuple(out)
    return ()


def equal_keys(n: Node) -> list[tuple[str, str, str]]:
    """Output columns equal in every row: an inner join's (or join_all's) key pairs."""
    if isinstance(n, JoinNode) and n.how == "inner":
        lo, ro = out_names(n, 0), out_names(n, 1)
        return [(lo[a], ro[b], f"{n.label} is an inner join on {a} = {b}")
                for a, b in zip(n.left_key, n.right_key, strict=True)]
    if isinstance(n, JoinAllNode):
        first = n.out_name(n.legs[0], n.keys[0])
        return [(first, n.out_name(leg, k), f"{n.label} joins its legs on equal keys")
                for leg, k in zip(n.legs[1:], n.keys[1:], strict=True)]
    return []


def _uniques(n: Node, uniques: Mapping[int, tuple[frozenset[str], ...]]
             ) -> tuple[frozenset[str], ...]:
    if isinstance(n, SourceNode):
        return ((frozenset(n.unique_key),) if n.unique_key else ()) + tuple(
            frozenset(k) for k in n.also_unique)
    if isinstance(n, FilterNode | CheckNode | WindowNode):
        return uniques[n.inputs[0].id]
    if isinstance(n, ProjectNode):
        names = picks(n)
        return tuple(frozenset(names[c][0] for c in u) for u in uniques[n.inputs[0].id]
                     if all(c in names for c in u))
    if isinstance(n, AggNode):
        return (frozenset(n.keys),)
    if isinstance(n, JoinNode) and n.how in ("inner", "left", "left_semi", "left_anti"):
        left, right = n.inputs
        if n.how in ("left_semi", "left_anti") or any(
                u <= set(n.right_key) for u in uniques[right.id]):
            lo = out_names(n, 0)
            return tuple(frozenset(lo[c] for c in u) for u in uniques[left.id])
    return ()


def _rows(n: Node, rows: Mapping[int, float], uniques: Mapping[int, tuple[frozenset[str], ...]],
          known: Mapping[str, int | None]) -> float:
    ins = [rows[i.id] for i in n.inputs]
    if isinstance(n, SourceNode):
        r = known.get(n.name)
        return float(DEFAULT_ROWS if r is None else r)
    if isinstance(n, FilterNode | ProjectNode):
        return ins[0]
    if isinstance(n, UnionNode):
        return sum(ins)
    if isinstance(n, AggNode):
        return 1.0 if not n.keys else ins[0]
    if isinstance(n, JoinNode):
        left, right = n.inputs
        if n.how in ("left_semi", "left_anti"):
            return ins[0]
        if any(u <= set(n.right_key) for u in uniques[right.id]):
            return ins[0]
        if any(u <= set(n.left_key) for u in uniques[left.id]):
            return ins[1]
        return max(ins)
    return max(ins)


# ---- look-ahead: what consumers would like -------------------------------------------------


@dataclass(frozen=True)
class Desire:
    """A partitioning some consumer downstream would take as is, and which one."""

    target: Hash | Single
    why: str


def _add(out: list[Desire], d: Desire) -> None:
    if all(x.target != d.target for x in out):
        out.append(d)


def desires(facts: GraphFacts, replicated: frozenset[str] = frozenset()
            ) -> dict[int, list[Desire]]:
    """For every live node, the partitionings its consumers would take without moving it.

    Computed from the outputs up: a join wants its key on both inputs (sub-keys its own
    consumers want first); an aggregate wants the columns its consumers want among its
    group key, then the whole group key (a global one: :class:`Single`); a ``join_all``
    wants each leg's key; filters, projections (through renames) and unions pass their
    consumers' wishes on, and so do checks and repeats; a window wants what an aggregate
    by its PARTITION BY would (none: :class:`Single`).  A join whose other input is a
    chain of ``replicated`` sources that may be copied wants nothing of its own, only its
    consumers' wishes.  A unique-key check wants its source hashed by the key, listed
    after every other wish: it reads a delivery of its own, so it should not decide
    where the source's rows go for everyone else.
    """
    want: dict[int, list[Desire]] = {i: [] for i in facts.order}
    copied = {i for i in facts.order if i in facts.chain and facts.sources_of(i)
              and set(facts.sources_of(i)) <= replicated}
    for cid in reversed(facts.order):
        c = facts.nodes[cid]
        mine = want[cid]
        if isinstance(c, UniqueNode):
            continue  # wished for last (below): a check takes a delivery of its own
        for pos, inp in enumerate(c.inputs):
            target = want[inp.id]
            if isinstance(c, FilterNode | UnionNode | CheckNode | RepeatNode):
                for d in mine:  # a repeat's count column is no output: never wished for
                    _add(target, d)
            elif isinstance(c, WindowNode):
                if not c.partition_by:
                    _add(target, Desire(Single(), f"{c.label} orders all rows together"))
                    continue
                for d in mine:
                    if isinstance(d.target, Hash) and set(d.target.columns) <= set(
                            c.partition_by):
                        _add(target, Desire(d.target, d.why))
                plan = tuple(single_plan(inp.schema, c.partition_by))
                _add(target, Desire(Hash(tuple((k,) for k in c.partition_by), plan),
                                    f"{c.label} partitions by {', '.join(c.partition_by)}"))
            elif isinstance(c, ProjectNode):
                back = {o: i for i, outs in picks(c).items() for o in outs}
                for d in mine:
                    mapped = map_target(d.target, back)
                    if mapped is not None:
                        _add(target, Desire(mapped, d.why))
            elif isinstance(c, AggNode):
                if not c.keys:
                    _add(target, Desire(Single(), f"{c.label} aggregates all rows"))
                    continue
                for d in mine:
                    if isinstance(d.target, Hash) and set(d.target.columns) <= set(c.keys):
                        _add(target, Desire(d.target, d.why))
                plan = tuple(single_plan(inp.schema, c.keys))
                _add(target, Desire(Hash(tuple((k,) for k in c.keys), plan),
                                    f"{c.label} groups by {', '.join(c.keys)}"))
            elif isinstance(c, JoinAllNode):
                plan = join_plan(c)[:1]
                _add(target, Desire(Hash(((c.keys[pos],),), plan),
                                    f"{c.label} joins its {len(c.legs)} legs on "
                                    f"{', '.join(dict.fromkeys(c.keys))}"))
            elif isinstance(c, JoinNode):
                other = c.inputs[1 - pos]
                names = out_names(c, pos)
                back = {o: i for i, o in names.items()}
                free = other.id in copied and (1 - pos) not in PRESERVED[c.how]
                key, okey = c.key(pos), c.key(1 - pos)
                plan = join_plan(c)
                if c.how == "inner":  # the other side's key columns equal this side's
                    onames = out_names(c, 1 - pos)
                    for j, oc in enumerate(okey):
                        if oc in onames:
                            back.setdefault(onames[oc], key[j])
                for d in mine:
                    if not isinstance(d.target, Hash):
                        continue
                    cols = [back.get(col) for col in d.target.columns]
                    if any(x is None for x in cols):
                        continue
                    idx = [key.index(x) for x in cols if x in key]
                    if len(idx) == len(cols) and plan_ok(d.target.plan, plan, idx):
                        _add(target, Desire(Hash(tuple((key[j],) for j in idx),
                                                 tuple(plan[j] for j in idx)),
                                            f"{d.why}, through {c.label}"))
                    elif free:
                        mapped = Hash(tuple((x,) for x in cols if x is not None),
                                      d.target.plan, d.target.nulls)
                        _add(target, Desire(mapped, f"{d.why}, through {c.label}"))
                if not free:
                    side = "left" if pos == 0 else "right"
                    _add(target, Desire(Hash(tuple((k,) for k in key), plan),
                                        f"{c.label} ({side} side) joins on {', '.join(key)}"))
    for check in facts.graph.checks:
        if check.id in facts.nodes:
            _add(want[check.inputs[0].id], check_desire(check))
    return want


def check_desire(check: UniqueNode) -> Desire:
    """What a unique-key check needs: its input hashed by the key (equal values meet)."""
    inp = check.inputs[0]
    plan = tuple(single_plan(inp.schema, list(check.key)))
    return Desire(Hash(tuple((k,) for k in check.key), plan),
                  f"{check.label} verifies that {', '.join(check.key)} is unique in source "
                  f"{check.source}")


def plan_ok(have: Sequence[KeyColumn], plan: Sequence[KeyColumn], idx: Sequence[int]) -> bool:
    """Whether key plan ``have`` is ``plan`` at positions ``idx``."""
    return len(have) == len(idx) and all(have[k] == plan[j] for k, j in enumerate(idx))


def map_target(t: Hash | Single, back: Mapping[str, str]) -> Hash | Single | None:
    """``t`` with its columns renamed by ``back`` (None if one has no new name)."""
    if isinstance(t, Single):
        return t
    cols = [back.get(c) for c in t.columns]
    if any(c is None for c in cols):
        return None
    return Hash(tuple((c,) for c in cols if c is not None), t.plan, t.nulls)


def spread(node: SourceNode) -> Hash | Single:
    """A source's partitioning when no consumer needs a key.

    Its unique key, else every column a key can hold: the same row always lands on the
    same shard, so a retraction finds the row it retracts.
    """
    cols = list(node.unique_key or [])
    if not cols:
        for f in node.schema:
            try:
                single_plan(node.schema, [f.name])
            except SchemaMismatchError:  # a type no key can hold: not hashed by
                continue
            cols.append(f.name)
    if not cols:
        return Single()
    return Hash(tuple((c,) for c in cols), tuple(single_plan(node.schema, cols)))


def candidates(facts: GraphFacts, source: str, want: Mapping[int, list[Desire]]
               ) -> list[tuple[Hash | Single, str]]:
    """The partitionings worth trying for ``source``: its consumers' wishes, then spread."""
    node = facts.graph.sources[source]
    out: list[tuple[Hash | Single, str]] = [(w.target, w.why) for w in want.get(node.id, [])]
    s = spread(node)
    if all(p != s for p, _ in out):
        why = (f"spread by its unique key {', '.join(node.unique_key)}" if node.unique_key
               else "spread by the hash of its rows")
        out.append((s, why if not out else f"{why} (tried against its consumers' wishes)"))
    return out
