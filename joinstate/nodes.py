"""The operators a pipeline graph is made of: one frozen node class per operator.

A node knows its inputs, its output schema, the fields that define it (its stored
definition: :meth:`Node.spec`), how it reads in :meth:`Graph.explain
<joinstate.graph.Graph.explain>`, and which input columns it needs to produce a set of
output columns (:meth:`Node.input_needs`, what lets indexes and change sets carry only
the columns something downstream reads).  How an operator is *computed* lives in
:mod:`joinstate.ops`, one module per node class; :mod:`joinstate.graph` builds nodes.

Nodes are compared by identity (``eq=False``): one stream used twice (a self-join)
is one node read twice, which makes the graph a DAG.  ``id`` is -1 until a
:class:`~joinstate.graph.Graph` numbers the nodes its outputs reach; ``seq`` records the
order of creation, which the numbering follows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from joinstate._expr import references
from joinstate.errors import SchemaMismatchError
from joinstate.keys import single_plan
from joinstate.schema import WEIGHT

__all__ = [
    "AGG_FUNCTIONS",
    "JOIN_TYPES",
    "RETRACTIONS",
    "AggNode",
    "CheckNode",
    "FilterNode",
    "JoinAllNode",
    "JoinNode",
    "Node",
    "ProjectNode",
    "RepeatNode",
    "SourceNode",
    "UnionNode",
    "UniqueNode",
    "WINDOW_FRAMES",
    "WINDOW_FUNCTIONS",
    "WindowNode",
    "aggregate_type",
    "also_unique_keys",
    "join_output_schema",
    "normalize_how",
]

AGG_FUNCTIONS = ("sum", "count", "min", "max")
WINDOW_FUNCTIONS = ("row_number", "rank", "dense_rank", "count", "sum", "avg", "min", "max")
"""Window functions :class:`WindowNode` computes (the ranking ones ignore the frame)."""
WINDOW_FRAMES = ("partition", "range", "rows")
"""Window frames: the whole partition; RANGE / ROWS BETWEEN UNBOUNDED PRECEDING AND
CURRENT ROW (the first counts the current row's peers in, the second stops at the row)."""
RETRACTIONS = ("checked", "unchecked")
"""How a source treats a retraction of a row it may not hold (see ``graph.source``)."""

JOIN_TYPES: dict[str, str] = {
    "inner": "inner",
    "left": "left", "leftouter": "left", "left_outer": "left",
    "right": "right", "rightouter": "right", "right_outer": "right",
    "full": "full", "outer": "full", "fullouter": "full", "full_outer": "full",
    "left_semi": "left_semi", "semi": "left_semi", "leftsemi": "left_semi",
    "left_anti": "left_anti", "anti": "left_anti", "leftanti": "left_anti",
}
"""Join types by every name accepted (joinstate's own and Spark DataFrame.join's), any case."""

_SEQ = itertools.count()


def normalize_how(how: object) -> str:
    """The join type ``how`` names, as joinstate spells it (Spark's aliases accepted)."""
    key = how.strip().lower() if isinstance(how, str) else None
    if key is None or key not in JOIN_TYPES:
        raise SchemaMismatchError(
            f"how={how!r} is not a join type; accepted (case-insensitive): "
            f"{', '.join(JOIN_TYPES)}")
    return JOIN_TYPES[key]


@dataclass(frozen=True, eq=False)
class Node:
    """One operator; ``schema`` is its output (without ``_weight``)."""

    inputs: tuple[Node, ...]
    schema: pa.Schema
    id: int = -1
    seq: int = field(default_factory=lambda: next(_SEQ), repr=False)

    kind: ClassVar[str] = "node"
    stateful: ClassVar[bool] = False
    """Whether the operator keeps state of its own or reads indexes of its inputs."""

    @property
    def label(self) -> str:
        """A stable name for state and messages: ``<kind><id>``."""
        return f"{self.kind}{self.id}"

    def spec(self) -> dict[str, Any]:
        """A JSON-able description (stored with a pipeline, compared on re-attach)."""
        return {"kind": self.kind, "inputs": [i.id for i in self.inputs],
                "columns": [f"{f.name}: {f.type}" for f in self.schema], **self.params()}

    def params(self) -> dict[str, Any]:
        """Operator-specific fields of :meth:`spec`."""
        return {}

    def describe(self) -> str:
        """One line for ``Graph.explain``."""
        return self.label

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Columns each input must carry so that this node can produce ``need``."""
        return [set(need) for _ in self.inputs]


@dataclass(frozen=True, eq=False)
class SourceNode(Node):
    """A named input: change sets are pushed to it."""

    name: str = ""
    unique_key: tuple[str, ...] | None = None
    retractions: str = "checked"
    """``checked``: a retraction of a row the source does not hold is refused;
    ``unchecked``: trusted, only the indexes check what they hold."""
    also_unique: tuple[tuple[str, ...], ...] = ()
    """Further unique keys, each verified by a :class:`UniqueNode` the graph adds."""
    kind: ClassVar[str] = "source"

    @property
    def label(self) -> str:
        """Sources are named by the user."""
        return self.name

    def params(self) -> dict[str, Any]:
        """Name, unique key(s) and how retractions are checked.

        ``also_unique`` appears only when declared, so a definition stored before such
        keys existed still equals the one built now.
        """
        out: dict[str, Any] = {
            "name": self.name,
            "unique_key": None if self.unique_key is None else list(self.unique_key),
            "retractions": self.retractions}
        if self.also_unique:
            out["also_unique"] = [list(k) for k in self.also_unique]
        return out

    def describe(self) -> str:
        """``source name (columns; unique key; also unique ...)``."""
        uk = f"; unique {', '.join(self.unique_key)}" if self.unique_key else ""
        also = "".join(f"; also unique {', '.join(k)}" for k in self.also_unique)
        unchecked = "; retractions unchecked" if self.retractions == "unchecked" else ""
        return f"source {self.name} ({', '.join(self.schema.names)}{uk}{also}{unchecked})"


@dataclass(frozen=True, eq=False)
class UniqueNode(Node):
    """The verification of a declared unique key ``key`` of source ``source`` (its input).

    Not a stream anything reads: a root of the graph, added for every key a source
    declares in ``also_unique``.  It keeps, per key value, the identity of the one row
    holding it (a hash of its ``identity`` columns: the source's primary unique key if
    it declares one, else every column), and refuses, with
    :class:`~joinstate.errors.UniqueKeyViolationError` and nothing applied, a push that
    would leave a second row holding a value, or that retracts a holder it does not
    keep.  A NULL in the key is refused too: such a key locates its row (the planner
    relies on that), as a primary key does, unlike SQL's ``UNIQUE`` constraint.
    Partitioning: its input hashed by ``key``, so that equal values meet on one shard.
    """

    key: tuple[str, ...] = ()
    source: str = ""
    identity: tuple[str, ...] = ()
    kind: ClassVar[str] = "unique"
    stateful: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """The key, the source it belongs to and what identifies a row."""
        return {"key": list(self.key), "source": self.source, "identity": list(self.identity)}

    def describe(self) -> str:
        """``uniqueN verifies c_id unique in source s``."""
        return (f"{self.label} verifies that {', '.join(self.key)} is unique in source "
                f"{self.source} (no NULL)")

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """The key and the columns identifying a row."""
        return [set(self.key) | set(self.identity)]


@dataclass(frozen=True, eq=False)
class FilterNode(Node):
    """Rows of the input for which ``expr`` is true (NULL drops the row, as in SQL)."""

    expr: pc.Expression = field(default_factory=lambda: pc.scalar(True))
    kind: ClassVar[str] = "filter"

    def params(self) -> dict[str, Any]:
        """The predicate's text."""
        return {"expr": str(self.expr)}

    def describe(self) -> str:
        """``filterN where <predicate>``."""
        return f"{self.label} where {self.expr}"

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """The output's needs plus what the predicate reads."""
        return [set(need) | references(self.inputs[0].schema, self.expr)]


@dataclass(frozen=True, eq=False)
class CheckNode(Node):
    """Its input unchanged, provided every row the input gains satisfies ``expr``.

    A push that would give the stream a row for which ``expr`` is not true (false or
    NULL) raises :class:`~joinstate.errors.CheckViolationError` quoting ``message`` and
    applies nothing.  Retracted rows are not checked: they leave.  No state; the SQL
    compiler declares one where SQL raises on data (a scalar subquery that returns more
    than one row).  Partitioning: local, as a filter (it passes rows through unmoved).
    """

    expr: pc.Expression = field(default_factory=lambda: pc.scalar(True))
    message: str = ""
    kind: ClassVar[str] = "check"

    def params(self) -> dict[str, Any]:
        """The predicate's text and the message."""
        return {"expr": str(self.expr), "message": self.message}

    def describe(self) -> str:
        """``checkN requires <predicate> (<message>)``."""
        return f"{self.label} requires {self.expr} ({self.message})"

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """The output's needs plus what the predicate reads."""
        return [set(need) | references(self.inputs[0].schema, self.expr)]


@dataclass(frozen=True, eq=False)
class ProjectNode(Node):
    """One expression per output column, over the input's columns."""

    exprs: tuple[pc.Expression, ...] = ()
    kind: ClassVar[str] = "project"

    def params(self) -> dict[str, Any]:
        """Each output column's expression."""
        return {"exprs": [str(e) for e in self.exprs]}

    def describe(self) -> str:
        """``projectN name=expr, ...`` (plain column picks shown by name)."""
        items = [f.name if e.equals(pc.field(f.name)) else f"{f.name}={e}"
                 for f, e in zip(self.schema, self.exprs, strict=True)]
        return f"{self.label} {', '.join(items)}"

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """What the needed output columns' expressions read."""
        src = self.inputs[0].schema
        out: set[str] = set()
        for f, e in zip(self.schema, self.exprs, strict=True):
            if f.name in need:
                out |= references(src, e)
        return [out]

    def column_picks(self) -> list[tuple[str, str]] | None:
        """``[(output, input column)]`` if every output column is a plain input column."""
        src = self.inputs[0].schema.names
        picks = []
        for f, e in zip(self.schema, self.exprs, strict=True):
            ref = next((n for n in src if e.equals(pc.field(n))), None)
            if ref is None:
                return None
            picks.append((f.name, ref))
        return picks


@dataclass(frozen=True, eq=False)
class UnionNode(Node):
    """Bag union (SQL ``UNION ALL``) of inputs with equal column names and types."""

    kind: ClassVar[str] = "union"

    def describe(self) -> str:
        """``unionN all of k inputs``."""
        return f"{self.label} all of {len(self.inputs)} inputs"


@dataclass(frozen=True, eq=False)
class RepeatNode(Node):
    """Each input row ``count`` times (an integer column of the input, dropped).

    A Z-set's weights multiplied by a column: linear, so no state.  What SQL's
    ``INTERSECT ALL`` and ``EXCEPT ALL`` need after counting each row's copies per side
    (``least(left, right)`` copies, ``greatest(left - right, 0)``).  A NULL or negative
    count is refused (:class:`~joinstate.errors.ExpressionError`).  Partitioning: local,
    as a filter (rows stay where they are; the count column is dropped).
    """

    count: str = ""
    kind: ClassVar[str] = "repeat"

    def params(self) -> dict[str, Any]:
        """The count column."""
        return {"count": self.count}

    def describe(self) -> str:
        """``repeatN each row <count> times``."""
        return f"{self.label} each row {self.count} times"

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """The output's needs plus the count."""
        return [set(need) | {self.count}]


@dataclass(frozen=True, eq=False)
class JoinNode(Node):
    """A binary equi-join; ``out_left``/``out_right`` name the inputs' columns in the output."""

    left_key: tuple[str, ...] = ()
    right_key: tuple[str, ...] = ()
    how: str = "inner"
    suffixes: tuple[str, str] = ("", "_right")
    out_left: tuple[str, ...] = ()
    out_right: tuple[str, ...] = ()
    kind: ClassVar[str] = "join"
    stateful: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """Keys, how, suffixes."""
        return {"left_key": list(self.left_key), "right_key": list(self.right_key),
                "how": self.how, "suffixes": list(self.suffixes)}

    def describe(self) -> str:
        """``joinN <how> join on l = r``."""
        on = " and ".join(f"{a} = {b}" for a, b in zip(self.left_key, self.right_key,
                                                       strict=True))
        return f"{self.label} {self.how} join on {on}"

    def key(self, pos: int) -> tuple[str, ...]:
        """The key columns of input ``pos``."""
        return self.left_key if pos == 0 else self.right_key

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Each side's columns that appear in ``need``, plus its key."""
        left, right = self.inputs
        ln = {c for c, o in zip(left.schema.names, self.out_left, strict=True) if o in need}
        rn = ({c for c, o in zip(right.schema.names, self.out_right, strict=True) if o in need}
              if self.out_right else set())  # semi/anti joins output no right column
        return [ln | set(self.left_key), rn | set(self.right_key)]


@dataclass(frozen=True, eq=False)
class AggNode(Node):
    """``group_by(keys).aggregate(...)``: ``aggs`` are (name, function, argument).

    With no ``keys`` it is a global aggregate: exactly one output row, also over an
    empty input (``count`` 0, every other aggregate NULL), as SQL has it.
    """

    keys: tuple[str, ...] = ()
    aggs: tuple[tuple[str, str, pc.Expression | None], ...] = ()
    kind: ClassVar[str] = "agg"
    stateful: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """Group keys and aggregates."""
        return {"keys": list(self.keys),
                "aggs": [[n, f, None if e is None else str(e)] for n, f, e in self.aggs]}

    def describe(self) -> str:
        """``aggN by keys: name=func(arg), ...``."""
        aggs = ", ".join(f"{n}={f}({'*' if e is None else e})" for n, f, e in self.aggs)
        by = f"by {', '.join(self.keys)}" if self.keys else "over all rows"
        return f"{self.label} {by}: {aggs}"

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Group keys and what every aggregate argument reads."""
        src = self.inputs[0].schema
        out = set(self.keys)
        for _, _, e in self.aggs:
            if e is not None:
                out |= references(src, e)
        return [out]


@dataclass(frozen=True, eq=False)
class JoinAllNode(Node):
    """An inner join of several legs on one common key (a delta join: no state of its own)."""

    legs: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    kind: ClassVar[str] = "joinall"
    stateful: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """Leg names and each leg's key column."""
        return {"legs": list(self.legs), "keys": list(self.keys)}

    def describe(self) -> str:
        """``joinallN delta join on leg.key = ...``."""
        return f"{self.label} delta join on " + " = ".join(
            f"{leg}.{k}" for leg, k in zip(self.legs, self.keys, strict=True))

    def key(self, pos: int) -> tuple[str, ...]:
        """The key column of leg ``pos``."""
        return (self.keys[pos],)

    def out_name(self, leg: str, column: str) -> str:
        """The output name of ``column`` of leg ``leg``."""
        return f"{leg}_{column}"

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Each leg's columns that appear in ``need``, plus its key."""
        out = []
        for leg, node, key in zip(self.legs, self.inputs, self.keys, strict=True):
            cols = {c for c in node.schema.names if self.out_name(leg, c) in need}
            out.append(cols | {key})
        return out


@dataclass(frozen=True, eq=False)
class WindowNode(Node):
    """Window functions (SQL ``f(...) OVER (PARTITION BY ... ORDER BY ...)``).

    Every input row, plus one column per function in ``funcs``: ``(output name,
    function, argument column or None, frame)`` (:data:`WINDOW_FUNCTIONS`,
    :data:`WINDOW_FRAMES`).  ``partition_by`` names input columns (none: the whole input
    is one partition; NULL is a partition value of its own); ``order_by`` is ``(column,
    "ascending" | "descending", "at_start" | "at_end")``, NULLs placed as said (DuckDB's
    default is at the end in both directions).  ``top``: ``(column, n)`` pairs; when
    given, only rows where one of those (integer) columns is at most ``n`` are output: a
    maintained top-N (``rank() ... <= n``).  Its state is the input's rows by partition;
    a change recomputes the partitions it touches.
    """

    partition_by: tuple[str, ...] = ()
    order_by: tuple[tuple[str, str, str], ...] = ()
    funcs: tuple[tuple[str, str, str | None, str], ...] = ()
    top: tuple[tuple[str, int], ...] = ()
    kind: ClassVar[str] = "window"
    stateful: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """Partition, order, functions and the top-N bound."""
        return {"partition_by": list(self.partition_by),
                "order_by": [list(o) for o in self.order_by],
                "funcs": [list(f) for f in self.funcs],
                "top": [list(t) for t in self.top]}

    def describe(self) -> str:
        """``windowN partition by [..] order by [..]: name=f(arg) frame, ...; top ...``."""
        ranking = ("row_number", "rank", "dense_rank")
        fns = ", ".join(f"{n}={f}()" if f in ranking else
                        f"{n}={f}({'*' if a is None else a}) {fr}"
                        for n, f, a, fr in self.funcs)
        by = (f"partition by {list(self.partition_by)}" if self.partition_by
              else "one partition (no PARTITION BY)")
        order = (" order by " + ", ".join(
            f"{c} {'desc' if d == 'descending' else 'asc'}"
            f"{' nulls first' if p == 'at_start' else ''}" for c, d, p in self.order_by)
                 if self.order_by else "")
        top = ("; maintained top-N: only rows where "
               + " or ".join(f"{c} <= {n}" for c, n in self.top)) if self.top else ""
        return (f"{self.label} {by}{order}: {fns}{top}; a change recomputes the partitions "
                "it touches from their stored rows")

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Needed input columns, plus what partitions, orders and every function reads."""
        names = set(self.inputs[0].schema.names)
        out = (need & names) | set(self.partition_by) | {c for c, _, _ in self.order_by}
        out |= {a for _, _, a, _ in self.funcs if a is not None}
        out |= {c for c, _ in self.top if c in names}
        return [out]

    def local_under(self, hash_columns: tuple[str, ...] | list[str]) -> bool:
        """Whether input hash-partitioned on ``hash_columns`` can be windowed per shard.

        True when the window has a PARTITION BY and every hash column is one of its
        columns (each window partition then lives on one shard); otherwise its input
        must be exchanged (a window without PARTITION BY runs on one shard).
        """
        return bool(self.partition_by) and bool(hash_columns) and \
            set(hash_columns) <= set(self.partition_by)


def also_unique_keys(what: str, schema: pa.Schema, unique_key: tuple[str, ...] | None,
                     keys: object) -> tuple[tuple[str, ...], ...]:
    """``keys`` (further unique keys of a source) as tuples of column names, checked.

    Each is a column name or a non-empty list of distinct names of ``schema`` whose types
    a key can hold; none may repeat the primary ``unique_key`` or another.  ``what``
    names the source in errors.
    """
    if isinstance(keys, str) or not isinstance(keys, list | tuple):
        raise SchemaMismatchError(
            f"{what}: also_unique={keys!r} must be a list of keys, each a column name or a "
            "list of column names, e.g. also_unique=[('c_customer_id',)]")
    out: list[tuple[str, ...]] = []
    for k in keys:
        key = (k,) if isinstance(k, str) else tuple(k) if isinstance(k, list | tuple) else ()
        if not key or not all(isinstance(c, str) for c in key):
            raise SchemaMismatchError(
                f"{what}: also_unique key {k!r} must be a column name or a non-empty list "
                "of column names")
        for c in key:
            if c not in schema.names:
                raise SchemaMismatchError(
                    f"{what}: also_unique column {c!r} is not in the schema (columns: "
                    f"{schema.names})")
        if len(set(key)) != len(key):
            raise SchemaMismatchError(f"{what}: also_unique key {list(key)} names a column "
                                      "twice")
        if set(key) == set(unique_key or ()) or any(set(key) == set(o) for o in out):
            raise SchemaMismatchError(
                f"{what}: also_unique key {list(key)} is declared twice (the unique_key or "
                "another also_unique key already names these columns)")
        try:
            single_plan(schema, list(key))
        except SchemaMismatchError as exc:
            raise SchemaMismatchError(f"{what}: also_unique key {list(key)}: {exc}") from None
        out.append(key)
    return tuple(out)


def join_output_schema(left: pa.Schema, right: pa.Schema, how: str,
                       suffixes: tuple[str, str]) -> pa.Schema:
    """Left columns, then right ones (colliding names suffixed); left only for semi/anti.

    The same columns as :func:`joinstate.join.output_schema`, without ``_weight``.
    """
    if how in ("left_semi", "left_anti"):
        return pa.schema([pa.field(f.name, f.type) for f in left])
    both = set(left.names) & set(right.names)
    lout = [n + suffixes[0] if n in both else n for n in left.names]
    rout = [n + suffixes[1] if n in both else n for n in right.names]
    names = lout + rout
    if len(set(names)) != len(names) or WEIGHT in names:
        raise SchemaMismatchError(
            f"output column names collide after applying suffixes {suffixes}: {names}; "
            "choose other suffixes")
    return pa.schema([pa.field(n, f.type) for n, f in zip(lout, left, strict=True)]
                     + [pa.field(n, f.type) for n, f in zip(rout, right, strict=True)])


def aggregate_type(name: str, func: str, t: pa.DataType) -> pa.DataType:
    """The output type of aggregate ``func`` over values of type ``t``."""
    if func == "count":
        return pa.int64()
    if func in ("min", "max"):
        return t
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return pa.int64()
    if pa.types.is_decimal(t):
        return pa.decimal128(38, t.scale)
    if pa.types.is_floating(t):
        return pa.float64()
    raise SchemaMismatchError(f"aggregate {name!r}: sum of {t} is not supported (numbers only)")
