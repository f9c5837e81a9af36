"""Building a pipeline's graph: streams, and the operators their methods create.

A :class:`Stream` is a source (:func:`source`) or the output of an operator; its methods
(``join``, ``filter``, ``select``, ``with_columns``, ``union_all``, ``group_by`` ...
``aggregate``) and :func:`join_all` check their arguments against the input schemas and
return a new stream over a new, unnumbered node (:mod:`joinstate.nodes`).  Nothing here
touches a store: a :class:`~joinstate.graph.Graph` names the outputs, numbers the nodes
and is what a pipeline maintains.  Streams and nodes never change once made.
"""

from __future__ import annotations

from collections import abc
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from joinstate._expr import as_expression, output_types
from joinstate.errors import SchemaMismatchError
from joinstate.keys import key_plan
from joinstate.names import validate_name
from joinstate.nodes import (
    AGG_FUNCTIONS,
    RETRACTIONS,
    WINDOW_FRAMES,
    WINDOW_FUNCTIONS,
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
    WindowNode,
    aggregate_type,
    also_unique_keys,
    join_output_schema,
    normalize_how,
)
from joinstate.ordering import check_order_by, orderable
from joinstate.schema import WEIGHT, check_storable
from joinstate.side import Side

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["GroupedStream", "Stream", "as_stream", "join_all", "source"]



class Stream:
    """A change stream: a source, or the output of an operator.  Immutable.

    Columns are referred to by name; expressions are ``pyarrow.compute`` expressions
    (``pc.field("x") > 3``).  Every method returns a new stream.
    """

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stream, (self.node,))

    @property
    def schema(self) -> pa.Schema:
        """The stream's columns (change sets add ``_weight``)."""
        return self.node.schema

    @property
    def columns(self) -> list[str]:
        """The stream's column names."""
        return list(self.node.schema.names)

    def __repr__(self) -> str:
        return f"Stream({self.node.describe()}: {', '.join(self.columns)})"

    def join(
        self, other: Stream, on: str | tuple[str, str] | Sequence[str | tuple[str, str]], *,
        how: str = "inner", suffixes: tuple[str, str] = ("", "_right"),
    ) -> Stream:
        """Equi-join with ``other`` (SQL semantics: NULL keys never match).

        ``on``: a column name both have, a ``(left, right)`` pair, or a list of those.
        ``how``: ``inner``, ``left``, ``right``, ``full``, ``left_semi``, ``left_anti``
        (or Spark's names for them: ``leftouter``, ``outer``, ``semi`` ...).  Output: this
        stream's columns, then ``other``'s (none for semi/anti joins); an ``other`` column
        whose name is taken gets ``suffixes[1]`` (and the left one ``suffixes[0]``), as
        :meth:`joinstate.StateStore.join` does.
        """
        other = as_stream(other, "join(other=...)")
        how = normalize_how(how)
        pairs = _key_pairs(on)
        lk = tuple(p[0] for p in pairs)
        rk = tuple(p[1] for p in pairs)
        for cols, stream, label in ((lk, self, "left"), (rk, other, "right")):
            for c in cols:
                if c not in stream.schema.names:
                    raise SchemaMismatchError(
                        f"join on={on!r}: the {label} input has no column {c!r} (columns: "
                        f"{stream.columns})")
        key_plan(self.schema, lk, other.schema, rk)  # raises for keys that never compare
        Side(self.schema, list(lk))  # the key columns can be indexed
        Side(other.schema, list(rk))
        if not (isinstance(suffixes, tuple | list) and len(suffixes) == 2
                and all(isinstance(s, str) for s in suffixes)):
            raise SchemaMismatchError(f"suffixes={suffixes!r} must be a pair of strings")
        sfx = (str(suffixes[0]), str(suffixes[1]))
        out = join_output_schema(self.schema, other.schema, how, sfx)
        nl = len(self.schema)
        semi = how in ("left_semi", "left_anti")
        return Stream(JoinNode(
            (self.node, other.node), out, left_key=lk, right_key=rk, how=how, suffixes=sfx,
            out_left=tuple(out.names[:nl]), out_right=() if semi else tuple(out.names[nl:])))

    def filter(self, predicate: pc.Expression) -> Stream:
        """Rows for which ``predicate`` is true (a NULL result drops the row, as in SQL)."""
        expr = as_expression(predicate, "filter(predicate)")
        (t,) = output_types(self.schema, [expr], ["predicate"], "filter")
        if not pa.types.is_boolean(t):
            raise SchemaMismatchError(f"filter predicate {expr} must be boolean, it is {t}")
        return Stream(FilterNode((self.node,), self.schema, expr=expr))

    def check(self, predicate: pc.Expression, message: str) -> Stream:
        """The same rows, refusing any push that would give them one failing ``predicate``.

        Such a push raises :class:`~joinstate.errors.CheckViolationError` (its text:
        ``message``, then the row) and applies nothing; a NULL predicate fails, as a
        row a filter would drop.  For data SQL refuses at query time, e.g. a scalar
        subquery's row count above one.
        """
        expr = as_expression(predicate, "check(predicate)")
        (t,) = output_types(self.schema, [expr], ["predicate"], "check")
        if not pa.types.is_boolean(t):
            raise SchemaMismatchError(f"check predicate {expr} must be boolean, it is {t}")
        if not isinstance(message, str) or not message:
            msg = "check(message=...) must say what the check requires"
            raise SchemaMismatchError(msg)
        return Stream(CheckNode((self.node,), self.schema, expr=expr, message=message))

    def select(self, columns: Sequence[str] | Mapping[str, str | pc.Expression]) -> Stream:
        """A projection: column names, or ``{output name: expression or column name}``."""
        if isinstance(columns, str):
            columns = [columns]
        items: list[tuple[str, pc.Expression]]
        if isinstance(columns, abc.Mapping):
            items = [(n, as_expression(e, f"select[{n!r}]")) for n, e in columns.items()]
        else:
            items = []
            for c in columns:
                if not isinstance(c, str):
                    raise SchemaMismatchError(f"select: column names must be strings, got {c!r}")
                if c not in self.schema.names:
                    raise SchemaMismatchError(f"select: no column {c!r} (columns: {self.columns})")
                items.append((c, pc.field(c)))
        return self._project(items, "select")

    def with_columns(self, columns: Mapping[str, str | pc.Expression]) -> Stream:
        """All columns, with ``columns`` added (or replacing those of the same name)."""
        new = {n: as_expression(e, f"with_columns[{n!r}]") for n, e in columns.items()}
        items = [(n, new.pop(n, pc.field(n))) for n in self.schema.names]
        return self._project(items + list(new.items()), "with_columns")

    def _project(self, items: list[tuple[str, pc.Expression]], what: str) -> Stream:
        if not items:
            raise SchemaMismatchError(f"{what}: a projection needs at least one column")
        names = [n for n, _ in items]
        if len(set(names)) != len(names) or WEIGHT in names:
            raise SchemaMismatchError(f"{what}: output columns {names} repeat a name or use "
                                      f"{WEIGHT!r}")
        exprs = [e for _, e in items]
        types = output_types(self.schema, exprs, names, what)
        fields = []
        for n, e, t in zip(names, exprs, types, strict=True):
            src = next((f for f in self.schema if e.equals(pc.field(f.name))), None)
            fields.append(pa.field(n, t, src.nullable if src is not None else True))
        schema = pa.schema(fields)
        check_storable(schema, what)
        return Stream(ProjectNode((self.node,), schema, exprs=tuple(exprs)))

    def union_all(self, *others: Stream) -> Stream:
        """Bag union (SQL ``UNION ALL``); every input has the same column names and types."""
        streams = [self] + [as_stream(o, "union_all(...)") for o in others]
        first = self.schema
        for s in streams[1:]:
            if s.schema.names != first.names or any(
                    not a.type.equals(b.type) for a, b in zip(first, s.schema, strict=True)):
                raise SchemaMismatchError(
                    "union_all: inputs must have the same column names and types in the same "
                    f"order: {[f'{f.name}: {f.type}' for f in first]} vs "
                    f"{[f'{f.name}: {f.type}' for f in s.schema]}; use select() to align them")
        fields = [pa.field(f.name, f.type, any(s.schema.field(i).nullable for s in streams))
                  for i, f in enumerate(first)]
        return Stream(UnionNode(tuple(s.node for s in streams), pa.schema(fields)))

    def repeat(self, count: str) -> Stream:
        """Each row ``count`` times, without the ``count`` column (an integer column).

        Multiplies every row's weight by its ``count``; a row counted 0 times is gone.
        A change set carrying a NULL or negative count raises
        :class:`~joinstate.errors.ExpressionError` and applies nothing.
        """
        if not isinstance(count, str) or count not in self.schema.names:
            raise SchemaMismatchError(f"repeat: no column {count!r} (columns: {self.columns})")
        if not pa.types.is_integer(self.schema.field(count).type):
            raise SchemaMismatchError(f"repeat: column {count!r} must be an integer, it is "
                                      f"{self.schema.field(count).type}")
        if len(self.schema) < 2:
            raise SchemaMismatchError(f"repeat: {count!r} is the only column; nothing would "
                                      "be left to repeat")
        out = pa.schema([f for f in self.schema if f.name != count])
        return Stream(RepeatNode((self.node,), out, count=count))

    def group_by(self, keys: str | Sequence[str]) -> GroupedStream:
        """Group rows by ``keys`` (NULL is a group of its own, as in SQL); then aggregate."""
        ks = (keys,) if isinstance(keys, str) else tuple(keys)
        for k in ks:
            if k not in self.schema.names:
                raise SchemaMismatchError(f"group_by: no column {k!r} (columns: {self.columns})")
        if len(set(ks)) != len(ks):
            raise SchemaMismatchError(f"group_by: {list(ks)} names a column twice")
        return GroupedStream(self, ks)

    def aggregate(self, **aggs: tuple[str, str | pc.Expression | None]) -> Stream:
        """A global aggregate (no GROUP BY): ``group_by([]).aggregate(...)``."""
        return GroupedStream(self, ()).aggregate(**aggs)

    def window(self, partition_by: str | Sequence[str] = (),
               order_by: Sequence[tuple[str, ...]] = (), *,
               top: Mapping[str, int] | None = None,
               **funcs: tuple[Any, ...]) -> Stream:
        """Window functions: every row, plus one column per function (SQL ``OVER``).

        ``partition_by``: columns (none: one partition of every row; NULL is a value of
        its own).  ``order_by``: ``[(column, "ascending" | "descending"[, "at_start" |
        "at_end"])]``, NULLs last unless said (DuckDB's default, both directions).
        ``funcs``: ``name=(function,)`` for ``row_number``, ``rank``, ``dense_rank``;
        ``name=(function, column[, frame])`` for ``sum``, ``avg``, ``min``, ``max``,
        ``count`` (``count`` with ``None``: rows).  ``frame``: ``"partition"`` (the
        whole partition; the default without ``order_by``), ``"range"`` (RANGE BETWEEN
        UNBOUNDED PRECEDING AND CURRENT ROW, the current row's peers included; the
        default with ``order_by``) or ``"rows"`` (ROWS BETWEEN UNBOUNDED PRECEDING AND
        CURRENT ROW).  Types as DuckDB's: rankings and counts int64; sum of integers
        int64 (overflow raises), of decimal(p, s) decimal(38, s) exactly, of floats
        float64; avg float64; min/max the column's type.  Rows tied on every ORDER BY
        column are numbered (row_number, ROWS frames) in an order fixed by their values.

        ``top``: ``{column: n}`` keeps only rows where one of those integer columns is
        at most ``n``: a maintained top-N (``rank() ... <= n``), whose retractions pull
        rows from beyond ``n`` (every row of a partition is stored).  The state is the
        input's rows by partition; a change recomputes each partition it touches, so its
        cost is the touched partitions' rows.
        """
        src = self.schema
        part = (partition_by,) if isinstance(partition_by, str) else tuple(partition_by)
        for c in part:
            if c not in src.names:
                raise SchemaMismatchError(f"window partition_by: no column {c!r} (columns: "
                                          f"{self.columns})")
        if len(set(part)) != len(part):
            raise SchemaMismatchError(f"window partition_by {list(part)} names a column twice")
        order = check_order_by("window", src, order_by)
        if not funcs:
            msg = "window() needs at least one function, e.g. rk=('rank',)"
            raise SchemaMismatchError(msg)
        specs: list[tuple[str, str, str | None, str]] = []
        fields = list(src)
        for name, spec in funcs.items():
            if name in src.names or name == WEIGHT:
                raise SchemaMismatchError(f"window function {name!r}: the name is an input "
                                          f"column or {WEIGHT!r}")
            specs.append(_window_func(name, spec, src, bool(order)))
            fields.append(pa.field(name, _window_type(specs[-1], src),
                                   nullable=specs[-1][1] in ("sum", "avg", "min", "max")))
        out = pa.schema(fields)
        tops: list[tuple[str, int]] = []
        for col, n in (top or {}).items():
            if col not in out.names or not pa.types.is_integer(out.field(col).type):
                raise SchemaMismatchError(f"window top: {col!r} must be an integer column of "
                                          f"the output (a ranking), columns: {out.names}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise SchemaMismatchError(f"window top[{col!r}]={n!r} must be an int >= 0")
            tops.append((col, n))
        check_storable(src, "window input")
        return Stream(WindowNode((self.node,), out, partition_by=part, order_by=order,
                                 funcs=tuple(specs), top=tuple(tops)))


class GroupedStream:
    """A stream grouped by key columns, waiting for :meth:`aggregate`."""

    __slots__ = ("keys", "stream")

    def __init__(self, stream: Stream, keys: tuple[str, ...]) -> None:
        self.stream = stream
        self.keys = keys

    def aggregate(self, **aggs: tuple[str, str | pc.Expression | None]) -> Stream:
        """Aggregates by output name: ``total=("sum", expr)``, ``n=("count", None)``.

        Functions: ``sum``, ``count`` (``None``: rows; an argument: its non-NULL values),
        ``min``, ``max``.  The output has the group keys, then the aggregates.  SQL
        semantics: NULLs are skipped and an all-NULL group sums to NULL; sum of integers
        is int64 (overflow raises), of decimal128(p, s) decimal128(38, s) exactly, of
        floats float64.  A group is present while it has rows.  Without group keys
        (``group_by([])``, SQL's aggregate without GROUP BY) the one row is always
        there: over no rows, counts are 0 and the other aggregates NULL, from the
        pipeline's creation on (``Pipeline.push`` says when its first change set is
        returned).
        """
        src = self.stream.schema
        out_fields = [src.field(k) for k in self.keys]
        specs: list[tuple[str, str, pc.Expression | None]] = []
        for name, spec in aggs.items():
            if name in self.keys or name == WEIGHT:
                raise SchemaMismatchError(f"aggregate {name!r}: the name is a group key or "
                                          f"{WEIGHT!r}")
            if not isinstance(spec, tuple) or len(spec) != 2:
                raise SchemaMismatchError(
                    f"aggregate {name!r}={spec!r} must be a pair (function, argument)")
            func, arg = spec
            if func not in AGG_FUNCTIONS:
                raise SchemaMismatchError(
                    f"aggregate {name!r}: function {func!r} must be one of {AGG_FUNCTIONS}")
            if arg is None:
                if func != "count":
                    raise SchemaMismatchError(f"aggregate {name!r}: {func} needs an argument")
                specs.append((name, func, None))
                out_fields.append(pa.field(name, pa.int64(), nullable=False))
                continue
            expr = as_expression(arg, f"aggregate {name!r}")
            (t,) = output_types(src, [expr], [name], f"aggregate {name!r}")
            specs.append((name, func, expr))
            out_fields.append(pa.field(name, aggregate_type(name, func, t)))
        if not specs:
            msg = "aggregate() needs at least one aggregate"
            raise SchemaMismatchError(msg)
        return Stream(AggNode((self.stream.node,), pa.schema(out_fields), keys=self.keys,
                              aggs=tuple(specs)))


def source(name: str, schema: pa.Schema, *, unique_key: Sequence[str] | str | None = None,
           retractions: str = "checked",
           also_unique: Sequence[Sequence[str] | str] = ()) -> Stream:
    """A named input: change sets of ``schema``'s columns are pushed to it.

    ``unique_key``: a promise that no two rows share these columns' values; it lets the
    indexes of this source use a keyed layout (see :class:`joinstate.Side`).

    ``retractions``: ``"checked"`` (the default) refuses a push that retracts a row the
    source does not hold (equal in every column), or more copies than it holds, with
    :class:`~joinstate.errors.OverRetractionError` before anything is written.  An index
    of the source holding every column decides it; otherwise the source keeps a row
    record (16 bytes per row; see :mod:`joinstate._source_rows`).  ``"unchecked"`` skips
    the record, for a trusted upstream that never retracts a row it did not insert (a
    CDC log keyed by primary key): a bad retraction is then caught only where an index
    holds the rows, and otherwise gives wrong answers.

    ``also_unique``: further unique keys (each a column or a list of columns), verified:
    the graph checks each with a :class:`~joinstate.nodes.UniqueNode` (a push leaving two
    rows with one value, or a row with a NULL in the key, is refused with
    :class:`~joinstate.errors.UniqueKeyViolationError` and applies nothing: a key as a
    primary key is, ``NOT NULL UNIQUE``).  The planner relies on them (a value locates
    its row's other columns), e.g. to keep groups by such a key on the shard where the
    rows lie.
    """
    validate_name("source", name)
    if not isinstance(schema, pa.Schema):
        raise SchemaMismatchError(f"source {name!r}: schema must be a pyarrow.Schema, got "
                                  f"{type(schema).__name__}")
    if retractions not in RETRACTIONS:
        raise SchemaMismatchError(
            f"source {name!r}: retractions={retractions!r} must be 'checked' (the default) "
            "or 'unchecked' (no check, for trusted upstreams)")
    uk: tuple[str, ...] | None = None
    if unique_key is not None:
        uk = (unique_key,) if isinstance(unique_key, str) else tuple(unique_key)
    Side(schema, [schema.names[0]] if len(schema) else ["?"], uk)  # validates both
    check_storable(schema, f"source {name!r}")
    also = also_unique_keys(f"source {name!r}", schema, uk, also_unique)
    return Stream(SourceNode((), schema, name=name, unique_key=uk, retractions=retractions,
                             also_unique=also))


def join_all(legs: Mapping[str, Stream], on: str | Mapping[str, str]) -> Stream:
    """Inner join of several streams on one common key, as a delta join.

    ``legs``: leg name -> stream; ``on``: the key column (the same name in every leg) or
    leg name -> column.  Output columns are ``<leg>_<column>`` for every column of every
    leg, in leg order.  No state of its own: a change to one leg probes the other legs'
    indexes (legs that are filters of one stream share its index).
    """
    if len(legs) < 2:
        msg = "join_all needs at least two legs"
        raise SchemaMismatchError(msg)
    names = list(legs)
    streams: list[Stream] = []
    keys: list[str] = []
    for leg in names:
        validate_name("join_all leg", leg)
        s = as_stream(legs[leg], f"join_all leg {leg!r}")
        k = on if isinstance(on, str) else on.get(leg) if isinstance(on, abc.Mapping) else None
        if not isinstance(k, str) or k not in s.schema.names:
            raise SchemaMismatchError(
                f"join_all: leg {leg!r} has no key column {k!r} (columns: {s.columns})")
        streams.append(s)
        keys.append(k)
    plan = key_plan(streams[0].schema, [keys[0]], streams[1].schema, [keys[1]])
    for s, k in zip(streams[2:], keys[2:], strict=True):
        if key_plan(streams[0].schema, [keys[0]], s.schema, [k]) != plan:
            raise SchemaMismatchError(
                f"join_all: key {k!r} compares with the first leg's key as another type than "
                "the second leg's does; cast the keys to one type")
    fields = [pa.field(f"{leg}_{f.name}", f.type)
              for leg, s in zip(names, streams, strict=True) for f in s.schema]
    out_names = [f.name for f in fields]
    if len(set(out_names)) != len(out_names):
        raise SchemaMismatchError(f"join_all: output column names collide: {out_names}")
    return Stream(JoinAllNode(tuple(s.node for s in streams), pa.schema(fields),
                              legs=tuple(names), keys=tuple(keys)))


def as_stream(value: object, what: str) -> Stream:
    """``value``, which must be a :class:`Stream` (``what`` names it in the error)."""
    if not isinstance(value, Stream):
        raise SchemaMismatchError(f"{what} must be a joinstate.Stream, got "
                                  f"{type(value).__name__}")
    return value


def _key_pairs(on: object) -> list[tuple[str, str]]:
    if isinstance(on, str):
        return [(on, on)]
    if isinstance(on, tuple) and len(on) == 2 and all(isinstance(x, str) for x in on):
        return [(on[0], on[1])]
    if isinstance(on, list | tuple) and on:
        out = []
        for item in on:
            if isinstance(item, str):
                out.append((item, item))
            elif isinstance(item, tuple | list) and len(item) == 2 and all(
                    isinstance(x, str) for x in item):
                out.append((item[0], item[1]))
            else:
                raise SchemaMismatchError(f"join on={on!r}: {item!r} is not a column name or "
                                          "a (left, right) pair")
        return out
    raise SchemaMismatchError(
        f"join on={on!r} must be a column name, a (left, right) pair, or a list of them")


_RANKING = ("row_number", "rank", "dense_rank")


def _window_func(name: str, spec: object, src: pa.Schema, ordered: bool
                 ) -> tuple[str, str, str | None, str]:
    validate_name("window function", name)
    if not isinstance(spec, tuple) or not 1 <= len(spec) <= 3:
        raise SchemaMismatchError(f"window function {name!r}={spec!r} must be (function,), "
                                  "(function, column) or (function, column, frame)")
    func = spec[0]
    if func not in WINDOW_FUNCTIONS:
        raise SchemaMismatchError(f"window function {name!r}: {func!r} must be one of "
                                  f"{WINDOW_FUNCTIONS}")
    if func in _RANKING:
        if len(spec) != 1:
            raise SchemaMismatchError(f"window function {name!r}: {func} takes no argument "
                                      "and no frame")
        return (name, func, None, "partition")
    arg = spec[1] if len(spec) > 1 else None
    frame = spec[2] if len(spec) > 2 else ("range" if ordered else "partition")
    if frame not in WINDOW_FRAMES:
        raise SchemaMismatchError(f"window function {name!r}: frame {frame!r} must be one of "
                                  f"{WINDOW_FRAMES}")
    if frame == "rows" and not ordered:
        raise SchemaMismatchError(f"window function {name!r}: a ROWS frame needs order_by "
                                  "(without it the rows before the current one are arbitrary)")
    if arg is None:
        if func != "count":
            raise SchemaMismatchError(f"window function {name!r}: {func} needs a column")
        return (name, func, None, frame)
    if not isinstance(arg, str) or arg not in src.names:
        raise SchemaMismatchError(f"window function {name!r}: argument {arg!r} must be a "
                                  f"column name (columns: {src.names})")
    t = src.field(arg).type
    if func in ("sum", "avg") and not (pa.types.is_integer(t) or pa.types.is_floating(t)
                                       or pa.types.is_decimal128(t)):
        raise SchemaMismatchError(f"window function {name!r}: {func} of {t} is not supported "
                                  "(numbers only)")
    if func in ("min", "max") and not orderable(t):
        raise SchemaMismatchError(f"window function {name!r}: {func} of {t} does not order")
    return (name, func, arg, frame)


def _window_type(spec: tuple[str, str, str | None, str], src: pa.Schema) -> pa.DataType:
    name, func, arg, _ = spec
    if func in (*_RANKING, "count"):
        return pa.int64()
    assert arg is not None
    t = src.field(arg).type
    if func == "avg":
        return pa.float64()
    return aggregate_type(name, func, t)
