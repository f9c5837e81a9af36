"""Pipelines: DAGs of joins, filters, projections, unions and aggregates, kept incrementally.

All of a pipeline's state lives in one state store, with indexes shared between operators.

::

    p = joinstate.Pipeline(store, "q4")
    customer = p.source("customer", schema=..., unique_key=["c_customer_sk"])
    sales = p.source("store_sales", schema=...)
    per_year = (sales.join(customer, on=("ss_customer_sk", "c_customer_sk"))
                     .group_by(["c_customer_id"])
                     .aggregate(total=("sum", "ss_net_paid")))
    p.output("per_year", per_year)
    outs = p.push("store_sales", delta)     # {output name: change set}

How it is maintained:

* **Indexes are named by what they index.**  A join input is stored as an index of a
  stream on a key.  Two operators that read the same stream on the same key read one
  index holding the union of the columns they need.  An inner join's input that is a
  filter of another stream reads that stream's index and applies the filter to what it
  probes, so the six filtered legs of q4's ``year_total`` self-join share one index.
  ``share_indexes=False`` gives every operator input its own index, for measurement.
* **A push is one transaction.**  Every node reachable from the pushed source computes
  its change in topological order; every index whose stream changed, every aggregate and
  the commit record are staged into one :class:`~joinstate.transaction.Transaction` and
  written together, so a failure anywhere (an over-retraction, an overflow, a full disk)
  changes nothing.  Reads see the state before the push, which is what the delta rules
  below assume.
* **Joins.**  An inner join with one changed input uses the classic rule ΔL ⋈ R: probe
  the other input's index with the changed keys.  Other joins, or a push that changes
  both inputs (a self-join, a diamond), recompute the join on the changed keys only:
  read both inputs' stored rows of those keys, and emit J(new) - J(old) for them.
* **N-way joins on one key** (:meth:`Pipeline.join_all`) are delta joins: no state of
  their own, only the legs' indexes; a change probes every leg's index for its keys.
* **Aggregates** keep per-group state in their own column families
  (:mod:`joinstate.aggregate`); a group disappears when its row count reaches zero.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from joinstate._bytes import Bytes
from joinstate._expr import as_expression, evaluate, mask, masks, output_types, references
from joinstate._graph import (
    AggNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    Node,
    ProjectNode,
    SourceNode,
    UnionNode,
    needed_columns,
)
from joinstate._index import Index
from joinstate._probe import Entries
from joinstate._source_rows import SourceRows, check_record
from joinstate.aggregate import AggSpec, GroupState
from joinstate.codec import RowCodec
from joinstate.errors import (
    CommitConflictError,
    ExpressionError,
    JoinSpecMismatchError,
    OverRetractionError,
    SchemaMismatchError,
    StateClosedError,
    StateCorruptedError,
)
from joinstate.join import output_schema
from joinstate.keys import KeyCodec, KeyColumn, hash_prefix, key_plan, row_hash
from joinstate.names import (
    commit_key,
    index_cf,
    initial_outputs_key,
    phase_key,
    pipeline_owner,
    pipeline_spec_key,
    progress_key,
    source_rows_cf,
    source_rows_of,
    validate_name,
)
from joinstate.schema import WEIGHT, check_storable, conform_delta
from joinstate.side import Side
from joinstate.transaction import Transaction
from joinstate.zset import checked_mul, consolidate, expand, group_keys, sum_by

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from joinstate.side import SideName
    from joinstate.store import StateStore
    from joinstate.views import IndexInfo

__all__ = ["GroupedStream", "IndexPlan", "Pipeline", "Stream"]

log = logging.getLogger(__name__)

SPEC_VERSION = 2
"""2: sources keep row records and check retractions (``retractions`` in each source's
spec), and a global aggregate has its row from the start; a version 1 pipeline has
neither, so it is refused rather than taken for one."""
RETRACTIONS = ("checked", "unchecked")
AGG_FUNCTIONS = ("sum", "count", "min", "max")
_COMMIT_FORMAT = b"JSP1"  # pipeline commit record: tag, 16-byte digest, JSON header, IPC


# ---- the user-facing graph builders -------------------------------------------------------


class Stream:
    """A change stream of a pipeline: a source, or the output of an operator.

    Streams are immutable; every method returns a new stream.  Columns are referred to
    by name; expressions are ``pyarrow.compute`` expressions (``pc.field("x") > 3``).
    """

    __slots__ = ("node", "pipeline")

    def __init__(self, pipeline: Pipeline, node: Node) -> None:
        self.pipeline = pipeline
        self.node = node

    @property
    def schema(self) -> pa.Schema:
        """The stream's columns (change sets add ``_weight``)."""
        return self.node.schema

    @property
    def columns(self) -> list[str]:
        """The stream's column names."""
        return list(self.node.schema.names)

    def __repr__(self) -> str:
        return f"Stream({self.node.label}: {', '.join(self.columns)})"

    def _own(self, other: object, what: str) -> Stream:
        if not isinstance(other, Stream):
            raise SchemaMismatchError(f"{what} must be a joinstate.Stream, got "
                                      f"{type(other).__name__}")
        if other.pipeline is not self.pipeline:
            raise SchemaMismatchError(f"{what} belongs to pipeline {other.pipeline.name!r}, "
                                      f"not {self.pipeline.name!r}")
        return other

    def join(
        self, other: Stream, on: str | tuple[str, str] | Sequence[str | tuple[str, str]], *,
        how: str = "inner", suffixes: tuple[str, str] = ("", "_right"),
    ) -> Stream:
        """Equi-join with ``other`` (SQL semantics: NULL keys never match).

        ``on``: a column name both have, a ``(left, right)`` pair, or a list of those.
        ``how``: ``inner``, ``left``, ``right``, ``full``, ``left_semi``, ``left_anti``.
        Output: this stream's columns, then ``other``'s (none for semi/anti joins); an
        ``other`` column whose name is taken gets ``suffixes[1]`` (and the left one
        ``suffixes[0]``), as :meth:`joinstate.StateStore.join` does.
        """
        other = self._own(other, "join(other=...)")
        pairs = _key_pairs(on)
        lk = tuple(p[0] for p in pairs)
        rk = tuple(p[1] for p in pairs)
        for cols, stream, label in ((lk, self, "left"), (rk, other, "right")):
            for c in cols:
                if c not in stream.node.schema.names:
                    raise SchemaMismatchError(
                        f"join on={on!r}: the {label} input has no column {c!r} (columns: "
                        f"{stream.columns})"
                    )
        if how not in ("inner", "left", "right", "full", "left_semi", "left_anti"):
            raise SchemaMismatchError(
                f"how={how!r} must be one of inner, left, right, full, left_semi, left_anti"
            )
        key_plan(self.schema, lk, other.schema, rk)  # raises for keys that never compare
        lside, rside = Side(self.schema, list(lk)), Side(other.schema, list(rk))
        out = output_schema(lside, rside, how, suffixes)
        out = out.remove(out.get_field_index(WEIGHT))
        nl = len(self.schema)
        semi = how in ("left_semi", "left_anti")
        return self.pipeline.add(JoinNode(
            0, (self.node, other.node), out, left_key=lk, right_key=rk, how=how,
            suffixes=(suffixes[0], suffixes[1]),
            out_left=tuple(out.names[:nl]),
            out_right=() if semi else tuple(out.names[nl:]),
        ))

    def filter(self, predicate: pc.Expression) -> Stream:
        """Rows for which ``predicate`` is true (a NULL result drops the row, as in SQL)."""
        expr = as_expression(predicate, "filter(predicate)")
        (t,) = output_types(self.schema, [expr], ["predicate"], "filter")
        if not pa.types.is_boolean(t):
            raise SchemaMismatchError(f"filter predicate {expr} must be boolean, it is {t}")
        return self.pipeline.add(FilterNode(0, (self.node,), self.schema, expr=expr))

    def select(self, columns: Sequence[str] | Mapping[str, str | pc.Expression]) -> Stream:
        """A projection: column names, or ``{output name: expression or column name}``."""
        if isinstance(columns, str):
            columns = [columns]
        items: list[tuple[str, pc.Expression]]
        if hasattr(columns, "items"):
            mapping = cast("Mapping[str, str | pc.Expression]", columns)
            items = [(n, as_expression(e, f"select[{n!r}]")) for n, e in mapping.items()]
        else:
            items = []
            for c in columns:
                if not isinstance(c, str):
                    raise SchemaMismatchError(f"select: column names must be strings, got {c!r}")
                if c not in self.schema.names:
                    raise SchemaMismatchError(
                        f"select: no column {c!r} (columns: {self.columns})"
                    )
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
        return self.pipeline.add(ProjectNode(0, (self.node,), schema, exprs=tuple(exprs)))

    def union_all(self, *others: Stream) -> Stream:
        """Bag union (SQL ``UNION ALL``); every input has the same column names and types."""
        streams = [self] + [self._own(o, "union_all(...)") for o in others]
        first = self.schema
        for s in streams[1:]:
            if s.schema.names != first.names or any(
                not a.type.equals(b.type) for a, b in zip(first, s.schema, strict=True)
            ):
                raise SchemaMismatchError(
                    "union_all: inputs must have the same column names and types in the same "
                    f"order: {[f'{f.name}: {f.type}' for f in first]} vs "
                    f"{[f'{f.name}: {f.type}' for f in s.schema]}; use select() to align them"
                )
        fields = [pa.field(f.name, f.type, any(s.schema.field(i).nullable for s in streams))
                  for i, f in enumerate(first)]
        return self.pipeline.add(UnionNode(0, tuple(s.node for s in streams), pa.schema(fields)))

    def group_by(self, keys: str | Sequence[str]) -> GroupedStream:
        """Group rows by ``keys`` (NULL is a group of its own, as in SQL).

        Then call :meth:`GroupedStream.aggregate`.
        """
        ks = (keys,) if isinstance(keys, str) else tuple(keys)
        for k in ks:
            if k not in self.schema.names:
                raise SchemaMismatchError(f"group_by: no column {k!r} (columns: {self.columns})")
        if len(set(ks)) != len(ks):
            raise SchemaMismatchError(f"group_by: {list(ks)} names a column twice")
        return GroupedStream(self, ks)


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
        pipeline's creation on (see :meth:`Pipeline.push` for when its first change
        set is returned).
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
                    f"aggregate {name!r}={spec!r} must be a pair (function, argument)"
                )
            func, arg = spec
            if func not in AGG_FUNCTIONS:
                raise SchemaMismatchError(
                    f"aggregate {name!r}: function {func!r} must be one of {AGG_FUNCTIONS}"
                )
            if arg is None:
                if func != "count":
                    raise SchemaMismatchError(f"aggregate {name!r}: {func} needs an argument")
                specs.append((name, func, None))
                out_fields.append(pa.field(name, pa.int64(), nullable=False))
                continue
            expr = as_expression(arg, f"aggregate {name!r}")
            (t,) = output_types(src, [expr], [name], f"aggregate {name!r}")
            specs.append((name, func, expr))
            out_fields.append(pa.field(name, _agg_type(name, func, t)))
        if not specs:
            msg = "aggregate() needs at least one aggregate"
            raise SchemaMismatchError(msg)
        schema = pa.schema(out_fields)
        return self.stream.pipeline.add(
            AggNode(0, (self.stream.node,), schema, keys=self.keys, aggs=tuple(specs))
        )


def _agg_type(name: str, func: str, t: pa.DataType) -> pa.DataType:
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
                isinstance(x, str) for x in item
            ):
                out.append((item[0], item[1]))
            else:
                raise SchemaMismatchError(f"join on={on!r}: {item!r} is not a column name or a "
                                          "(left, right) pair")
        return out
    raise SchemaMismatchError(
        f"join on={on!r} must be a column name, a (left, right) pair, or a list of them"
    )


# ---- compiled plan -----------------------------------------------------------------------


@dataclass(eq=False)
class IndexPlan:
    """One index of a pipeline: a stream's rows by key, shared by its readers."""

    base: Node
    key: tuple[str, ...]
    columns: set[str] = field(default_factory=set)
    readers: list[str] = field(default_factory=list)
    plan: list[KeyColumn] | None = None
    owner: str = ""  # set when sharing is off: the reader that owns it
    index: Index | None = None
    predicate: pc.Expression | None = None
    """Rows the index keeps: the OR of its readers' filters (None: every row)."""
    reader_filters: list[pc.Expression | None] = field(default_factory=list)
    """Per reader, the AND of the filters it applies before any renaming (None: none)."""
    reader_needs: list[set[str]] = field(default_factory=list)
    """Per reader, the columns of the index's stream it reads (filters included)."""
    guards: list[tuple[pc.Expression, list[str]]] = field(default_factory=list)
    """Columns kept only on rows some reader of theirs passes: (that OR, columns)."""

    @property
    def index_name(self) -> str:
        """The index's column family (or its stream and key before it is opened)."""
        return self.index.cf if self.index is not None else f"{self.base.label}{list(self.key)}"

    def settle_predicate(self) -> None:
        """Keep only rows some reader can pass: when every reader filters, OR them.

        A shared index otherwise holds the whole stream, while each per-reader index
        holds its filtered rows only; with this, sharing never stores a row no reader
        needs (q4's six year_total legs read two of the years).
        """
        if not self.reader_filters or any(f is None for f in self.reader_filters):
            self.predicate = None
            return
        seen: dict[str, pc.Expression] = {}
        for f in self.reader_filters:
            assert f is not None
            seen.setdefault(str(f), f)
        self.predicate = _any_of(list(seen.values()))

    def settle_guards(self, schema: pa.Schema, keep: set[str]) -> None:
        """Store a column as NULL on rows that no reader needing it can pass.

        In a shared index a column read by one filtered reader (q4: the names, read by
        one of six legs) would otherwise be stored on every row.  The stored row is a
        function of the row, so inserts and retractions still meet; readers that do not
        read the column never see it, and readers that do only see rows they pass, on
        which it is kept.  ``keep``: columns never nulled (keys, filter inputs, unique
        keys); a column declared not-nullable is kept too.
        """
        self.guards = []
        if self.predicate is None:
            return
        by_guard: dict[str, tuple[pc.Expression, list[str]]] = {}
        for c in sorted(self.columns - keep):
            if not schema.field(c).nullable:
                continue
            users = [f for f, need in zip(self.reader_filters, self.reader_needs,
                                          strict=True) if c in need]
            if len(users) == len(self.reader_needs) or any(f is None for f in users):
                continue
            seen: dict[str, pc.Expression] = {}
            for f in users:
                assert f is not None
                seen.setdefault(str(f), f)
            guard = _any_of(list(seen.values()))
            by_guard.setdefault(str(guard), (guard, []))[1].append(c)
        self.guards = list(by_guard.values())

    def rows_to_store(self, table: pa.Table, w: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The rows (and columns) this index stores of a change to its stream.

        The predicate and the guards are evaluated in one Arrow plan (a plan costs ~70 µs
        whatever the row count).
        """
        if self.predicate is None or not table.num_rows:
            return table, w
        found = masks(table, [self.predicate, *(g for g, _ in self.guards)])
        sel = np.flatnonzero(found[0])
        if not len(sel):
            return table.slice(0, 0), w[:0]
        if len(sel) != table.num_rows:
            table, w = table.take(pa.array(sel)), w[sel]
            found = [m[sel] for m in found]
        for (_, cols_), keep in zip(self.guards, found[1:], strict=True):
            if keep.all():
                continue
            cond = pa.array(keep)
            for c in cols_:
                i = table.schema.get_field_index(c)
                col = table.column(i)
                table = table.set_column(i, table.schema.field(i), pc.if_else(
                    cond, col, pa.scalar(None, col.type)))
        return table, w


def _any_of(exprs: list[pc.Expression]) -> pc.Expression:
    out = exprs[0]
    for e in exprs[1:]:
        out = out | e
    return out


Step = tuple[str, Any]
"""One stateless step between an index's stream and a reader: ``("filter", expr)`` or
``("rename", [(output name, input name), ...])`` (a projection that only picks columns)."""


@dataclass(eq=False)
class _Reader:
    """How one operator input reads an index.

    ``chain``: the filters and column-picking projections between the index's stream
    and the input, bottom-up, applied to every probed row; with them, operators that
    read differently filtered or projected versions of one stream share its index.
    """

    plan: IndexPlan
    chain: tuple[Step, ...]
    columns: list[str]  # the input's runtime columns

    def probe(self, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        idx = self.plan.index
        assert idx is not None
        found = idx.probe(qcanon, qhash) if len(qhash) else None
        return self.select(found, idx.schema)

    def first_filter(self) -> pc.Expression | None:
        """The filter the chain starts with (evaluated on the index's rows), if any."""
        if self.chain and self.chain[0][0] == "filter":
            return cast("pc.Expression", self.chain[0][1])
        return None

    def select(self, found: Entries | None, schema: pa.Schema,
               first_mask: np.ndarray | None = None) -> Entries:
        """Apply the chain to probed rows and keep the input's columns.

        ``first_mask``: the chain's first filter already evaluated on ``found`` (readers
        of one index probed together evaluate their filters in one pass).
        """
        if found is None or not len(found.w):
            return Entries(self.empty(schema), np.zeros(0, np.int64), np.zeros(0, np.int64))
        rows, w, q = found.rows, found.w, found.q
        for i, (kind, arg) in enumerate(self.chain):
            if kind == "filter":
                keep = first_mask if i == 0 and first_mask is not None else mask(rows, arg)
                if not keep.all():
                    sel = np.flatnonzero(keep)
                    rows, w, q = rows.take(pa.array(sel)), w[sel], q[sel]
            else:
                have = set(rows.column_names)
                pairs = [(out, src) for out, src in arg if src in have]
                rows = pa.Table.from_arrays([rows.column(src) for _, src in pairs],
                                            names=[out for out, _ in pairs])
        return Entries(rows.select(self.columns), w, q)

    def empty(self, schema: pa.Schema) -> pa.Table:
        """An empty table of the input's columns (types from the index's schema)."""
        names = {n: n for n in schema.names}
        for kind, arg in self.chain:
            if kind == "rename":
                names = {out: names[src] for out, src in arg if src in names}
        return pa.schema([schema.field(names[c]).with_name(c) for c in self.columns]
                         ).empty_table()


def _first_masks(found: Entries | None, readers: list[_Reader]) -> dict[int, np.ndarray]:
    """Per reader (by id), its first filter on ``found``: one evaluation for all of them.

    The legs of a self-join read one index through different filters (q4: six legs of
    ``year_total``); evaluating each filter apart costs one Arrow plan (~70 µs) per leg
    and push, whatever the row count.
    """
    filtered = [(r, f) for r in readers if (f := r.first_filter()) is not None]
    if found is None or not len(found.w) or len(filtered) < 2:
        return {}
    try:
        got = masks(found.rows, [f for _, f in filtered])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return {}  # each reader on its own, so an error names its filter
    return {id(r): m for (r, _), m in zip(filtered, got, strict=True)}


def _column_picks(node: ProjectNode) -> list[tuple[str, str]] | None:
    """``[(output, input column)]`` if every output column is a plain input column."""
    src = node.inputs[0].schema.names
    picks = []
    for f, e in zip(node.schema, node.exprs, strict=True):
        ref = next((n for n in src if e.equals(pc.field(n))), None)
        if ref is None:
            return None
        picks.append((f.name, ref))
    return picks


Delta = tuple[pa.Table, np.ndarray]
Keyed = tuple[pa.Table, np.ndarray, Bytes, np.ndarray, np.ndarray]
"""A changed input: rows, weights, canonical keys and hashes (non-NULL rows), their rows."""


@dataclass(frozen=True)
class _Materialized:
    """A materialized output: the hidden count-per-row group-by keeping its contents."""

    node: Node
    count: str
    order_by: tuple[tuple[str, str, str], ...]
    limit: int | None

    def spec(self) -> dict[str, Any]:
        return {"node": self.node.id, "order_by": [list(o) for o in self.order_by],
                "limit": self.limit}


def _check_order(name: str, schema: pa.Schema, order_by: object
                 ) -> tuple[tuple[str, str, str], ...]:
    if order_by is None:
        return ()
    if isinstance(order_by, str | bytes) or not isinstance(order_by, abc.Sequence):
        raise SchemaMismatchError(
            f"output {name!r}: order_by={order_by!r} must be a list of (column, "
            "'ascending' | 'descending') pairs"
        )
    out = []
    for item in order_by:
        if (not isinstance(item, tuple | list) or len(item) not in (2, 3)
                or item[1] not in ("ascending", "descending")
                or (len(item) == 3 and item[2] not in ("at_start", "at_end"))):
            raise SchemaMismatchError(
                f"output {name!r}: order_by item {item!r} must be (column, 'ascending' | "
                "'descending'[, 'at_start' | 'at_end' for where NULLs go])"
            )
        if item[0] not in schema.names:
            raise SchemaMismatchError(f"output {name!r}: order_by column {item[0]!r} is not "
                                      f"a column of the output ({schema.names})")
        out.append((str(item[0]), str(item[1]), str(item[2]) if len(item) == 3 else "at_end"))
    return tuple(out)


def _sort_indices(rows: pa.Table, order_by: tuple[tuple[str, str, str], ...]) -> pa.Array:
    """Sort order with each key's NULL placement (pyarrow >= 25 places NULLs per key)."""
    try:
        return pc.sort_indices(rows, sort_keys=list(order_by))
    except (TypeError, ValueError):  # older pyarrow: one placement for all keys
        places = {p for _, _, p in order_by}
        if len(places) > 1:
            msg = ("order_by mixes NULLS FIRST and NULLS LAST keys, which needs pyarrow >= 25 "
                   f"(this is {pa.__version__}); upgrade pyarrow")
            raise SchemaMismatchError(msg) from None
        return pc.sort_indices(rows, sort_keys=[(c, o) for c, o, _ in order_by],
                               null_placement=places.pop())


class Pipeline:
    """A named DAG of operators over named sources, maintained in a :class:`StateStore`.

    Build it with :meth:`source` and the :class:`Stream` methods, name its results with
    :meth:`output`, then :meth:`push` change sets into sources.  The definition is fixed
    by the first push (or :meth:`compile`); re-creating the pipeline on a store that has
    it must give the same definition, else
    :class:`~joinstate.errors.JoinSpecMismatchError` names what differs.
    """

    def __init__(self, store: StateStore, name: str, *,
                 share_indexes: bool | Mapping[str, bool] = True) -> None:
        validate_name("pipeline", name)
        self.store: StateStore | None = store
        self.name = name
        self.share_indexes: bool | dict[str, bool]
        if isinstance(share_indexes, bool):
            self.share_indexes = share_indexes
        elif isinstance(share_indexes, abc.Mapping) and all(
                isinstance(k, str) and isinstance(v, bool) for k, v in share_indexes.items()):
            self.share_indexes = dict(sorted(share_indexes.items()))
        else:
            raise SchemaMismatchError(
                f"share_indexes={share_indexes!r} must be a bool, or a mapping from a source "
                "name or operator label (as explain() shows it) to a bool"
            )
        self._nodes: list[Node] = []
        self._sources: dict[str, SourceNode] = {}
        self._outputs: dict[str, Node] = {}
        self._compiled = False
        self._cols: dict[int, list[str]] = {}
        # Per push: filter masks computed ahead for sibling filters (_filter_mask).
        self._push_masks: dict[int, tuple[pa.Table, np.ndarray]] = {}
        self._rt: dict[int, pa.Schema] = {}
        self._indexes: list[IndexPlan] = []
        self._readers: dict[tuple[int, int], _Reader] = {}
        self._codecs: dict[tuple[int, int], KeyCodec] = {}
        self._groups: dict[int, GroupState] = {}
        self._row_codecs: dict[int, RowCodec] = {}
        self._consumers: dict[int, list[Node]] = {}
        self._produced: dict[int, int] = {}
        self._materialized: dict[str, _Materialized] = {}
        # Per checked source: its row record, or None where an index holding every
        # column decides (self._covering names that index).
        self._records: dict[int, SourceRows | None] = {}
        self._covering: dict[int, IndexPlan] = {}
        # Change sets the pipeline owes its outputs since it was created (a global
        # aggregate's first row), returned with the first push that carries rows.
        self._initial: dict[str, pa.Table] | None = None

    # ---- building ---------------------------------------------------------------------

    def add(self, node: Node) -> Stream:
        """Add an operator node (called by :class:`Stream`'s methods)."""
        if self._compiled:
            raise SchemaMismatchError(
                f"pipeline {self.name!r} is compiled (it has been pushed to); build the whole "
                "graph before the first push"
            )
        node.id = len(self._nodes)
        self._nodes.append(node)
        return Stream(self, node)

    def source(
        self, name: str, schema: pa.Schema, *, unique_key: Sequence[str] | str | None = None,
        retractions: str = "checked",
    ) -> Stream:
        """A named input: change sets of ``schema``'s columns are pushed to it.

        ``unique_key``: a promise that no two rows share these columns' values; it lets
        the indexes of this source use a keyed layout (see :class:`joinstate.Side`).

        ``retractions``: ``"checked"`` (the default) refuses a push that retracts a row
        the source does not hold (equal in every column), or more copies than it holds,
        with :class:`~joinstate.errors.OverRetractionError` before anything is written.
        An index of the source holding every column decides it; otherwise the source
        keeps a row record (16 bytes per row; see :mod:`joinstate._source_rows`).
        ``"unchecked"`` skips the record, for a trusted upstream that never retracts a
        row it did not insert (a CDC log keyed by primary key): a bad retraction is then
        caught only where an index holds the rows, and otherwise gives wrong answers.
        """
        validate_name("source", name)
        if retractions not in RETRACTIONS:
            raise SchemaMismatchError(
                f"source {name!r}: retractions={retractions!r} must be 'checked' (the "
                "default) or 'unchecked' (no check, for trusted upstreams)")
        if name in self._sources:
            raise SchemaMismatchError(f"pipeline {self.name!r} already has a source {name!r}")
        uk: tuple[str, ...] | None = None
        if unique_key is not None:
            uk = (unique_key,) if isinstance(unique_key, str) else tuple(unique_key)
        Side(schema, [schema.names[0]] if len(schema) else ["?"], uk)  # validates both
        check_storable(schema, f"source {name!r}")
        stream = self.add(SourceNode(0, (), schema, name=name, unique_key=uk,
                                     retractions=retractions))
        self._sources[name] = cast("SourceNode", stream.node)
        return stream

    def join_all(self, legs: Mapping[str, Stream], on: str | Mapping[str, str]) -> Stream:
        """Inner join of several streams on one common key, as a delta join.

        ``legs``: leg name -> stream; ``on``: the key column (the same name in every leg)
        or leg name -> column.  Output columns are ``<leg>_<column>`` for every column of
        every leg, in leg order.  No state of its own: a change to one leg probes the
        other legs' indexes (legs that are filters of one stream share its index).
        """
        if len(legs) < 2:
            msg = "join_all needs at least two legs"
            raise SchemaMismatchError(msg)
        names = list(legs)
        streams = []
        keys = []
        for leg in names:
            validate_name("join_all leg", leg)
            s = legs[leg]
            if not isinstance(s, Stream) or s.pipeline is not self:
                raise SchemaMismatchError(f"join_all leg {leg!r} must be a Stream of this "
                                          "pipeline")
            k = on if isinstance(on, str) else on.get(leg) if hasattr(on, "get") else None
            if not isinstance(k, str) or k not in s.schema.names:
                raise SchemaMismatchError(
                    f"join_all: leg {leg!r} has no key column {k!r} (columns: {s.columns})"
                )
            streams.append(s)
            keys.append(k)
        for s, k in zip(streams[1:], keys[1:], strict=True):
            key_plan(streams[0].schema, [keys[0]], s.schema, [k])
        fields = [pa.field(f"{leg}_{f.name}", f.type) for leg, s in zip(names, streams,
                                                                         strict=True)
                  for f in s.schema]
        out_names = [f.name for f in fields]
        if len(set(out_names)) != len(out_names):
            raise SchemaMismatchError(f"join_all: output column names collide: {out_names}")
        return self.add(JoinAllNode(0, tuple(s.node for s in streams), pa.schema(fields),
                                    legs=tuple(names), keys=tuple(keys)))

    def output(self, name: str, stream: Stream, *, materialize: bool = False,
               order_by: Sequence[tuple[str, str]] | None = None,
               limit: int | None = None) -> None:
        """Name a stream as an output: :meth:`push` returns its change set.

        ``materialize=True`` also keeps the output's current contents in the store (a
        count per distinct row, in a group-by state), so that :meth:`read` can return
        them; ``order_by`` (``[(column, "ascending" | "descending"[, "at_start" |
        "at_end"])]``, NULLs last unless said) and ``limit`` are applied when it is read
        (a top-N is evaluated over the maintained result, not maintained itself: a
        retraction could otherwise need rows beyond the N).
        """
        validate_name("output", name)
        if not isinstance(stream, Stream) or stream.pipeline is not self:
            raise SchemaMismatchError(f"output {name!r} must be a Stream of this pipeline")
        if name in self._outputs:
            raise SchemaMismatchError(f"pipeline {self.name!r} already has an output {name!r}")
        if self._compiled:
            raise SchemaMismatchError(f"pipeline {self.name!r} is compiled; add outputs first")
        if not isinstance(materialize, bool):
            raise SchemaMismatchError(f"output {name!r}: materialize={materialize!r} must be "
                                      "a bool")
        if (order_by is not None or limit is not None) and not materialize:
            raise SchemaMismatchError(
                f"output {name!r}: order_by and limit apply when a materialized output is "
                "read; pass materialize=True"
            )
        order = _check_order(name, stream.schema, order_by)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0):
            raise SchemaMismatchError(f"output {name!r}: limit={limit!r} must be an int >= 0")
        self._outputs[name] = stream.node
        if materialize:
            count = "__rows"
            while count in stream.schema.names:
                count = "_" + count
            kept = stream.group_by(stream.columns).aggregate(**{count: ("count", None)})
            self._materialized[name] = _Materialized(kept.node, count, order, limit)

    def read(self, name: str) -> pa.Table:
        """The current contents of materialized output ``name`` (no ``_weight``).

        A row held k times appears k times; ``order_by`` sorts (NULLs last, as DuckDB
        and Spark do for ascending keys) and ``limit`` keeps the first rows.
        """
        m = self._materialized.get(name)
        if m is None:
            known = sorted(self._materialized)
            raise SchemaMismatchError(
                f"pipeline {self.name!r} has no materialized output {name!r} (materialized: "
                f"{known}); declare it with p.output({name!r}, stream, materialize=True)"
            )
        store = self._require_store()
        self.compile()
        with store.lock:
            state = self._groups[m.node.id].state()
        counts = state.column(m.count).to_numpy()
        rows = state.drop_columns([m.count])
        if len(counts) and not (counts == 1).all():
            rows = rows.take(pa.array(np.repeat(np.arange(len(counts)), counts)))
        if m.order_by:
            rows = rows.take(_sort_indices(rows, m.order_by))
        if m.limit is not None:
            rows = rows.slice(0, m.limit)
        return rows.cast(self.output_schema(name).remove(
            self.output_schema(name).get_field_index(WEIGHT)))

    # ---- read-only facts ----------------------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...]:
        """Source names, in definition order."""
        return tuple(self._sources)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Output names, in definition order."""
        return tuple(self._outputs)

    def source_schema(self, name: str) -> pa.Schema:
        """The declared schema of source ``name``."""
        return self._source(name).schema

    def source_unique_key(self, name: str) -> tuple[str, ...] | None:
        """The declared unique key of source ``name``."""
        return self._source(name).unique_key

    def output_schema(self, name: str) -> pa.Schema:
        """The schema of output ``name``'s change sets (its columns and ``_weight``)."""
        if name not in self._outputs:
            raise SchemaMismatchError(f"pipeline {self.name!r} has no output {name!r} "
                                      f"(outputs: {list(self._outputs)})")
        return self._outputs[name].schema.append(pa.field(WEIGHT, pa.int64(), nullable=False))

    def _source(self, name: str) -> SourceNode:
        if name not in self._sources:
            raise SchemaMismatchError(f"pipeline {self.name!r} has no source {name!r} "
                                      f"(sources: {list(self._sources)})")
        return self._sources[name]

    def indexes(self) -> list[IndexInfo]:
        """Read-only views of the pipeline's indexes (compiles the pipeline)."""
        self.compile()
        return [ip.index.info() for ip in self._indexes if ip.index is not None]

    def column_families(self) -> tuple[str, ...]:
        """Every column family the pipeline's state uses."""
        self.compile()
        out: list[str] = []
        for ip in self._indexes:
            if ip.index is not None:
                out += ip.index.column_families()
        for g in self._groups.values():
            out += g.column_families()
        out += [r.cf for r in self._records.values() if r is not None]
        return tuple(out)

    def explain(self) -> str:
        """The compiled plan in words: each index, who reads it, and the aggregates."""
        self.compile()
        sharing = ("shared" if self.share_indexes is True else "per operator"
                   if self.share_indexes is False else
                   f"shared except {[k for k, v in self.share_indexes.items() if not v]}")
        lines = [f"pipeline {self.name!r} (indexes {sharing})"]
        for ip in self._indexes:
            assert ip.index is not None
            cols = [c for c in ip.base.schema.names if c in ip.columns]
            lines.append(
                f"  index {ip.index.cf}: {ip.base.label} by {list(ip.key)}, layout "
                f"{ip.index.side.layout}, columns {cols}; read by {', '.join(ip.readers)}"
                + (f"; keeps rows where {ip.predicate}" if ip.predicate is not None else "")
                + "".join(f"; {cols} only where {g}" for g, cols in ip.guards)
            )
        for nid, g in self._groups.items():
            lines.append(f"  aggregate {self._nodes[nid].label}: families "
                         f"{list(g.column_families())}")
        for src in self._sources.values():
            rec = self._records.get(src.id)
            if src.id in self._covering:
                how = (f"checked by its index {self._covering[src.id].index_name} "
                       "(every column)")
            elif rec is not None:
                how = f"checked by its row record {rec.cf} (128-bit row hashes)"
            else:
                how = "not checked (retractions='unchecked')"
            lines.append(f"  source {src.name}: retractions {how}")
        return "\n".join(lines)

    def probed_indexes(self, name: str) -> list[IndexInfo]:
        """Views of the indexes a push to source ``name`` reads.

        Population uses them: an index that no source still to be loaded reads may stop
        compacting while it is written.
        """
        self.compile()
        reach = self._reachable(self._source(name))
        found: dict[int, IndexPlan] = {}
        for node in self._nodes:
            if node.id not in reach or node.id not in self._cols:
                continue
            if isinstance(node, JoinNode):
                hit = [i.id in reach for i in node.inputs]
                positions = [1 - hit.index(True)] if node.how == "inner" and sum(hit) == 1 \
                    else [0, 1]
            elif isinstance(node, JoinAllNode):
                positions = list(range(len(node.inputs)))
            else:
                continue
            for pos in positions:
                ip = self._readers[(node.id, pos)].plan
                found[id(ip)] = ip
        return [ip.index.info() for ip in found.values() if ip.index is not None]

    @property
    def phase(self) -> str:
        """``"population"`` until a driver calls :meth:`set_phase` ``("live")``."""
        store = self._require_store()
        raw = store.meta_get(phase_key(pipeline_owner(self.name)))
        return "live" if raw == b"live" else "population"

    def set_phase(self, phase: str) -> None:
        """Record the pipeline's phase (persisted)."""
        if phase not in ("population", "live"):
            raise SchemaMismatchError(f"phase={phase!r} must be 'population' or 'live'")
        store = self._require_store()
        with store.lock:
            store.meta_put(phase_key(pipeline_owner(self.name)), phase.encode())

    def go_live(self) -> None:
        """End population: the phase becomes ``live`` and every progress marker goes.

        One write, so a crash leaves either the interrupted population with its markers
        (a resume loads only what is missing) or a live pipeline, never a population
        without markers that a resume would load again from the start.
        """
        store = self._require_store()
        owner = pipeline_owner(self.name)
        with store.lock:
            txn = Transaction(store)
            for s in self._sources:
                txn.record(progress_key(owner, s), None)
            txn.record(phase_key(owner), b"live")
            txn.commit()

    def operator_rows(self) -> dict[str, int]:
        """Rows of change each operator produced since this object was created, by label.

        Counted with multiplicity; the per-operator part of population reports.
        """
        return {self._nodes[nid].label: n for nid, n in sorted(self._produced.items())}

    def source_indexes(self, name: str) -> list[IndexInfo]:
        """Views of the indexes a push to source ``name`` writes (population uses them)."""
        self.compile()
        reach = self._reachable(self._source(name))
        return [ip.index.info() for ip in self._indexes
                if ip.index is not None and ip.base.id in reach]

    # ---- compiling ------------------------------------------------------------------------

    def compile(self) -> None:
        """Fix the definition: plan indexes, open their column families, check the catalog.

        Called by the first :meth:`push`; idempotent.
        """
        if self._compiled:
            return
        store = self._require_store()
        if not self._outputs:
            raise SchemaMismatchError(f"pipeline {self.name!r} has no outputs; call "
                                      "p.output(name, stream)")
        with store.lock:
            self._cols = needed_columns(
                self._nodes, [*self._outputs.values(),
                              *(m.node for m in self._materialized.values())])
            for nid, cols in self._cols.items():
                node = self._nodes[nid]
                self._rt[nid] = pa.schema([node.schema.field(c) for c in cols])
                for inp in node.inputs:
                    self._consumers.setdefault(inp.id, []).append(node)
            self._check_sharing_names()
            self._plan_indexes()
            spec = self._spec()
            key = pipeline_spec_key(self.name)
            raw = store.meta_get(key)
            if raw is None:
                if store.read_only:
                    raise JoinSpecMismatchError(
                        f"pipeline {self.name!r} does not exist in {store.path} (opened "
                        "read-only)"
                    )
            elif json.loads(raw).get("version") != SPEC_VERSION:
                raise JoinSpecMismatchError(
                    f"pipeline {self.name!r} in {store.path} was created by an older joinstate "
                    f"(definition version {json.loads(raw).get('version')}, this one reads "
                    f"{SPEC_VERSION}): its sources keep no record of their rows and its "
                    "global aggregates lack their first row; drop the pipeline's state and "
                    "populate it again"
                )
            elif json.loads(raw) != spec:
                raise JoinSpecMismatchError(
                    f"pipeline {self.name!r} already exists in {store.path} with a different "
                    f"definition ({_spec_diff(json.loads(raw), spec)}); use a new pipeline "
                    "name or drop the old state"
                )
            self._open_state(store)
            if raw is None:
                self._create(store, key, spec)
            else:
                owed = store.meta_get(initial_outputs_key(self.name))
                self._initial = None if owed is None else _unpack(owed)
            # Registered once its state exists (another object holding the name is refused
            # here, before this one wrote anything): a definition refused while it is
            # created (an expression failing on a global aggregate's first row) leaves no
            # object holding the name.
            store.register(self)
            self._compiled = True

    def _create(self, store: StateStore, key: bytes, spec: dict[str, Any]) -> None:
        """Record the definition, in one transaction with the state it starts with.

        A pipeline starts from empty sources, where every aggregate without group keys
        already has its row (count 0, the other aggregates NULL), as in SQL.  That row
        flows through the operators after it (their state takes it now, so a
        materialized output shows it before any push) and the change sets it makes are
        kept in ``__meta__``, owed to the outputs: :meth:`push` returns them with the
        first change set that carries rows.
        """
        txn = Transaction(store)
        seeds: dict[int, Delta] = {}
        for node in self._nodes:
            if isinstance(node, AggNode) and not node.keys and node.id in self._cols:
                row = self._groups[node.id].empty_row().select(self._cols[node.id])
                seeds[node.id] = (_as_schema(row, self._rt[node.id]), np.ones(1, np.int64))
        owed: dict[str, pa.Table] = {}
        if seeds:
            blame = ("the row a global aggregate has over no input (counts 0, the other "
                     "aggregates NULL), which the pipeline emits when it is created")
            outs = self._run(None, seeds, txn, blame)
            owed = {n: t for n, t in outs.items() if t.num_rows}
        if owed:
            txn.record(initial_outputs_key(self.name), _pack(owed))
        txn.record(key, json.dumps(spec, sort_keys=True).encode())
        txn.commit()
        self._initial = owed or None

    def _spec(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION, "share_indexes": self.share_indexes,
            "nodes": [n.spec() for n in self._nodes if n.id in self._cols],
            "outputs": {k: n.id for k, n in self._outputs.items()},
            **({"materialized": {k: m.spec() for k, m in self._materialized.items()}}
               if self._materialized else {}),
        }

    def _plan_indexes(self) -> None:
        plans: dict[tuple[Any, ...], IndexPlan] = {}

        def reader(node: Node, pos: int, inp: Node, key: tuple[str, ...], strip: bool) -> None:
            base, steps, bkey = inp, [], list(key)
            needs = set(self._cols[inp.id])
            while strip and self._any_sharing():
                if isinstance(base, FilterNode):
                    steps.append(("filter", base.expr))
                elif isinstance(base, ProjectNode) and (picks := _column_picks(base)):
                    m = dict(picks)
                    steps.append(("rename", picks))
                    bkey = [m[k] for k in bkey]
                else:
                    break
                needs = base.input_needs(needs)[0]
                base = base.inputs[0]
            shared = self._shares(base)
            if not shared:
                base, steps, bkey = inp, [], list(key)
                needs = set(self._cols[inp.id])
            steps.reverse()
            leading = []
            for kind, arg in steps:
                if kind != "filter":
                    break
                leading.append(arg)
            conj = None
            if leading:
                conj = leading[0]
                for e in leading[1:]:
                    conj = conj & e
            who = f"{node.label}[{pos}]"
            ident: tuple[Any, ...] = ((base.id, tuple(bkey)) if shared else (node.id, pos))
            ip = plans.get(ident)
            if ip is None:
                ip = plans[ident] = IndexPlan(base, tuple(bkey),
                                              owner="" if shared else f"{node.label}-{pos}")
            ip.readers.append(who)
            ip.reader_filters.append(conj)
            ip.reader_needs.append(set(needs))
            ip.columns |= needs | set(bkey)
            self._readers[(node.id, pos)] = _Reader(ip, tuple(steps), self._cols[inp.id])

        for node in self._nodes:
            if node.id not in self._cols:
                continue
            if isinstance(node, JoinNode):
                strip = node.how == "inner"
                reader(node, 0, node.inputs[0], node.left_key, strip)
                reader(node, 1, node.inputs[1], node.right_key, strip)
                plan = key_plan(node.inputs[0].schema, node.left_key,
                                node.inputs[1].schema, node.right_key)
                self._set_plan(node, [0, 1], plan)
            elif isinstance(node, JoinAllNode):
                for pos, (inp, k) in enumerate(zip(node.inputs, node.keys, strict=True)):
                    reader(node, pos, inp, (k,), True)
                plan = key_plan(node.inputs[0].schema, [node.keys[0]],
                                node.inputs[1].schema, [node.keys[1]])
                for inp, k in zip(node.inputs[2:], node.keys[2:], strict=True):
                    if key_plan(node.inputs[0].schema, [node.keys[0]], inp.schema, [k]) != plan:
                        raise SchemaMismatchError(
                            f"join_all: key {k!r} compares with the first leg's key as another "
                            "type than the second leg's does; cast the keys to one type"
                        )
                self._set_plan(node, list(range(len(node.inputs))), plan)
        self._indexes = list(plans.values())
        for ip in self._indexes:
            base = ip.base
            if isinstance(base, SourceNode) and base.unique_key:
                ip.columns |= set(base.unique_key)
            if not ip.owner:
                ip.settle_predicate()
                keep = set(ip.key) | set(getattr(base, "unique_key", None) or ())
                for f in ip.reader_filters:
                    if f is not None:
                        keep |= references(base.schema, f)
                ip.settle_guards(base.schema, keep)
            missing = ip.columns - set(self._cols[base.id])
            if missing:  # needed_columns guarantees this; a bug otherwise
                msg = f"internal: index of {base.label} needs {missing} its stream lacks"
                raise SchemaMismatchError(msg)

    def _any_sharing(self) -> bool:
        if isinstance(self.share_indexes, bool):
            return self.share_indexes
        return True

    def _shares(self, node: Node) -> bool:
        """Whether the readers of ``node``'s stream share one index per key."""
        if isinstance(self.share_indexes, bool):
            return self.share_indexes
        name = node.name if isinstance(node, SourceNode) else node.label
        return self.share_indexes.get(name, True)

    def _check_sharing_names(self) -> None:
        if isinstance(self.share_indexes, bool):
            return
        known = {n.name if isinstance(n, SourceNode) else n.label for n in self._nodes}
        unknown = sorted(set(self.share_indexes) - known)
        if unknown:
            raise SchemaMismatchError(
                f"pipeline {self.name!r}: share_indexes names {unknown}, which are neither "
                f"sources nor operators of it (known: {sorted(known)})"
            )

    def _set_plan(self, node: Node, positions: list[int], plan: list[KeyColumn]) -> None:
        for pos in positions:
            r = self._readers[(node.id, pos)]
            ip = r.plan
            if ip.plan is None:
                ip.plan = plan
            elif ip.plan != plan:
                raise SchemaMismatchError(
                    f"{node.label}: its input {pos} shares the index of {ip.base.label} on "
                    f"{list(ip.key)} with another operator that compares those keys as "
                    f"{[k.common for k in ip.plan]}, this one as {[k.common for k in plan]}; "
                    "cast the key columns to one type"
                )
            key = node.left_key if isinstance(node, JoinNode) and pos == 0 else (
                node.right_key if isinstance(node, JoinNode) else (
                    (cast("JoinAllNode", node).keys[pos],)))
            self._codecs[(node.id, pos)] = KeyCodec(list(key), plan, node.label)

    def _open_state(self, store: StateStore) -> None:
        for ip in self._indexes:
            base = ip.base
            cols = [c for c in base.schema.names if c in ip.columns]
            schema = pa.schema([base.schema.field(c) for c in cols])
            uk = base.unique_key if isinstance(base, SourceNode) else None
            side = Side(schema, list(ip.key), list(uk) if uk else None)
            label = f"{self.name}~{base.label}" + (f"~{ip.owner}" if ip.owner else "")
            cf = index_cf(label, ip.key)
            assert ip.plan is not None
            ip.index = Index(store, cf, cast("SideName", base.label), side,
                             KeyCodec(list(ip.key), ip.plan, base.label), track_degree=False)
            for name in ip.index.column_families():
                store.cf(name)
            ip.index.restore_cache()
        for src in self._sources.values():
            if src.retractions == "unchecked":
                continue
            covering = next((ip for ip in self._indexes if ip.base is src
                             and ip.predicate is None and not ip.guards
                             and set(src.schema.names) <= ip.columns), None)
            if covering is not None:
                self._covering[src.id] = covering
                self._records[src.id] = None
            else:
                self._records[src.id] = SourceRows(
                    store, source_rows_cf(self.name, src.name), self.name, src.name,
                    src.schema)
        for node in self._nodes:
            if isinstance(node, AggNode) and node.id in self._cols:
                src = node.inputs[0].schema
                fields = [src.field(k) for k in node.keys]
                specs = []
                for i, (name, func, expr) in enumerate(node.aggs):
                    if expr is None:
                        specs.append(AggSpec(name, cast("Any", func), None))
                        continue
                    (t,) = output_types(src, [expr], [name], f"aggregate {name!r}")
                    fields.append(pa.field(f"__arg{i}", t))
                    specs.append(AggSpec(name, cast("Any", func), f"__arg{i}"))
                g = GroupState(store, f"{self.name}~{node.label}",
                               pa.schema(fields), list(node.keys), specs)
                got = [(f.name, f.type) for f in g.output_schema]
                want = [(f.name, f.type) for f in node.schema]
                if got != want:
                    msg = f"internal: aggregate {node.label} state schema {got} != {want}"
                    raise SchemaMismatchError(msg)
                self._groups[node.id] = g

    def _reachable(self, start: Node) -> set[int]:
        seen = {start.id}
        stack = [start]
        while stack:
            n = stack.pop()
            for c in self._consumers.get(n.id, []):
                if c.id not in seen:
                    seen.add(c.id)
                    stack.append(c)
        return seen

    # ---- lifecycle ------------------------------------------------------------------------

    def _require_store(self) -> StateStore:
        if self.store is None or self.store.closed:
            raise StateClosedError(f"pipeline {self.name!r} is bound to a closed state store")
        return self.store

    def detach(self) -> None:
        """Called by the store on close: derived state is saved, the pipeline is unusable."""
        store = self.store
        if store is not None and not store.closed and not store.read_only:
            for ip in self._indexes:
                if ip.index is not None:
                    try:
                        ip.index.save()
                    except OSError as exc:  # derived state only: the next open rebuilds it
                        log.warning("could not save derived state of %s: %s", ip.index.cf, exc)
        self.store = None
        for ip in self._indexes:
            if ip.index is not None:
                ip.index.cache = None

    def settle(self) -> None:
        """Finish in-memory work deferred during a load (see :meth:`joinstate.Join.settle`)."""
        store = self._require_store()
        self.compile()
        with store.lock:
            for ip in self._indexes:
                if ip.index is not None:
                    ip.index.settle()

    # ---- pushing --------------------------------------------------------------------------

    def push(
        self, source: str, delta: pa.Table | pa.RecordBatch, *, commit_id: str | None = None,
        progress: bytes | None = None,
        before_commit: Callable[[dict[str, pa.Table]], object] | None = None,
    ) -> dict[str, pa.Table]:
        """Apply a change set to ``source``; return every output's change set.

        One transaction: the indexes, aggregates and commit record of every operator the
        source feeds are written together or not at all (a push that would take a row
        below zero, break a unique key or overflow changes nothing).  ``commit_id`` makes
        the push idempotent as :meth:`joinstate.Join.push` does: a repeat with the same
        source and change returns the recorded outputs without applying anything, with
        another change raises :class:`~joinstate.errors.CommitConflictError`.
        ``progress`` is a driver's marker for this source, committed with the push;
        ``before_commit`` receives the outputs after validation, before anything is
        written (if it raises, nothing is written).

        A source refuses a retraction of a row it does not hold (see :meth:`source`).

        The Z-set contract: the sum of every output change set ever returned equals the
        output applied to the sum of every change set pushed.  A pipeline starts from
        empty sources, where an aggregate without group keys already has its row (count
        0, the other aggregates NULL): the change sets that row makes are returned with
        the first push whose change set has a row of non-zero weight (whatever source it
        goes to), consolidated with that push's own.  A push before it with no such row
        returns empty change sets, as any push without one does.
        """
        store = self._require_store()
        src = self._source(source)
        self.compile()
        with store.lock:
            table, w = conform_delta(src.schema, delta, f"source {source!r}")
            ckey = (commit_key(pipeline_owner(self.name), commit_id)
                    if commit_id is not None else None)
            digest = b""
            if ckey is not None:
                digest = _digest(source, table, w)
                recorded = store.meta_get(ckey)
                if recorded is not None:
                    return self._replay(commit_id or "", recorded, digest)
            store.require_writable(f"push to source {source!r} of pipeline {self.name!r}")
            txn = Transaction(store)
            record = self._records.get(src.id)
            if record is not None:
                record.stage(table, w, txn, functools.partial(_row_text, table))
            seeds = ({src.id: (table.select(self._cols[src.id]), w)}
                     if src.id in self._cols and len(w) else {})
            outs = self._run(src, seeds, txn, f"this push to {source!r}")
            if self._initial is not None and w.any():
                outs = self._with_initial(outs, self._initial)
                txn.record(initial_outputs_key(self.name), None)
                txn.after_commit(functools.partial(setattr, self, "_initial", None))
            if ckey is not None:
                txn.record(ckey, _COMMIT_FORMAT + digest + _pack(outs))
            if progress is not None:
                txn.record(progress_key(pipeline_owner(self.name), source), progress)
            if before_commit is not None:
                before_commit(outs)
            txn.commit()
            return outs

    def progress(self, source: str) -> bytes | None:
        """The durable progress marker a driver committed with ``source``'s pushes."""
        self._source(source)
        return self._require_store().meta_get(progress_key(pipeline_owner(self.name), source))

    def clear_progress(self) -> None:
        """Remove every source's progress marker (a driver does so when it finishes)."""
        store = self._require_store()
        with store.lock:
            txn = Transaction(store)
            for s in self._sources:
                txn.record(progress_key(pipeline_owner(self.name), s), None)
            txn.commit()

    def committed(self, commit_id: str) -> bool:
        """Whether a push with ``commit_id`` has been applied."""
        store = self._require_store()
        return store.meta_get(commit_key(pipeline_owner(self.name), commit_id)) is not None

    def _replay(self, commit_id: str, recorded: bytes, digest: bytes) -> dict[str, pa.Table]:
        n = len(_COMMIT_FORMAT)
        if not recorded.startswith(_COMMIT_FORMAT) or recorded[n:n + 16] != digest:
            raise CommitConflictError(
                f"commit id {commit_id!r} of pipeline {self.name!r} was already committed "
                "with a different change set or source; a retry must repeat the same change "
                "to the same source, a new change needs a new commit id; nothing was applied"
            )
        return _unpack(recorded[n + 16:])

    def _run(self, src: SourceNode | None, seeds: dict[int, Delta], txn: Transaction,
             blame: str) -> dict[str, pa.Table]:
        """Propagate change sets given at some nodes (``seeds``) through the graph.

        ``src``: the source pushed to (its seed is its change set), or None when the
        pipeline is created (the seeds are the global aggregates' first rows).
        ``blame`` names what was pushed in expression errors.
        """
        deltas: dict[int, Delta] = {nid: d for nid, d in seeds.items() if len(d[1])}
        self._push_masks.clear()
        reach: set[int] = set()
        for nid in deltas:
            reach |= self._reachable(self._nodes[nid])
        # The source's own indexes first: a change the source cannot take (retracting a
        # row it does not hold, a second row for a unique key) is refused there, naming
        # the source, before any operator computes from it.
        staged: set[int] = set()
        covering = self._covering.get(src.id) if src is not None else None
        for ip in sorted(self._indexes, key=lambda ip: ip is not covering):
            if src is not None and ip.base.id == src.id and src.id in deltas:
                with self._expression_errors(f"the filter of index {ip.index_name}", blame):
                    self._stage_source_index(src, ip, deltas[src.id], txn)
                staged.add(id(ip))
        for node in self._nodes:
            if node.id not in reach or node.id not in self._cols or isinstance(node, SourceNode):
                continue
            ins = [deltas.get(i.id) for i in node.inputs]
            out: Delta | None = None
            if any(d is not None for d in ins):
                with self._expression_errors(f"operator {node.label} {node.params()}", blame):
                    out = self._compute(node, ins, txn)
                if out is not None and len(out[1]):
                    produced = int(np.abs(out[1]).sum())
                    txn.after_commit(functools.partial(self._count, node.id, produced))
            seed = deltas.get(node.id)
            if seed is not None and out is not None and len(out[1]):
                out = (pa.concat_tables([seed[0], out[0]]), np.concatenate([seed[1], out[1]]))
            elif seed is not None:
                out = seed
            if out is not None and len(out[1]):
                deltas[node.id] = out
        for ip in self._indexes:
            d = deltas.get(ip.base.id)
            if d is not None and id(ip) not in staged:
                with self._expression_errors(f"the filter of index {ip.index_name}", blame):
                    self._stage_index(ip, d, txn)
        self._push_masks.clear()  # holds this push's deltas: not kept past it
        outs: dict[str, pa.Table] = {}
        for name, node in self._outputs.items():
            d = deltas.get(node.id)
            outs[name] = self._consolidated(node, d)
        return outs

    @contextlib.contextmanager
    def _expression_errors(self, what: str, blame: str) -> Iterator[None]:
        """Arrow's errors from evaluating an expression on pushed rows, named."""
        try:
            yield
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ExpressionError(
                f"pipeline {self.name!r}, {what}: an expression failed on the rows of "
                f"{blame}: {exc}; nothing was applied (widen the types or guard the "
                "expression, e.g. with if_else / CASE)") from exc

    def _stage_source_index(self, src: SourceNode, ip: IndexPlan, d: Delta,
                            txn: Transaction) -> None:
        """Stage a source's change into one of its indexes.

        The index that holds every column of every row (:attr:`_covering`) is what
        checks the source's retractions: its refusal names the source.
        """
        if self._covering.get(src.id) is not ip:
            self._stage_index(ip, d, txn)
            return
        try:
            self._stage_index(ip, d, txn)
        except OverRetractionError as exc:
            raise OverRetractionError(
                f"pipeline {self.name!r}, source {src.name!r} (checked by its index "
                f"{ip.index_name}, which holds every column of every row): {exc}") from exc

    def _with_initial(self, outs: dict[str, pa.Table], owed: dict[str, pa.Table]
                      ) -> dict[str, pa.Table]:
        """``outs`` plus the change sets owed since creation, consolidated per output."""
        merged = {}
        for name, table in outs.items():
            extra = owed.get(name)
            if extra is None or not extra.num_rows:
                merged[name] = table
                continue
            both = pa.concat_tables([extra.cast(table.schema), table])
            w = both.column(WEIGHT).to_numpy()
            merged[name] = self._consolidated(self._outputs[name],
                                              (both.drop_columns([WEIGHT]), w))
        return merged

    def _stage_index(self, ip: IndexPlan, d: Delta, txn: Transaction) -> None:
        idx = ip.index
        assert idx is not None
        table, w = ip.rows_to_store(*d)
        if not table.num_rows:
            return
        cols = [c for c in ip.base.schema.names if c in ip.columns]
        batch = idx.prepare(table.select(cols).append_column(
            pa.field(WEIGHT, pa.int64()), pa.array(w, pa.int64())))
        if batch.rows:
            idx.stage(batch, txn)
            txn.after_commit(functools.partial(idx.after_write, batch))

    def _count(self, nid: int, n: int) -> None:
        self._produced[nid] = self._produced.get(nid, 0) + n

    def _consolidated(self, node: Node, d: Delta | None) -> pa.Table:
        schema = self._rt[node.id].append(pa.field(WEIGHT, pa.int64(), nullable=False))
        if d is None or not len(d[1]):
            return schema.empty_table()
        table, w = d
        idx, sums = self._consolidate(node, table, w)
        if len(idx) != table.num_rows or not (idx == np.arange(len(idx))).all():
            table = table.take(pa.array(idx))
        return pa.Table.from_arrays([*table.columns, pa.array(sums, pa.int64())],
                                    schema=schema)

    def _consolidate(self, node: Node, table: pa.Table, w: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
        codec = self._row_codecs.get(node.id)
        if codec is None:
            codec = self._row_codecs[node.id] = RowCodec(self._rt[node.id])
        enc = codec.encode(table)
        return consolidate(row_hash(enc), enc, w, f"{node.label}: the summed weight of a row")

    # ---- operators ------------------------------------------------------------------------

    def _compute(self, node: Node, ins: list[Delta | None], txn: Transaction) -> Delta | None:
        cols = self._cols[node.id]
        if isinstance(node, FilterNode):
            table, w = cast("Delta", ins[0])
            keep = self._filter_mask(node, table)
            if not keep.any():
                return None
            if keep.all():
                return table.select(cols), w
            sel = np.flatnonzero(keep)
            return table.take(pa.array(sel)).select(cols), w[sel]
        if isinstance(node, ProjectNode):
            table, w = cast("Delta", ins[0])
            pos = {f.name: i for i, f in enumerate(node.schema)}
            out = evaluate(table, [node.exprs[pos[c]] for c in cols], cols)
            return _as_schema(out, self._rt[node.id]), w
        if isinstance(node, UnionNode):
            parts = [d for d in ins if d is not None]
            tables = [_as_schema(t.select(cols), self._rt[node.id]) for t, _ in parts]
            return pa.concat_tables(tables), np.concatenate([w for _, w in parts])
        if isinstance(node, JoinNode):
            if node.how == "inner" and sum(d is not None for d in ins) == 1:
                return self._join_one_side(node, ins)
            return self._join_recompute(node, ins)
        if isinstance(node, JoinAllNode):
            return self._join_all(node, ins)
        if isinstance(node, AggNode):
            return self._aggregate(node, cast("Delta", ins[0]), txn)
        msg = f"internal: no rule for {node.label}"
        raise SchemaMismatchError(msg)

    def _filter_mask(self, node: FilterNode, table: pa.Table) -> np.ndarray:
        """``node``'s predicate on this push's input delta ``table``.

        Filters that read the same stream (q4: the six legs cut from ``year_total``) are
        evaluated together, in one Arrow plan, the first time one of them runs in a push:
        a plan costs ~70 µs whatever the row count, which dominates small pushes.
        """
        cached = self._push_masks.pop(node.id, None)
        if cached is not None and cached[0] is table:
            return cached[1]
        siblings = [c for c in self._consumers.get(node.inputs[0].id, ())
                    if isinstance(c, FilterNode) and c.id in self._cols and c.id != node.id]
        if not siblings or table.num_rows == 0:
            return mask(table, node.expr)
        try:
            got = masks(table, [node.expr, *(f.expr for f in siblings)])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return mask(table, node.expr)  # each filter on its own: errors name their operator
        for f, m in zip(siblings, got[1:], strict=True):
            self._push_masks[f.id] = (table, m)
        return got[0]

    def _keys(self, node: Node, pos: int, table: pa.Table
              ) -> tuple[Bytes, np.ndarray, np.ndarray]:
        """Canonical keys, their hashes, and the rows whose key is not NULL."""
        canon, null = self._codecs[(node.id, pos)].encode(table)
        nn = np.flatnonzero(~null)
        if len(nn) != table.num_rows:
            canon = canon.take(nn)
        return canon, hash_prefix(canon), nn

    def _assemble(self, node: JoinNode, left: pa.Table | None, right: pa.Table | None,
                  n: int) -> pa.Table:
        cols = self._cols[node.id]
        lmap = dict(zip(node.out_left, node.inputs[0].schema.names, strict=True))
        rmap = (dict(zip(node.out_right, node.inputs[1].schema.names, strict=True))
                if node.out_right else {})
        arrays = []
        for f in self._rt[node.id]:
            if f.name in lmap:
                arrays.append(left.column(lmap[f.name]) if left is not None
                              else pa.nulls(n, f.type))
            else:
                arrays.append(right.column(rmap[f.name]) if right is not None
                              else pa.nulls(n, f.type))
        del cols
        return pa.Table.from_arrays(arrays, schema=self._rt[node.id])

    def _join_one_side(self, node: JoinNode, ins: list[Delta | None]) -> Delta | None:
        """ΔS ⋈ O: probe the other input's index with the changed keys."""
        s = 0 if ins[0] is not None else 1
        table, w = cast("Delta", ins[s])
        canon, khash, nn = self._keys(node, s, table)
        if not len(nn):
            return None
        kg = group_keys(khash, canon)
        inv = np.full(table.num_rows, -1, dtype=np.int64)
        inv[nn] = kg.inv
        found = self._readers[(node.id, 1 - s)].probe(canon.take(kg.first), khash[kg.first])
        if not len(found.w):
            return None
        ri, ei = expand(inv, found.q, len(kg))
        if not len(ri):
            return None
        wo = checked_mul(w[ri], found.w[ei], f"{node.label}: the weight of a joined pair")
        mine, other = table.take(pa.array(ri)), found.rows.take(pa.array(ei))
        left, right = (mine, other) if s == 0 else (other, mine)
        return self._assemble(node, left, right, len(wo)), wo

    def _keyed(self, node: Node, ins: list[Delta | None]) -> list[Keyed | None]:
        """Each changed input with its canonical keys, key hashes and non-NULL-key rows."""
        keyed: list[Keyed | None] = []
        for pos, d in enumerate(ins):
            if d is None:
                keyed.append(None)
                continue
            canon, khash, nn = self._keys(node, pos, d[0])
            keyed.append((d[0], d[1], canon, khash, nn))
        return keyed

    def _old_and_new(self, node: Node, keyed: list[Keyed | None]
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
        readers = [self._readers[(node.id, pos)] for pos in range(len(keyed))]
        probed: dict[int, Entries] = {}
        first_masks: dict[int, np.ndarray] = {}
        for r in readers:
            if id(r.plan) not in probed:
                idx = r.plan.index
                assert idx is not None
                probed[id(r.plan)] = raw = idx.probe(qcanon, qhash)
                first_masks.update(_first_masks(
                    raw, [s for s in readers if s.plan is r.plan]))
        olds: list[Entries] = []
        news: list[Entries] = []
        offset = 0
        for pos, k in enumerate(keyed):
            r = readers[pos]
            idx = r.plan.index
            assert idx is not None
            old = r.select(probed[id(r.plan)], idx.schema, first_masks.get(id(r)))
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

    def _join_recompute(self, node: JoinNode, ins: list[Delta | None]) -> Delta | None:
        """J(new) - J(old) over the keys that changed (any join type, any inputs changed)."""
        keyed = self._keyed(node, ins)
        parts: list[Delta] = []
        both = self._old_and_new(node, keyed)
        if both is not None:
            sides_old, sides_new, G = both
            new = self._join_rows(node, sides_new[0], sides_new[1], G)
            old_out = self._join_rows(node, sides_old[0], sides_old[1], G)
            parts += new
            parts += [(t, -w) for t, w in old_out]
        # Rows whose key is NULL never match: a preserved side emits them as they come.
        for pos, preserved in ((0, node.how in ("left", "full", "left_anti")),
                               (1, node.how in ("right", "full"))):
            k = keyed[pos]
            if k is None or not preserved:
                continue
            table, w, _, _, nn = k
            nulls = np.setdiff1d(np.arange(table.num_rows), nn)
            if len(nulls):
                rows = table.take(pa.array(nulls))
                left, right = (rows, None) if pos == 0 else (None, rows)
                parts.append((self._assemble(node, left, right, len(nulls)), w[nulls]))
        parts = [p for p in parts if len(p[1])]
        if not parts:
            return None
        table = pa.concat_tables([t for t, _ in parts])
        w = np.concatenate([w for _, w in parts])
        idx, sums = self._consolidate(node, table, w)
        return table.take(pa.array(idx)), sums

    def _join_rows(self, node: JoinNode, left: Entries, right: Entries, G: int) -> list[Delta]:
        """The join of two key-tagged row sets (``q``: key group), with weights."""
        out: list[Delta] = []
        how = node.how
        deg_r = sum_by(right.q, right.w, G)
        if how in ("left_semi", "left_anti"):
            hit = deg_r[left.q] > 0
            sel = np.flatnonzero(hit if how == "left_semi" else ~hit)
            if len(sel):
                out.append((self._assemble(node, left.rows.take(pa.array(sel)), None, len(sel)),
                            left.w[sel]))
            return out
        li, ri = expand(left.q, right.q, G)
        if len(li):
            w = checked_mul(left.w[li], right.w[ri], f"{node.label}: the weight of a joined pair")
            out.append((self._assemble(node, left.rows.take(pa.array(li)),
                                       right.rows.take(pa.array(ri)), len(w)), w))
        if how in ("left", "full"):
            sel = np.flatnonzero(deg_r[left.q] == 0)
            if len(sel):
                out.append((self._assemble(node, left.rows.take(pa.array(sel)), None, len(sel)),
                            left.w[sel]))
        if how in ("right", "full"):
            deg_l = sum_by(left.q, left.w, G)
            sel = np.flatnonzero(deg_l[right.q] == 0)
            if len(sel):
                out.append((self._assemble(node, None, right.rows.take(pa.array(sel)),
                                           len(sel)), right.w[sel]))
        return out

    def _join_all(self, node: JoinAllNode, ins: list[Delta | None]) -> Delta | None:
        """Delta join: for the changed keys, Π legs(new) - Π legs(old), from the indexes."""
        both = self._old_and_new(node, self._keyed(node, ins))
        if both is None:
            return None
        olds, news, G = both
        products = [self._product(node, news, G, 1), self._product(node, olds, G, -1)]
        parts = [p for p in products if p is not None]
        if not parts:
            return None
        table = pa.concat_tables([t for t, _ in parts])
        w = np.concatenate([w for _, w in parts])
        idx_, sums = self._consolidate(node, table, w)
        return table.take(pa.array(idx_)), sums

    def _product(self, node: JoinAllNode, legs: list[Entries], G: int, sign: int
                 ) -> Delta | None:
        first = legs[0]
        picks = [np.arange(len(first.w), dtype=np.int64)]
        w = first.w * sign
        q = first.q
        for leg in legs[1:]:
            a, b = expand(q, leg.q, G)
            picks = [p[a] for p in picks] + [b]
            w = checked_mul(w[a], leg.w[b], f"{node.label}: the weight of a joined row")
            q = q[a]
            if not len(w):
                return None
        arrays = []
        rt = self._rt[node.id]
        wanted = set(rt.names)
        for leg_name, leg, pick in zip(node.legs, legs, picks, strict=True):
            taken = None
            for c in leg.rows.column_names:
                if node.out_name(leg_name, c) in wanted:
                    if taken is None:
                        taken = leg.rows.take(pa.array(pick))
                    arrays.append((node.out_name(leg_name, c), taken.column(c)))
        by_name = dict(arrays)
        return pa.Table.from_arrays([by_name[f.name] for f in rt], schema=rt), w

    def _aggregate(self, node: AggNode, d: Delta, txn: Transaction) -> Delta | None:
        table, w = d
        exprs = [pc.field(k) for k in node.keys]
        names = list(node.keys)
        for i, (_, _, expr) in enumerate(node.aggs):
            if expr is not None:
                exprs.append(expr)
                names.append(f"__arg{i}")
        # count(*) alone without group keys reads no column: the rows still count (a
        # table of no columns would have none).
        args = evaluate(table, exprs, names) if exprs else table
        out, wo = self._groups[node.id].stage(args, w, txn)
        if not len(wo):
            return None
        return _as_schema(out.select(self._cols[node.id]), self._rt[node.id]), wo

    # ---- summaries: read from the store alone, no definition needed -----------------------

    @staticmethod
    def stored_names(store: StateStore) -> list[str]:
        """Names of the pipelines whose definitions ``store`` holds, sorted."""
        prefix = pipeline_spec_key("")
        return sorted(k[len(prefix):].decode() for k in store.meta_keys(prefix))

    @staticmethod
    def describe(store: StateStore, name: str) -> dict[str, Any]:
        """What ``store`` holds of pipeline ``name``, from its metadata and column families.

        Needs no Python definition (a tool inspecting a state directory has none):
        sources (name, unique key, columns), outputs, operators per kind, phase,
        population progress markers and recorded commit ids from ``__meta__``; per index
        (``ix.<pipeline>~<stream>[<key>]`` with its ``.nulls`` family), per aggregate
        (``agg[<pipeline>~<operator>]`` with ``.minmax``) and per source row record
        (``rows[<pipeline>~<source>]``: rows held, hash entries stored) the counters,
        bytes (SST files + memtables), L0 files and auto-compaction, from RocksDB; per
        source, what checks its retractions.
        Raises :class:`~joinstate.errors.JoinSpecMismatchError` if there is no such
        pipeline.
        """
        from joinstate.activity import auto_compaction_flags
        from joinstate.names import commit_prefix
        from joinstate.summary import auto_compaction

        raw = store.meta_get(pipeline_spec_key(name))
        if raw is None:
            raise JoinSpecMismatchError(
                f"pipeline {name!r} does not exist in {store.path} (pipelines there: "
                f"{Pipeline.stored_names(store)})"
            )
        spec = json.loads(raw)
        nodes = spec.get("nodes", [])
        families = store.column_families()
        records_of = {cf: found[1] for cf in families
                      if (found := source_rows_of(cf)) is not None and found[0] == name}
        recorded = set(records_of.values())
        sources = [{"name": n.get("name"), "unique_key": n.get("unique_key"),
                    "columns": n.get("columns", []), "retractions": n.get("retractions"),
                    "checked_by": ("nothing (unchecked)" if n.get("retractions") == "unchecked"
                                   else "its row record" if n.get("name") in recorded
                                   else "its index holding every column")}
                   for n in nodes if n.get("kind") == "source"]
        kinds: dict[str, int] = {}
        for n in nodes:
            kinds[n.get("kind", "?")] = kinds.get(n.get("kind", "?"), 0) + 1
        owner = pipeline_owner(name)
        progress: dict[str, Any] = {}
        for s in sources:
            marker = store.meta_get(progress_key(owner, str(s["name"])))
            if marker is not None:
                try:
                    progress[str(s["name"])] = json.loads(marker)
                except ValueError:
                    progress[str(s["name"])] = {"raw": marker.decode("utf-8", "replace")}
        flags = auto_compaction_flags(store.path)

        def facts(cfs: list[str]) -> dict[str, Any]:
            props = {cf: {"num-files-at-level0": store.property_int(
                cf, "rocksdb.num-files-at-level0"),
                "auto_compaction_disabled": flags.get(cf)} for cf in cfs}
            size = sum((store.property_int(cf, "rocksdb.total-sst-files-size") or 0)
                       + (store.property_int(cf, "rocksdb.cur-size-all-mem-tables") or 0)
                       for cf in cfs)
            l0 = [p["num-files-at-level0"] for p in props.values()]
            return {"bytes": size,
                    "l0_files": sum(n for n in l0 if n is not None)
                    if any(n is not None for n in l0) else None,
                    "auto_compaction": auto_compaction(props)}

        ix_prefix, agg_prefix = f"ix.{name}~", f"agg[{name}~"
        indexes, aggregates, records = [], [], []
        for cf in families:
            if cf in records_of:
                records.append({"column_family": cf, "source": records_of[cf],
                                "rows": store.counter(cf, "rows"),
                                "entries": store.counter(cf, "entries"), **facts([cf])})
                continue
            if cf.startswith(ix_prefix) and cf.endswith("]"):
                label, key = cf[len(ix_prefix):-1].split("[", 1)
                stream, _, reader = label.partition("~")
                parts = [cf] + [c for c in (cf + ".nulls", cf + ".deg") if c in families]
                indexes.append({
                    "column_family": cf, "stream": stream, "reader": reader or None,
                    "key": key.split(","), "rows": store.counter(cf, "rows"),
                    "entries": store.counter(cf, "entries"),
                    "null_key_rows": store.counter(cf + ".nulls", "rows"), **facts(parts)})
            elif cf.startswith(agg_prefix) and cf.endswith("]"):
                parts = [cf] + [c for c in (cf + ".minmax",) if c in families]
                aggregates.append({"column_family": cf,
                                   "operator": cf[len(agg_prefix):-1],
                                   "groups": store.counter(cf, "entries"), **facts(parts)})
        phase = store.meta_get(phase_key(owner))
        return {
            "name": name, "phase": "live" if phase == b"live" else "population",
            "share_indexes": spec.get("share_indexes"), "sources": sources,
            "outputs": list(spec.get("outputs", {})),
            "materialized": list(spec.get("materialized", {})), "operators": kinds,
            "indexes": indexes, "aggregates": aggregates, "row_records": records,
            "population_progress": progress,
            "commit_ids": len(store.meta_keys(commit_prefix(owner))),
        }

    @staticmethod
    def verify_records(store: StateStore, name: str) -> dict[str, dict[str, int]]:
        """Check every source row record of pipeline ``name`` from the store alone.

        Needs no definition (``joinstate verify`` has none): each record's values must
        parse, hold no row a negative number of times and agree with its counters.
        Returns ``{column family: {"rows", "entries", "distinct"}}``; raises
        :class:`~joinstate.errors.StateCorruptedError` otherwise.
        """
        with store.lock:
            return {cf: check_record(store, cf) for cf in store.column_families()
                    if (found := source_rows_of(cf)) is not None and found[0] == name}

    @staticmethod
    def summary_of(facts: dict[str, Any]) -> str:
        """:meth:`describe`'s dict as a few lines and a small table (see :meth:`summary`)."""
        from joinstate.summary import human_bytes

        def num(v: object) -> str:
            return f"{v:,}" if isinstance(v, int) else "?"

        shared = facts.get("share_indexes")
        sharing = "?" if shared is None else "shared" if shared else "one per operator input"
        lines = [
            f"pipeline {facts['name']} (phase {facts['phase']}, indexes {sharing})",
            "  sources: " + ", ".join(
                str(s["name"]) + (f" (unique {','.join(s['unique_key'])})"
                                  if s.get("unique_key") else "")
                + (" (retractions unchecked)" if s.get("retractions") == "unchecked" else "")
                for s in facts["sources"]),
            "  outputs: " + ", ".join(
                o + (" (materialized)" if o in facts.get("materialized", []) else "")
                for o in facts["outputs"]),
        ]
        table = [["state", "rows", "entries", "bytes", "L0 files", "auto-compaction"]]
        for ix in facts["indexes"]:
            what = f"index {ix['stream']}" + (f"~{ix['reader']}" if ix.get("reader") else "")
            rows = num(ix["rows"]) + (f" (+{ix['null_key_rows']:,} NULL key)"
                                      if ix.get("null_key_rows") else "")
            table.append([f"{what} [{','.join(ix['key'])}]", rows, num(ix["entries"]),
                          human_bytes(ix["bytes"]), num(ix["l0_files"]),
                          str(ix["auto_compaction"])])
        for agg in facts["aggregates"]:
            table.append([f"aggregate {agg['operator']}", f"{num(agg['groups'])} groups",
                          num(agg["groups"]), human_bytes(agg["bytes"]),
                          num(agg["l0_files"]), str(agg["auto_compaction"])])
        for rec in facts.get("row_records", []):
            table.append([f"row record {rec['source']}", num(rec["rows"]),
                          num(rec["entries"]), human_bytes(rec["bytes"]),
                          num(rec["l0_files"]), str(rec["auto_compaction"])])
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        left_aligned = {0, len(widths) - 1}
        lines += ["  " + "  ".join(c.ljust(w) if i in left_aligned else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths, strict=True))
                                   ).rstrip() for r in table]
        return "\n".join(lines)

    def stats(self) -> dict[str, Any]:
        """Sources, outputs, phase and, per index and aggregate, counters and RocksDB facts.

        The same dict as ``Pipeline.describe(store, name)`` (which needs no definition).
        """
        store = self._require_store()
        self.compile()
        with store.lock:
            return Pipeline.describe(store, self.name)

    def summary(self) -> str:
        """A small readable table of the pipeline's state, one row per index and aggregate.

        Per row: rows, entries, bytes (SST files + memtables), L0 files and whether
        auto-compaction is on; above it the phase, sources and outputs.  What
        ``joinstate inspect`` prints per pipeline.
        """
        return Pipeline.summary_of(self.stats())

    def verify(self) -> dict[str, Any]:
        """Read the pipeline's state and check it against its counters.

        Every index (rows and entries of both layouts, and the in-memory state that
        decides writes without reading: entry maps, key sets), every source's row record
        (values, a row never held a negative number of times, counters, the in-memory
        multiset) and, where a source has both, that its record and an index holding all
        of its rows agree on how many it holds.  Returns the counts per index and record;
        raises :class:`~joinstate.errors.StateCorruptedError` at the first disagreement
        (derived in-memory state is rebuilt first).
        """
        store = self._require_store()
        self.compile()
        out: dict[str, Any] = {"indexes": {}, "row_records": {}}
        with store.lock:
            for ip in self._indexes:
                idx = ip.index
                assert idx is not None
                counted: dict[str, int] = {}
                for layout, part in ((idx.layout, ""), (idx.nulls, "null_")):
                    _, w, _ = layout.scan()
                    got = {"rows": int(w.sum()) if len(w) else 0, "entries": len(w)}
                    for what, n in got.items():
                        counted[part + what] = n
                        if n != store.counter(layout.cf, what):
                            raise StateCorruptedError(
                                f"pipeline {self.name!r}: {layout.cf} holds {n} {what} but "
                                f"its counter says {store.counter(layout.cf, what)}; the "
                                "state is inconsistent: restore it from a copy or repopulate")
                    layout.check_derived()
                out["indexes"][idx.cf] = counted
            for sid, rec in self._records.items():
                if rec is None:
                    continue
                facts = rec.verify()
                out["row_records"][rec.cf] = facts
                for ip in self._indexes:
                    if ip.base.id == sid and ip.predicate is None and ip.index is not None \
                            and ip.index.rows != facts["rows"]:
                        raise StateCorruptedError(
                            f"pipeline {self.name!r}: source {self._nodes[sid].label!r} holds "
                            f"{facts['rows']} rows by its row record {rec.cf} but "
                            f"{ip.index.rows} by its index {ip.index.cf}; the state is "
                            "inconsistent: restore it from a copy or repopulate")
        return out


# ---- commit records ----------------------------------------------------------------------


def _digest(source: str, table: pa.Table, w: np.ndarray) -> bytes:
    """16 bytes identifying (source, consolidated change set), independent of row order."""
    codec = RowCodec(table.schema)
    enc = codec.encode(table)
    rh = row_hash(enc)
    idx, sums = consolidate(rh, enc, w, f"source {source!r}: the summed weight of a row")
    h = xxhash.xxh3_128()
    h.update(source.encode() + b"\x00")
    if len(idx):
        mat = np.ascontiguousarray(rh.take(idx).matrix())
        words = mat.view("<u8")
        order = np.lexsort((words[:, 1], words[:, 0]))
        h.update(np.ascontiguousarray(mat[order]).tobytes())
        h.update(sums[order].astype("<i8").tobytes())
    return h.digest()


def _pack(outs: dict[str, pa.Table]) -> bytes:
    blobs = []
    for t in outs.values():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as writer:
            writer.write_table(t)
        blobs.append(sink.getvalue().to_pybytes())
    header = json.dumps([[n, len(b)] for n, b in zip(outs, blobs, strict=True)]).encode()
    return len(header).to_bytes(4, "big") + header + b"".join(blobs)


def _unpack(raw: bytes) -> dict[str, pa.Table]:
    n = int.from_bytes(raw[:4], "big")
    header = json.loads(raw[4:4 + n])
    pos = 4 + n
    out = {}
    for name, size in header:
        out[name] = pa.ipc.open_stream(pa.py_buffer(raw[pos:pos + size])).read_all()
        pos += size
    return out


def _spec_diff(stored: dict[str, Any], new: dict[str, Any]) -> str:
    """The first difference of two definitions, field by field, without JSON punctuation."""

    def text(key: str, v: Any) -> str:
        if key == "aggs" and isinstance(v, list):  # [name, function, argument or None]
            return ", ".join(f"{a[0]}={a[1]}({'*' if a[2] is None else a[2]})" for a in v)
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    diffs = []
    if stored.get("share_indexes") != new.get("share_indexes"):
        diffs.append(f"share_indexes {stored.get('share_indexes')} -> {new.get('share_indexes')}")
    a, b = stored.get("nodes", []), new.get("nodes", [])
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            if x.get("kind") != y.get("kind"):
                diffs.append(f"operator {i} was {x.get('kind')}, now {y.get('kind')}")
            else:
                fields = "; ".join(f"{k} [{text(k, x.get(k))}] -> [{text(k, y.get(k))}]"
                                   for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k))
                diffs.append(f"operator {i} ({x.get('kind')}): {fields}")
            break
    if len(a) != len(b):
        diffs.append(f"{len(a)} operators before, {len(b)} now")
    names = sorted(stored.get("outputs") or {}), sorted(new.get("outputs") or {})
    if names[0] != names[1]:
        diffs.append(f"outputs [{text('', names[0])}] -> [{text('', names[1])}]")
    elif stored.get("materialized") != new.get("materialized"):
        diffs.append("a materialized output's order or limit")
    return "; ".join(diffs) or "definition differs"


def _row_text(table: pa.Table, i: int) -> str:
    """Row ``i`` of ``table`` as ``(column=value, ...)``, for messages."""
    row = table.slice(i, 1).to_pylist()[0]
    return "(" + ", ".join(f"{k}={v!r}" for k, v in row.items()) + ")"


def _as_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``, or as it is when it already has it.

    A cast costs ~5 us per column even when nothing changes, and most pushes are small.
    """
    return table if table.schema.equals(schema) else table.cast(schema)
