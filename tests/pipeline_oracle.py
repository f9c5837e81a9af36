"""A neutral description of ``joinstate.Pipeline`` graphs, an SQL oracle for them, and a harness.

A pipeline is described once, as a small DAG of :class:`Node` objects (sources, joins,
filters, projections, unions, aggregates, N-way joins) whose expressions are
:class:`Expr` trees.  The same description

* builds a real ``joinstate.Pipeline`` (:func:`build_pipeline`), and
* is evaluated from scratch by DuckDB on the *integrated* inputs (:func:`evaluate`),
  with plain SQL semantics: NULL keys never match, outer joins null-extend, NULL
  group keys form a group, ``SUM``/``MIN``/``MAX`` skip NULLs, a NULL predicate
  drops the row.  Integrated weights are expanded to multiplicities (a weight of 3
  is three identical rows), so the oracle shares nothing with the incremental engine.

:class:`PipelineHarness` pushes change sets into a pipeline, integrates every output's
deltas, and compares them as multisets with the oracle after every push.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

import joinstate

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

Row = tuple[Any, ...]
Entry = tuple[Row, int]
WEIGHT = "_weight"
JOIN_TYPES: tuple[str, ...] = ("inner", "left", "right", "full", "left_semi", "left_anti")


def q(name: str) -> str:
    """Quote an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


# --------------------------------------------------------------------------- expressions


class Expr:
    """A scalar expression that renders both as a pyarrow Expression and as SQL."""

    def to_pc(self) -> pc.Expression:
        raise NotImplementedError

    def to_sql(self) -> str:
        raise NotImplementedError

    def columns(self) -> set[str]:
        raise NotImplementedError

    # operators build trees; ``==`` is left alone (use .eq) so Expr stays hashable/comparable
    def __gt__(self, other: Any) -> Expr:
        return Bin(">", self, lit_of(other))

    def __ge__(self, other: Any) -> Expr:
        return Bin(">=", self, lit_of(other))

    def __lt__(self, other: Any) -> Expr:
        return Bin("<", self, lit_of(other))

    def __le__(self, other: Any) -> Expr:
        return Bin("<=", self, lit_of(other))

    def eq(self, other: Any) -> Expr:
        return Bin("=", self, lit_of(other))

    def ne(self, other: Any) -> Expr:
        return Bin("!=", self, lit_of(other))

    def __add__(self, other: Any) -> Expr:
        return Bin("+", self, lit_of(other))

    def __sub__(self, other: Any) -> Expr:
        return Bin("-", self, lit_of(other))

    def __mul__(self, other: Any) -> Expr:
        return Bin("*", self, lit_of(other))

    def __and__(self, other: Expr) -> Expr:
        return Bin("and", self, other)

    def __or__(self, other: Expr) -> Expr:
        return Bin("or", self, other)

    def __invert__(self) -> Expr:
        return Not(self)

    def is_null(self) -> Expr:
        return IsNull(self, negate=False)

    def is_valid(self) -> Expr:
        return IsNull(self, negate=True)


@dataclass(eq=False)
class Col(Expr):
    name: str

    def to_pc(self) -> pc.Expression:
        return pc.field(self.name)

    def to_sql(self) -> str:
        return q(self.name)

    def columns(self) -> set[str]:
        return {self.name}

    def __repr__(self) -> str:
        return f"col({self.name!r})"


@dataclass(eq=False)
class Lit(Expr):
    value: Any

    def to_pc(self) -> pc.Expression:
        return pc.scalar(self.value)

    def to_sql(self) -> str:
        v = self.value
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        if isinstance(v, int):
            return f"CAST({v} AS BIGINT)"
        if isinstance(v, Decimal):
            exp = -v.as_tuple().exponent if isinstance(v.as_tuple().exponent, int) else 0
            return f"CAST('{v}' AS DECIMAL(18,{max(exp, 0)}))"
        if isinstance(v, float):
            return f"CAST({v!r} AS DOUBLE)"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        msg = f"unsupported literal {v!r}"
        raise TypeError(msg)

    def columns(self) -> set[str]:
        return set()

    def __repr__(self) -> str:
        return f"lit({self.value!r})"


def lit_of(value: Any) -> Expr:
    return value if isinstance(value, Expr) else Lit(value)


_PC_BIN = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
}
_SQL_BIN = {"and": "AND", "or": "OR", "!=": "<>"}


@dataclass(eq=False)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    def to_pc(self) -> pc.Expression:
        return _PC_BIN[self.op](self.a.to_pc(), self.b.to_pc())

    def to_sql(self) -> str:
        return f"({self.a.to_sql()} {_SQL_BIN.get(self.op, self.op)} {self.b.to_sql()})"

    def columns(self) -> set[str]:
        return self.a.columns() | self.b.columns()

    def __repr__(self) -> str:
        return f"({self.a!r} {self.op} {self.b!r})"


@dataclass(eq=False)
class Not(Expr):
    a: Expr

    def to_pc(self) -> pc.Expression:
        return ~self.a.to_pc()

    def to_sql(self) -> str:
        return f"(NOT {self.a.to_sql()})"

    def columns(self) -> set[str]:
        return self.a.columns()

    def __repr__(self) -> str:
        return f"~{self.a!r}"


@dataclass(eq=False)
class IsNull(Expr):
    a: Expr
    negate: bool

    def to_pc(self) -> pc.Expression:
        return self.a.to_pc().is_valid() if self.negate else self.a.to_pc().is_null()

    def to_sql(self) -> str:
        return f"({self.a.to_sql()} IS {'NOT ' if self.negate else ''}NULL)"

    def columns(self) -> set[str]:
        return self.a.columns()

    def __repr__(self) -> str:
        return f"{self.a!r}.{'is_valid' if self.negate else 'is_null'}()"


def col(name: str) -> Col:
    return Col(name)


def lit(value: Any) -> Lit:
    return Lit(value)


def expr_type(expr: Expr, schema: pa.Schema) -> pa.DataType:
    """The Arrow type pyarrow gives ``expr`` over ``schema`` (the engine evaluates with pyarrow)."""
    table = ds.dataset(schema.empty_table()).to_table(columns={"x": expr.to_pc()})
    return table.schema.field("x").type


# --------------------------------------------------------------------------- nodes

_ids = itertools.count()


@dataclass(eq=False)
class Node:
    """A stream of the pipeline; ``schema`` holds the columns the spec promises (no weight)."""

    schema: pa.Schema = field(init=False)
    nid: int = field(init=False, default_factory=lambda: next(_ids))

    def inputs(self) -> list[Node]:
        return []

    # convenience builders, so tests read like the pipeline API
    def join(self, other: Node, on: Any, how: str = "inner",
             suffixes: tuple[str, str] = ("", "_right")) -> Join:
        return Join(self, other, on, how, suffixes)

    def filter(self, pred: Expr) -> Filter:
        return Filter(self, pred)

    def select(self, items: Any) -> Select:
        return Select(self, items)

    def with_columns(self, items: Mapping[str, Expr]) -> WithColumns:
        return WithColumns(self, dict(items))

    def union_all(self, *others: Node) -> UnionAll:
        return UnionAll([self, *others])

    def group_by(self, keys: Sequence[str], **aggs: tuple[str, Any]) -> GroupBy:
        return GroupBy(self, list(keys), dict(aggs))


@dataclass(eq=False)
class Source(Node):
    name: str
    source_schema: pa.Schema
    unique_key: list[str] | None = None

    def __post_init__(self) -> None:
        self.schema = self.source_schema

    def describe(self, ref: Mapping[int, str]) -> str:
        uk = f", unique_key={self.unique_key}" if self.unique_key else ""
        cols = ", ".join(f"{f.name}: {f.type}" for f in self.schema)
        return f"js.source({self.name!r}, schema=[{cols}]{uk})"


def _on_pairs(on: Any) -> list[tuple[str, str]]:
    if isinstance(on, str):
        return [(on, on)]
    if isinstance(on, tuple):
        return [on]
    return [tuple(p) if not isinstance(p, str) else (p, p) for p in on]


@dataclass(eq=False)
class Join(Node):
    left: Node
    right: Node
    on: Any
    how: str = "inner"
    suffixes: tuple[str, str] = ("", "_right")

    def __post_init__(self) -> None:
        self.pairs = _on_pairs(self.on)
        lnames, rnames = self.left.schema.names, self.right.schema.names
        if self.how in ("left_semi", "left_anti"):
            self.out_left, self.out_right = list(lnames), []
            self.schema = pa.schema([pa.field(f.name, f.type) for f in self.left.schema])
            return
        both = set(lnames) & set(rnames)
        self.out_left = [n + self.suffixes[0] if n in both else n for n in lnames]
        self.out_right = [n + self.suffixes[1] if n in both else n for n in rnames]
        fields = [pa.field(n, f.type) for n, f in zip(self.out_left, self.left.schema, strict=True)]
        fields += [pa.field(n, f.type)
                   for n, f in zip(self.out_right, self.right.schema, strict=True)]
        self.schema = pa.schema(fields)

    def inputs(self) -> list[Node]:
        return [self.left, self.right]

    def describe(self, ref: Mapping[int, str]) -> str:
        return (f"{ref[self.left.nid]}.join({ref[self.right.nid]}, on={self.on!r}, "
                f"how={self.how!r})")


@dataclass(eq=False)
class Filter(Node):
    input: Node
    pred: Expr

    def __post_init__(self) -> None:
        self.schema = self.input.schema

    def inputs(self) -> list[Node]:
        return [self.input]

    def describe(self, ref: Mapping[int, str]) -> str:
        return f"{ref[self.input.nid]}.filter({self.pred!r})"


@dataclass(eq=False)
class Select(Node):
    """``items``: a list of names, or a dict name -> Expr | column name (the API's forms)."""

    input: Node
    items: Any

    def __post_init__(self) -> None:
        if isinstance(self.items, dict):
            self.exprs = {n: (Col(e) if isinstance(e, str) else e) for n, e in self.items.items()}
        else:
            self.exprs = {n: Col(n) for n in self.items}
        self.schema = pa.schema(
            [pa.field(n, expr_type(e, self.input.schema)) for n, e in self.exprs.items()])

    def inputs(self) -> list[Node]:
        return [self.input]

    def api_arg(self) -> Any:
        if isinstance(self.items, dict):
            return {n: (e if isinstance(e, str) else e.to_pc()) for n, e in self.items.items()}
        return list(self.items)

    def describe(self, ref: Mapping[int, str]) -> str:
        return f"{ref[self.input.nid]}.select({self.items!r})"


@dataclass(eq=False)
class WithColumns(Node):
    input: Node
    items: dict[str, Expr]

    def __post_init__(self) -> None:
        exprs: dict[str, Expr] = {n: Col(n) for n in self.input.schema.names}
        exprs.update(self.items)  # replaced columns keep their position, new ones go last
        self.exprs = exprs
        self.schema = pa.schema(
            [pa.field(n, expr_type(e, self.input.schema)) for n, e in exprs.items()])

    def inputs(self) -> list[Node]:
        return [self.input]

    def describe(self, ref: Mapping[int, str]) -> str:
        return f"{ref[self.input.nid]}.with_columns({self.items!r})"


@dataclass(eq=False)
class UnionAll(Node):
    parts: list[Node]

    def __post_init__(self) -> None:
        self.schema = pa.schema([pa.field(f.name, f.type) for f in self.parts[0].schema])

    def inputs(self) -> list[Node]:
        return list(self.parts)

    def describe(self, ref: Mapping[int, str]) -> str:
        rest = ", ".join(ref[p.nid] for p in self.parts[1:])
        return f"{ref[self.parts[0].nid]}.union_all({rest})"


def sum_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_decimal(t):
        return pa.decimal128(38, t.scale)
    if pa.types.is_floating(t):
        return pa.float64()
    msg = f"no sum over {t}"
    raise TypeError(msg)


@dataclass(eq=False)
class GroupBy(Node):
    """``aggs``: name -> (fn, arg) with arg an Expr, a column name, or None (count(*))."""

    input: Node
    keys: list[str]
    aggs: dict[str, tuple[str, Any]]

    def __post_init__(self) -> None:
        fields = [pa.field(k, self.input.schema.field(k).type) for k in self.keys]
        self.agg_exprs: dict[str, tuple[str, Expr | None]] = {}
        for name, (fn, arg) in self.aggs.items():
            e = Col(arg) if isinstance(arg, str) else arg
            self.agg_exprs[name] = (fn, e)
            if fn == "count":
                t = pa.int64()
            else:
                assert e is not None
                it = expr_type(e, self.input.schema)
                t = sum_type(it) if fn == "sum" else it
            fields.append(pa.field(name, t))
        self.schema = pa.schema(fields)

    def inputs(self) -> list[Node]:
        return [self.input]

    def describe(self, ref: Mapping[int, str]) -> str:
        aggs = ", ".join(f"{n}={v!r}" for n, v in self.aggs.items())
        return f"{ref[self.input.nid]}.group_by({self.keys!r}).aggregate({aggs})"


@dataclass(eq=False)
class JoinAll(Node):
    legs: dict[str, Node]
    on: Any  # a column name, or a dict leg -> column

    def __post_init__(self) -> None:
        self.on_cols = self.on if isinstance(self.on, dict) else {leg: self.on for leg in self.legs}
        self.schema = pa.schema([pa.field(f"{leg}_{f.name}", f.type)
                                 for leg, node in self.legs.items() for f in node.schema])

    def inputs(self) -> list[Node]:
        return list(self.legs.values())

    def describe(self, ref: Mapping[int, str]) -> str:
        legs = ", ".join(f"{leg!r}: {ref[n.nid]}" for leg, n in self.legs.items())
        return f"js.join_all({{{legs}}}, on={self.on!r})"


def topo(outputs: Mapping[str, Node]) -> list[Node]:
    """Every node reachable from the outputs, inputs before their consumers."""
    seen: dict[int, Node] = {}
    order: list[Node] = []

    def visit(n: Node) -> None:
        if n.nid in seen:
            return
        seen[n.nid] = n
        for i in n.inputs():
            visit(i)
        order.append(n)

    for n in outputs.values():
        visit(n)
    return order


def sources_of(outputs: Mapping[str, Node]) -> dict[str, Source]:
    return {n.name: n for n in topo(outputs) if isinstance(n, Source)}


def describe(outputs: Mapping[str, Node]) -> str:
    """A readable, Python-like listing of the pipeline (for failure messages)."""
    ref: dict[int, str] = {}
    lines = []
    for i, n in enumerate(topo(outputs)):
        ref[n.nid] = f"n{i}"
        lines.append(f"n{i} = {n.describe(ref)}  # {n.schema.names}")  # type: ignore[attr-defined]
    lines += [f"graph = graph.output({name!r}, {ref[n.nid]})" for name, n in outputs.items()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- building


def build_graph(outputs: Mapping[str, Node]) -> joinstate.Graph:
    """The described pipeline's graph, built through the public ``joinstate`` API."""
    streams: dict[int, Any] = {}
    for n in topo(outputs):
        streams[n.nid] = _build_node(n, streams)
    graph = joinstate.Graph()
    for out, n in outputs.items():
        graph = graph.output(out, streams[n.nid])
    return graph


def build_pipeline(store: Any, name: str, outputs: Mapping[str, Node], **kwargs: Any) -> Any:
    """The described pipeline: its graph attached to ``store`` as ``name``."""
    return joinstate.Pipeline(store, name, build_graph(outputs), **kwargs)


def _build_node(n: Node, s: Mapping[int, Any]) -> Any:
    if isinstance(n, Source):
        if n.unique_key:
            return joinstate.source(n.name, schema=n.schema, unique_key=n.unique_key)
        return joinstate.source(n.name, schema=n.schema)
    if isinstance(n, Join):
        kw: dict[str, Any] = {"on": n.on, "how": n.how}
        if n.suffixes != ("", "_right"):
            kw["suffixes"] = n.suffixes
        return s[n.left.nid].join(s[n.right.nid], **kw)
    if isinstance(n, Filter):
        return s[n.input.nid].filter(n.pred.to_pc())
    if isinstance(n, Select):
        return s[n.input.nid].select(n.api_arg())
    if isinstance(n, WithColumns):
        return s[n.input.nid].with_columns({k: e.to_pc() for k, e in n.items.items()})
    if isinstance(n, UnionAll):
        return s[n.parts[0].nid].union_all(*(s[x.nid] for x in n.parts[1:]))
    if isinstance(n, GroupBy):
        aggs = {name: (fn, arg.to_pc() if isinstance(arg, Expr) else arg)
                for name, (fn, arg) in n.aggs.items()}
        return s[n.input.nid].group_by(n.keys).aggregate(**aggs)
    if isinstance(n, JoinAll):
        return joinstate.join_all({leg: s[x.nid] for leg, x in n.legs.items()}, on=n.on)
    msg = f"unknown node {n!r}"
    raise TypeError(msg)


# --------------------------------------------------------------------------- oracle


def _sql(n: Node, v: Mapping[int, str]) -> str:
    if isinstance(n, Join):
        lv, rv = v[n.left.nid], v[n.right.nid]
        cond = " AND ".join(f"l.{q(a)} = r.{q(b)}" for a, b in n.pairs)
        if n.how in ("left_semi", "left_anti"):
            neg = "NOT " if n.how == "left_anti" else ""
            return (f"SELECT l.* FROM {lv} AS l "
                    f"WHERE {neg}EXISTS (SELECT 1 FROM {rv} AS r WHERE {cond})")
        cols = [f"l.{q(c)} AS {q(o)}" for c, o in zip(n.left.schema.names, n.out_left, strict=True)]
        cols += [f"r.{q(c)} AS {q(o)}"
                 for c, o in zip(n.right.schema.names, n.out_right, strict=True)]
        kind = {"inner": "INNER", "left": "LEFT", "right": "RIGHT", "full": "FULL OUTER"}[n.how]
        return f"SELECT {', '.join(cols)} FROM {lv} AS l {kind} JOIN {rv} AS r ON {cond}"
    if isinstance(n, Filter):
        return f"SELECT * FROM {v[n.input.nid]} WHERE {n.pred.to_sql()}"
    if isinstance(n, (Select, WithColumns)):
        cols = ", ".join(f"{e.to_sql()} AS {q(name)}" for name, e in n.exprs.items())
        return f"SELECT {cols} FROM {v[n.input.nid]}"
    if isinstance(n, UnionAll):
        return " UNION ALL ".join(f"SELECT * FROM {v[x.nid]}" for x in n.parts)
    if isinstance(n, GroupBy):
        cols = [q(k) for k in n.keys]
        for name, (fn, e) in n.agg_exprs.items():
            arg = "*" if e is None else e.to_sql()
            cols.append(f"{fn.upper()}({arg}) AS {q(name)}")
        # Without keys SQL gives one row over no input, as the pipeline does.
        group = f" GROUP BY {', '.join(q(k) for k in n.keys)}" if n.keys else ""
        return f"SELECT {', '.join(cols)} FROM {v[n.input.nid]}{group}"
    if isinstance(n, JoinAll):
        legs = list(n.legs.items())
        cols = [f"{q(leg)}.{q(c)} AS {q(leg + '_' + c)}"
                for leg, node in legs for c in node.schema.names]
        first, fnode = legs[0]
        sql = f"SELECT {', '.join(cols)} FROM {v[fnode.nid]} AS {q(first)}"
        for leg, node in legs[1:]:
            sql += (f" INNER JOIN {v[node.nid]} AS {q(leg)} ON "
                    f"{q(first)}.{q(n.on_cols[first])} = {q(leg)}.{q(n.on_cols[leg])}")
        return sql
    msg = f"unknown node {n!r}"
    raise TypeError(msg)


def expand(schema: pa.Schema, zset: Counter[Row]) -> pa.Table:
    """A table holding every row of an integrated Z-set ``weight`` times."""
    rows: list[Row] = []
    for row, w in zset.items():
        assert w > 0, f"integrated input has weight {w} for {row}"
        rows.extend([row] * w)
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.table([pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=True)],
                    schema=schema)


def evaluate(
    outputs: Mapping[str, Node], inputs: Mapping[str, Counter[Row]], *, optimize: bool = False
) -> dict[str, Counter[Row]]:
    """Every output of the described pipeline, computed from scratch by DuckDB.

    Every node is materialized as its own table, and DuckDB's optimizer is off by
    default: DuckDB 1.5.5's common-subplan elimination drops the join from
    ``SELECT l.k FROM g l LEFT JOIN g r ON l.k = r.n`` when ``g`` is a GROUP BY view
    (the duplicates the join creates are lost).  The inputs are tiny; plain plans are
    fast enough and the oracle stays as literal as possible.
    """
    con = duckdb.connect()
    if not optimize:
        con.execute("PRAGMA disable_optimizer")
    try:
        views: dict[int, str] = {}
        for n in topo(outputs):
            view = f"n{n.nid}"
            if isinstance(n, Source):
                # a real table, not a registered Arrow scan: DuckDB cannot push every
                # filter kind (e.g. join bloom filters) into Arrow scans
                con.register("arrow_in", expand(n.schema, inputs.get(n.name, Counter())))
                con.execute(f"CREATE TEMP TABLE {view} AS SELECT * FROM arrow_in")
                con.unregister("arrow_in")
            else:
                con.execute(f"CREATE TEMP TABLE {view} AS {_sql(n, views)}")
            views[n.nid] = view
        result = {}
        for name, n in outputs.items():
            rows = con.execute(f"SELECT * FROM {views[n.nid]}").fetchall()
            result[name] = Counter(tuple(r) for r in rows)
        return result
    finally:
        con.close()


# --------------------------------------------------------------------------- z-sets


def zset_of(table: pa.Table, columns: Sequence[str]) -> Counter[Row]:
    """Consolidate a change set (with ``_weight``) into a Z-set over ``columns``, zeros dropped."""
    values = [table.column(c).to_pylist() for c in columns]
    weights = table.column(WEIGHT).to_pylist() if WEIGHT in table.schema.names else [1] * len(table)
    rows = list(zip(*values, strict=True)) if values else [()] * len(table)
    out: Counter[Row] = Counter()
    for r, w in zip(rows, weights, strict=True):
        out[r] += w
    return Counter({r: w for r, w in out.items() if w != 0})


def zadd(a: Counter[Row], b: Counter[Row]) -> Counter[Row]:
    out = Counter(a)
    for r, w in b.items():
        out[r] += w
    return Counter({r: w for r, w in out.items() if w != 0})


def consolidate(entries: Iterable[Entry]) -> Counter[Row]:
    out: Counter[Row] = Counter()
    for r, w in entries:
        out[r] += w
    return Counter({r: w for r, w in out.items() if w != 0})


def diff_text(got: Counter[Row], want: Counter[Row], limit: int = 15) -> str:
    lines = []
    for r in sorted(set(got) | set(want), key=repr):
        if got.get(r, 0) != want.get(r, 0):
            lines.append(f"  {r}: pipeline {got.get(r, 0)}, oracle {want.get(r, 0)}")
    more = f"\n  ... {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def make_delta(schema: pa.Schema, entries: Sequence[Entry], with_weight: bool = True) -> pa.Table:
    cols = list(zip(*(r for r, _ in entries), strict=True)) if entries else [() for _ in schema]
    arrays = [pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=True)]
    names = list(schema.names)
    if with_weight:
        arrays.append(pa.array([w for _, w in entries], pa.int64()))
        names.append(WEIGHT)
    return pa.table(arrays, names=names)


# --------------------------------------------------------------------------- harness


class PipelineHarness:
    """A pipeline under test plus everything needed to check it after each push."""

    def __init__(self, store: Any, name: str, outputs: Mapping[str, Node], *,
                 check_types: bool = True, context: str = "", **kwargs: Any) -> None:
        self.name = name
        self.outputs = dict(outputs)
        self.kwargs = kwargs
        self.check_types = check_types
        self.context = context
        self.sources = sources_of(outputs)
        self.inputs: dict[str, Counter[Row]] = {s: Counter() for s in self.sources}
        self.integrated: dict[str, Counter[Row]] = {o: Counter() for o in outputs}
        self.changed: Counter[str] = Counter()  # pushes that changed each output
        self.multi: Counter[str] = Counter()  # pushes that changed >1 row of each output
        self.pushes = 0
        self.pipeline = build_pipeline(store, name, outputs, **kwargs)
        assert tuple(self.pipeline.outputs) == tuple(outputs)
        for o, n in outputs.items():
            self._check_schema(f"output_schema({o!r})", self.pipeline.output_schema(o), n)

    def rebuild(self, store: Any) -> None:
        """Re-attach to the same state after a reopen (same definition, same name)."""
        self.pipeline = build_pipeline(store, self.name, self.outputs, **self.kwargs)

    def _where(self) -> str:
        return (f"{self.context}\nafter {self.pushes} pushes; pipeline:\n"
                f"{describe(self.outputs)}")

    def _check_schema(self, what: str, schema: pa.Schema, node: Node) -> None:
        names = [n for n in schema.names if n != WEIGHT]
        assert names == node.schema.names, (
            f"{what}: columns {names}, spec says {node.schema.names}\n{self._where()}")
        if self.check_types:
            got = [schema.field(n).type for n in names]
            want = [f.type for f in node.schema]
            assert got == want, f"{what}: types {got}, spec says {want}\n{self._where()}"

    def push(self, source: str, entries: Sequence[Entry], *, commit_id: str | None = None,
             check: bool = True, with_weight: bool = True) -> dict[str, Counter[Row]]:
        """Push, integrate, and (by default) compare every output with the oracle."""
        delta = make_delta(self.sources[source].schema, entries, with_weight)
        outs = self.pipeline.push(source, delta, commit_id=commit_id)
        self.pushes += 1
        assert set(outs) == set(self.outputs), f"push returned {sorted(outs)}\n{self._where()}"
        deltas = {}
        for o, table in outs.items():
            node = self.outputs[o]
            assert WEIGHT in table.schema.names, f"output {o} has no _weight\n{self._where()}"
            self._check_schema(f"push output {o!r}", table.schema, node)
            deltas[o] = zset_of(table, node.schema.names)
            assert table.schema.field(WEIGHT).type == pa.int64(), f"{o}: _weight type"
            assert len(deltas[o]) == table.num_rows, (
                f"output {o!r} is not consolidated (repeated rows or zero weights):\n"
                f"{table.to_pylist()}\n{self._where()}")
            self.integrated[o] = zadd(self.integrated[o], deltas[o])
            self.changed[o] += bool(deltas[o])
            self.multi[o] += len(deltas[o]) > 1
        self.inputs[source] = zadd(self.inputs[source], consolidate(entries))
        assert all(w > 0 for w in self.inputs[source].values()), "test made an illegal delta"
        if check:
            self.check()
        return deltas

    def push_many(self, changes: Mapping[str, Sequence[Entry]], *, commit_id: str | None = None,
                  check: bool = True, via: Any = None) -> dict[str, Counter[Row]]:
        """Push several sources' changes at once (``via``: a callable taking the pipeline
        and the tables, e.g. ``population.apply_changes``; default ``push_many``)."""
        tables = {s: make_delta(self.sources[s].schema, e) for s, e in changes.items()}
        outs = (self.pipeline.push_many(tables, commit_id=commit_id) if via is None
                else via(self.pipeline, tables))
        self.pushes += 1
        assert set(outs) == set(self.outputs), f"push returned {sorted(outs)}\n{self._where()}"
        deltas = {}
        for o, table in outs.items():
            node = self.outputs[o]
            self._check_schema(f"push_many output {o!r}", table.schema, node)
            deltas[o] = zset_of(table, node.schema.names)
            assert len(deltas[o]) == table.num_rows, (
                f"output {o!r} is not consolidated (repeated rows or zero weights):\n"
                f"{table.to_pylist()}\n{self._where()}")
            self.integrated[o] = zadd(self.integrated[o], deltas[o])
            self.changed[o] += bool(deltas[o])
        for source, entries in changes.items():
            self.inputs[source] = zadd(self.inputs[source], consolidate(entries))
        if check:
            self.check()
        return deltas

    def check(self) -> None:
        want = evaluate(self.outputs, self.inputs)
        for o in self.outputs:
            got = self.integrated[o]
            neg = {r: w for r, w in got.items() if w < 0}
            assert not neg, f"output {o!r} integrates to negative weights {neg}\n{self._where()}"
            assert got == want[o], (
                f"output {o!r} differs from the oracle:\n{diff_text(got, want[o])}\n"
                f"{self._where()}")


# --------------------------------------------------------------------------- change streams


class ChangeGen:
    """Random legal change sets for one source: inserts, duplicates, deletes, updates.

    ``values`` maps each column to a callable ``rng -> value``.  With a unique key, the
    key columns come from ``key_domain`` and stay unique over the integrated input.
    """

    def __init__(self, source: Source, values: Mapping[str, Any],
                 key_domain: Sequence[Any] = ()) -> None:
        self.source = source
        self.values = values
        self.key_domain = list(key_domain)
        uk = source.unique_key or []
        self.uk_idx = [source.schema.get_field_index(c) for c in uk]

    def row(self, rng: Any, key: Any = None) -> Row:
        out = []
        for f in self.source.schema:
            if self.uk_idx and f.name == self.source.unique_key[0]:  # type: ignore[index]
                out.append(key)
            else:
                out.append(self.values[f.name](rng))
        return tuple(out)

    def delta(self, rng: Any, current: Counter[Row], size: int = 6,
              inserts_only: bool = False) -> list[Entry]:
        cur = Counter({r: w for r, w in current.items() if w > 0})
        entries: list[Entry] = []

        def add(row: Row, w: int) -> None:
            entries.append((row, w))
            cur[row] += w
            if cur[row] == 0:
                del cur[row]

        for _ in range(size if inserts_only else rng.randint(1, size)):
            kind = 0.0 if inserts_only else rng.random()
            present = sorted(cur, key=repr)
            if self.uk_idx:
                used = {r[self.uk_idx[0]] for r in cur}
                free = [k for k in self.key_domain if k not in used]
                if kind < 0.45 and free:
                    add(self.row(rng, rng.choice(free)), 1)
                elif kind < 0.75 and present:
                    add(rng.choice(present), -1)
                elif present:  # update: -1 old, +1 new under the same key
                    old = rng.choice(present)
                    new = self.row(rng, old[self.uk_idx[0]])
                    if new != old:
                        add(old, -1)
                        add(new, 1)
                continue
            if kind < 0.4 or not present:
                add(self.row(rng), rng.choice((1, 1, 1, 2)))
            elif kind < 0.5:
                add(rng.choice(present), 1)  # another copy of a present row
            elif kind < 0.8:
                r = rng.choice(present)
                add(r, -rng.randint(1, cur[r]))
            else:
                old = rng.choice(present)
                add(old, -1)
                add(self.row(rng), 1)
        rng.shuffle(entries)
        return entries
