"""How a graph is kept, decided without a store: columns, indexes, readers, key plans.

:meth:`PhysicalPlan.of` turns a :class:`~joinstate.graph.Graph` and a sharing setting
into everything the runtime, ``explain``, population, the planner and Spark need to
know before any state exists:

* **Columns.**  Every node's change sets carry only the columns something downstream
  reads (:func:`~joinstate.graph.needed_columns`), so values stay small and RocksDB
  writes cheap.
* **Indexes are named by what they index.**  A join input is stored as an index of a
  stream on a key (an :class:`IndexPlan`).  Two operators that read the same stream on
  the same key read one index holding the union of the columns they need.  An inner
  join's input that is a filter or a column pick of another stream reads that stream's
  index and applies the filter and the renaming to what it probes (its :class:`Reader`),
  so the six filtered legs of q4's ``year_total`` self-join share one index.  Sharing
  can be turned off (``share_indexes=False``, or per stream), for measurement.
* **A shared index keeps only rows some reader can pass** (the OR of its readers'
  filters) and stores a column as NULL on rows no reader needing it passes (its guards):
  sharing never stores more than the per-reader indexes would.
* **Key plans**: per (operator, input), how its key columns compare with the other
  inputs' (an ``int32`` key meets an ``int64`` one), fixed per shared index.
* **Retraction checks**: the index of a source that holds every column of every row
  decides the source's retractions; other checked sources keep a row record.
"""

from __future__ import annotations

from collections import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._expr import mask, masks, references
from joinstate._probe import Entries
from joinstate.errors import SchemaMismatchError
from joinstate.keys import KeyCodec, KeyColumn, key_plan
from joinstate.names import index_cf
from joinstate.nodes import FilterNode, JoinAllNode, JoinNode, Node, ProjectNode, SourceNode
from joinstate.side import Side

if TYPE_CHECKING:
    from joinstate._bytes import Bytes
    from joinstate._index import Index
    from joinstate.graph import Graph

__all__ = ["LAYOUT", "LAYOUTS", "IndexPlan", "PhysicalPlan", "Reader", "Sharing", "check_sharing",
           "first_masks"]

LAYOUTS = (1, 2)
"""Index layouts this joinstate reads.  1: an index stores what its readers' filters
read, and the readers evaluate them again on every probe.  2: where every reader's
leading filter is the index's predicate, they are not evaluated again and the columns
only they read are not stored (:meth:`IndexPlan.implied_filter`)."""
LAYOUT = 2
"""The layout of new state."""

Sharing = bool | dict[str, bool]
"""``share_indexes``: one switch, or per source name / operator label (default True)."""


@dataclass(eq=False)
class IndexPlan:
    """One index of a pipeline: a stream's rows by key, shared by its readers."""

    base: Node
    key: tuple[str, ...]
    columns: set[str] = field(default_factory=set)
    readers: list[str] = field(default_factory=list)
    plan: list[KeyColumn] | None = None
    owner: str = ""
    """Set when sharing is off: the reader that owns it (``<operator>-<input>``)."""
    predicate: pc.Expression | None = None
    """Rows the index keeps: the OR of its readers' filters (None: every row)."""
    reader_filters: list[pc.Expression | None] = field(default_factory=list)
    """Per reader, the AND of the filters it applies before any renaming (None: none)."""
    reader_needs: list[set[str]] = field(default_factory=list)
    """Per reader, the columns of the index's stream it reads (filters included)."""
    reader_rest: list[set[str]] = field(default_factory=list)
    """Per reader, the columns it reads but for those only its leading filters read."""
    guards: list[tuple[pc.Expression, list[str]]] = field(default_factory=list)
    """Columns kept only on rows some reader of theirs passes: (that OR, columns)."""

    def cf(self, pipeline: str) -> str:
        """The index's column family in pipeline ``pipeline``."""
        label = f"{pipeline}~{self.base.label}" + (f"~{self.owner}" if self.owner else "")
        return index_cf(label, self.key)

    @property
    def stored_columns(self) -> list[str]:
        """The columns the index stores, in its stream's order."""
        return [c for c in self.base.schema.names if c in self.columns]

    def side(self) -> Side:
        """The stored rows as a join side: schema, key, and the source's unique key."""
        cols = self.stored_columns
        schema = pa.schema([self.base.schema.field(c) for c in cols])
        uk = self.base.unique_key if isinstance(self.base, SourceNode) else None
        return Side(schema, list(self.key), list(uk) if uk else None)

    def key_codec(self) -> KeyCodec:
        """The codec of the index's keys (under the plan its readers agreed on)."""
        assert self.plan is not None
        return KeyCodec(list(self.key), self.plan, self.base.label)

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

    def implied_filter(self) -> bool:
        """Whether every reader's leading filter is the index's predicate itself.

        Then every stored row passes each reader's leading filter: a reader need not
        evaluate it again on what it probes, and the index need not store the columns
        only that filter reads.  A change to such a column that leaves the row passing
        (a threshold compared with every row of a group, moved without crossing it)
        then stores the same row, which cancels instead of being rewritten.
        """
        if self.predicate is None or not self.reader_filters:
            return False
        return len({str(f) for f in self.reader_filters}) == 1

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
class Reader:
    """How one operator input reads an index.

    ``chain``: the filters and column-picking projections between the index's stream
    and the input, bottom-up, applied to every probed row; with them, operators that
    read differently filtered or projected versions of one stream share its index.
    """

    plan: IndexPlan
    chain: tuple[Step, ...]
    columns: list[str]
    """The input's columns as its operator reads them (its needed columns)."""

    def probe(self, index: Index, qcanon: Bytes, qhash: np.ndarray) -> Entries:
        """The input's rows at the queried keys, read from ``index`` through the chain."""
        found = index.probe(qcanon, qhash) if len(qhash) else None
        return self.select(found, index.schema)

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


def first_masks(found: Entries | None, readers: list[Reader]) -> dict[int, np.ndarray]:
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


def check_sharing(share_indexes: object) -> Sharing:
    """``share_indexes`` validated: a bool, or a mapping name -> bool (sorted)."""
    if isinstance(share_indexes, bool):
        return share_indexes
    if isinstance(share_indexes, abc.Mapping) and all(
            isinstance(k, str) and isinstance(v, bool) for k, v in share_indexes.items()):
        return dict(sorted(share_indexes.items()))
    raise SchemaMismatchError(
        f"share_indexes={share_indexes!r} must be a bool, or a mapping from a source name or "
        "operator label (as explain() shows it) to a bool")


class PhysicalPlan:
    """The physical plan of a graph under a sharing setting (see the module docstring).

    Immutable once built; holds no store.  ``columns``/``schemas``: per needed node, the
    columns its change sets carry; ``indexes``; ``readers`` and ``codecs`` per
    (operator id, input position); ``covering``: per checked source id, the index that
    holds every column of every row (it decides the source's retractions).
    """

    def __init__(self, graph: Graph, share_indexes: Sharing, what: str,
                 layout: int = LAYOUT) -> None:
        if layout not in LAYOUTS:
            raise SchemaMismatchError(f"{what}: index layout {layout!r} is not one of "
                                      f"{LAYOUTS}; this joinstate is older than the state")
        self.graph = graph
        self.share_indexes = share_indexes
        self.layout = layout
        self.columns: dict[int, list[str]] = graph.needed
        self.schemas: dict[int, pa.Schema] = {
            nid: pa.schema([graph.nodes[nid].schema.field(c) for c in cols])
            for nid, cols in self.columns.items()}
        self.consumers: dict[int, list[Node]] = {}
        for nid in self.columns:
            for inp in graph.nodes[nid].inputs:
                self.consumers.setdefault(inp.id, []).append(graph.nodes[nid])
        self.indexes: list[IndexPlan] = []
        self.readers: dict[tuple[int, int], Reader] = {}
        self.codecs: dict[tuple[int, int], KeyCodec] = {}
        self.covering: dict[int, IndexPlan] = {}
        self._check_sharing_names(what)
        self._plan_indexes()
        for src in graph.sources.values():
            if src.retractions == "unchecked":
                continue
            covering = next((ip for ip in self.indexes if ip.base is src
                             and ip.predicate is None and not ip.guards
                             and set(src.schema.names) <= ip.columns), None)
            if covering is not None:
                self.covering[src.id] = covering

    @classmethod
    def of(cls, graph: Graph, share_indexes: object = True, *, what: str = "the graph",
           layout: int = LAYOUT) -> PhysicalPlan:
        """The plan of ``graph``; ``what`` names it in messages (``pipeline 'q4'``).

        ``layout``: :data:`LAYOUT` for new state; a stored pipeline's own (its definition
        records it) when it re-attaches.
        """
        return cls(graph, check_sharing(share_indexes), what, layout)

    # ---- facts ----------------------------------------------------------------------

    def reachable(self, start: Node) -> set[int]:
        """Ids of ``start`` and every needed node downstream of it."""
        seen = {start.id}
        stack = [start]
        while stack:
            for c in self.consumers.get(stack.pop().id, []):
                if c.id not in seen:
                    seen.add(c.id)
                    stack.append(c)
        return seen

    def written_by(self, source: str) -> list[IndexPlan]:
        """The indexes a push to ``source`` writes (of its stream or one downstream)."""
        reach = self.reachable(self.graph.source(source))
        return [ip for ip in self.indexes if ip.base.id in reach]

    def probed_by(self, source: str) -> list[IndexPlan]:
        """The indexes a push to ``source`` reads.

        An inner join with one changed input probes the other input's index; any other
        join, or one whose inputs both change, reads both; a ``join_all`` reads every leg.
        """
        reach = self.reachable(self.graph.source(source))
        found: dict[int, IndexPlan] = {}
        for node in self.graph.nodes:
            if node.id not in reach or node.id not in self.columns:
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
                ip = self.readers[(node.id, pos)].plan
                found[id(ip)] = ip
        return list(found.values())

    def sharing_text(self) -> str:
        """The sharing setting in words, for ``explain``."""
        s = self.share_indexes
        return ("shared" if s is True else "per operator" if s is False else
                f"shared except {[k for k, v in s.items() if not v]}")

    def explain_index(self, ip: IndexPlan, cf: str, layout: str) -> str:
        """One line of ``explain``: an index, who reads it, what it keeps."""
        return (f"index {cf}: {ip.base.label} by {list(ip.key)}, layout {layout}, columns "
                f"{ip.stored_columns}; read by {', '.join(ip.readers)}"
                + (f"; keeps rows where {ip.predicate}" if ip.predicate is not None else "")
                + ("; its readers trust it (the columns only that filter reads are not "
                   "stored)" if self.layout >= 2 and ip.implied_filter() else "")
                + "".join(f"; {cols} only where {g}" for g, cols in ip.guards))

    # ---- planning -------------------------------------------------------------------

    def _any_sharing(self) -> bool:
        return self.share_indexes if isinstance(self.share_indexes, bool) else True

    def _shares(self, node: Node) -> bool:
        """Whether the readers of ``node``'s stream share one index per key."""
        if isinstance(self.share_indexes, bool):
            return self.share_indexes
        name = node.name if isinstance(node, SourceNode) else node.label
        return self.share_indexes.get(name, True)

    def _check_sharing_names(self, what: str) -> None:
        if isinstance(self.share_indexes, bool):
            return
        known = {n.name if isinstance(n, SourceNode) else n.label for n in self.graph.nodes}
        unknown = sorted(set(self.share_indexes) - known)
        if unknown:
            raise SchemaMismatchError(
                f"{what}: share_indexes names {unknown}, which are neither sources nor "
                f"operators of it (known: {sorted(known)})")

    def _plan_indexes(self) -> None:
        plans: dict[tuple[Any, ...], IndexPlan] = {}
        cols = self.columns

        def reader(node: Node, pos: int, inp: Node, key: tuple[str, ...], strip: bool) -> None:
            base, steps, bkey = inp, [], list(key)
            needs = set(cols[inp.id])
            above: list[set[str]] = []  # per step (reader first): the needs above it
            while strip and self._any_sharing():
                if isinstance(base, FilterNode):
                    steps.append(("filter", base.expr))
                elif isinstance(base, ProjectNode) and (picks := base.column_picks()):
                    m = dict(picks)
                    steps.append(("rename", picks))
                    bkey = [m[k] for k in bkey]
                else:
                    break
                above.append(needs)
                needs = base.input_needs(needs)[0]
                base = base.inputs[0]
            shared = self._shares(base)
            if not shared:
                base, steps, bkey, above = inp, [], list(key), []
                needs = set(cols[inp.id])
            steps.reverse()
            leading = []
            for kind, arg in steps:
                if kind != "filter":
                    break
                leading.append(arg)
            rest = above[len(steps) - len(leading)] if leading else needs
            conj = None
            if leading:
                conj = leading[0]
                for e in leading[1:]:
                    conj = conj & e
            ident: tuple[Any, ...] = (base.id, tuple(bkey)) if shared else (node.id, pos)
            ip = plans.get(ident)
            if ip is None:
                ip = plans[ident] = IndexPlan(base, tuple(bkey),
                                              owner="" if shared else f"{node.label}-{pos}")
            ip.readers.append(f"{node.label}[{pos}]")
            ip.reader_filters.append(conj)
            ip.reader_needs.append(set(needs))
            ip.reader_rest.append(set(rest))
            ip.columns |= needs | set(bkey)
            self.readers[(node.id, pos)] = Reader(ip, tuple(steps), cols[inp.id])

        for node in self.graph.nodes:
            if node.id not in cols:
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
                            "type than the second leg's does; cast the keys to one type")
                self._set_plan(node, list(range(len(node.inputs))), plan)
        self.indexes = list(plans.values())
        for ip in self.indexes:
            base = ip.base
            if not ip.owner:
                ip.settle_predicate()
                if self.layout >= 2 and ip.implied_filter():
                    self._skip_implied_filters(ip)
            if isinstance(base, SourceNode) and base.unique_key:
                ip.columns |= set(base.unique_key)
            if not ip.owner:
                keep = set(ip.key) | set(getattr(base, "unique_key", None) or ())
                for f in ip.reader_filters:
                    if f is not None:
                        keep |= references(base.schema, f)
                ip.settle_guards(base.schema, keep)
            missing = ip.columns - set(cols[base.id])
            if missing:  # needed_columns guarantees this; a bug otherwise
                msg = f"internal: index of {base.label} needs {missing} its stream lacks"
                raise SchemaMismatchError(msg)

    def _skip_implied_filters(self, ip: IndexPlan) -> None:
        """Readers of ``ip`` skip their leading filters, which its predicate applies.

        The index stores the key and what the readers read above those filters; the
        columns only the filters read are dropped.
        """
        ip.columns = set(ip.key).union(*ip.reader_rest)
        ip.reader_needs = [set(r) for r in ip.reader_rest]
        for r in self.readers.values():
            if r.plan is ip:
                lead = next((i for i, (kind, _) in enumerate(r.chain) if kind != "filter"),
                            len(r.chain))
                r.chain = r.chain[lead:]

    def _set_plan(self, node: JoinNode | JoinAllNode, positions: list[int],
                  plan: list[KeyColumn]) -> None:
        for pos in positions:
            ip = self.readers[(node.id, pos)].plan
            if ip.plan is None:
                ip.plan = plan
            elif ip.plan != plan:
                raise SchemaMismatchError(
                    f"{node.label}: its input {pos} shares the index of {ip.base.label} on "
                    f"{list(ip.key)} with another operator that compares those keys as "
                    f"{[k.common for k in ip.plan]}, this one as {[k.common for k in plan]}; "
                    "cast the key columns to one type")
            self.codecs[(node.id, pos)] = KeyCodec(list(node.key(pos)), plan, node.label)

