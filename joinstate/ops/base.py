"""The one contract every pipeline operator implements, and what a push hands it.

An operator is built from its node and the physical plan (:mod:`joinstate.physical`):
the plan already says which columns its change sets carry, which indexes its inputs
read through which readers, and how its keys compare.  It declares its state: the
indexes it probes (:meth:`Operator.reads`; they belong to the plan, shared between
operators, and are opened and written by the runtime) and the column families of its
own (:meth:`Operator.open` creates them, :meth:`Operator.column_families` names them).
A push hands it its inputs' change sets (``None`` for an input that did not change) and
a :class:`PushContext`; it returns its output's change set, staging any write into the
push's one transaction through the context, so a failure anywhere changes nothing.
Reads see the state before the push, which is what the delta rules assume.

Operators whose reads grow with the change (a join probing its inputs' indexes per
changed key, a window re-reading each touched partition) have two ways to read: by key
(``incremental``: point reads, prefix iterations, or the index's own probe cache) and by
one scan of the whole index with one hash lookup of the changed keys (``recompute``:
:func:`scan_probe`).  Both return the same entries, so the operator computes the
same change set from them and stages the same writes; which one runs is chosen per push
and per operator (:class:`Strategies`, by label), and every operator's run is timed
(:meth:`PushContext.run`) so that a planner can learn what each way costs.

:class:`OperatorBase` holds what every operator shares (its node, columns and schema,
row consolidation); an operator without state of its own inherits its no-op defaults.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate._probe import Entries
from joinstate.codec import RowCodec
from joinstate.errors import ExpressionError, SchemaMismatchError
from joinstate.keys import row_hash
from joinstate.zset import consolidate

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from joinstate._bytes import Bytes
    from joinstate._index import Index
    from joinstate.db import Database
    from joinstate.nodes import Node
    from joinstate.physical import IndexPlan, PhysicalPlan
    from joinstate.transaction import Transaction

__all__ = ["STRATEGIES", "Delta", "IndexedOperator", "Operator", "OperatorBase", "OperatorRun",
           "PushContext", "Strategies", "Strategy", "as_schema", "cancel_rows", "scan_probe"]

Delta = tuple[pa.Table, np.ndarray]
"""A change set inside a push: rows (the node's needed columns) and their weights."""

Strategy = Literal["incremental", "recompute"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


@dataclass
class OperatorRun:
    """What one operator did in one push: its path, the rows it got, what it read, ms.

    ``rows_in``: rows of its inputs' change sets (with multiplicity); ``rows_out``: rows
    of its output's (with multiplicity: a join's partner rows show here); ``keys`` and
    ``found``: distinct keys it looked up in indexes and the entries those lookups
    returned (either path: what a per-key read pays for); ``scanned_rows``
    and ``scan_ms``: rows its recompute path read by whole-index scans and the time
    spent reading them (0 on the incremental path); ``ms``: its whole push.
    """

    strategy: str
    rows_in: int
    ms: float = 0.0
    rows_out: int = 0
    keys: int = 0
    found: int = 0
    scanned_rows: int = 0
    scan_ms: float = 0.0


class Strategies:
    """The per-push choice ``{operator label: "incremental" | "recompute"}``, and its runs.

    Operators not named read incrementally.  :attr:`runs` receives, per operator that
    ran in the push, its :class:`OperatorRun` (filled as the push runs, so a failed
    push leaves the runs of the operators that ran before the failure).
    """

    __slots__ = ("choices", "runs")

    def __init__(self, choices: Mapping[str, str] | None = None) -> None:
        self.choices: dict[str, str] = dict(choices or {})
        self.runs: dict[str, OperatorRun] = {}

    @classmethod
    def of(cls, given: Strategies | Mapping[str, str] | None) -> Strategies:
        """``given`` as a :class:`Strategies` (a mapping is wrapped; None: all incremental)."""
        return given if isinstance(given, Strategies) else cls(given)

    def check(self, ops: Mapping[str, OperatorBase], what: str) -> None:
        """Refuse a choice naming no operator, an unknown strategy, or a missing path."""
        for label, choice in self.choices.items():
            if choice not in STRATEGIES:
                raise SchemaMismatchError(
                    f"{what}: strategy {choice!r} for operator {label!r} must be one of "
                    f"{STRATEGIES}; nothing was applied")
            op = ops.get(label)
            if op is None:
                raise SchemaMismatchError(
                    f"{what}: strategies name operator {label!r}, which the pipeline does not "
                    f"have (its operators: {sorted(ops)}); nothing was applied")
            if choice == "recompute" and not op.recomputable:
                raise SchemaMismatchError(
                    f"{what}: operator {label!r} has no recompute path (only the joins, "
                    "join_all and windows read their input state by key); choose "
                    "'incremental' for it; nothing was applied")

    def choice(self, label: str) -> str:
        """The path chosen for operator ``label``."""
        return self.choices.get(label, "incremental")


class PushContext:
    """What one push (or the pipeline's creation) gives every operator it runs.

    ``txn``: the push's transaction; ``scratch``: per-push memos operators share (the
    masks of sibling filters evaluated together), dropped when the push ends.
    """

    __slots__ = ("_indexes", "_run", "blame", "pipeline", "scratch", "staged", "strategies",
                 "txn")

    def __init__(self, txn: Transaction, indexes: Mapping[int, Index], pipeline: str,
                 blame: str, strategies: Strategies | None = None) -> None:
        self.txn = txn
        self._indexes = indexes
        self.pipeline = pipeline
        self.blame = blame
        self.scratch: dict[object, object] = {}
        self.staged: set[int] = set()
        """Ids of the index plans already staged in this push."""
        self.strategies = strategies if strategies is not None else Strategies()
        self._run: OperatorRun | None = None

    def run(self, op: OperatorBase, ins: list[Delta | None]) -> Delta | None:
        """``op.push(ins, self)`` on the path chosen for it, timed into :attr:`strategies`."""
        label = op.node.label
        rows_in = sum(int(np.abs(d[1]).sum()) for d in ins if d is not None)
        run = self._run = OperatorRun(self.strategies.choice(label), rows_in)
        t0 = time.perf_counter()
        try:
            out = op.push(ins, self)
            if out is not None:
                run.rows_out = int(np.abs(out[1]).sum())
            return out
        finally:
            run.ms = (time.perf_counter() - t0) * 1e3
            self.strategies.runs[label] = run
            self._run = None

    def recomputes(self, op: OperatorBase) -> bool:
        """Whether ``op`` reads by whole-index scans in this push."""
        return self.strategies.choice(op.node.label) == "recompute"

    def probe(self, op: OperatorBase, index: Index, qcanon: Bytes, qhash: np.ndarray
              ) -> Entries:
        """``index.probe(qcanon, qhash)``, read the way ``op``'s path says.

        Incremental: the index's probe (point reads, prefix iterations, or its probe
        cache).  Recompute: :func:`scan_probe`, one scan of the whole index; an index
        already holding its probe cache is probed there (nothing to scan).  The same
        entries either way: one per distinct stored row, weights summed.
        """
        run = self._run
        if run is not None:
            run.keys += len(qhash)
        if not self.recomputes(op) or index.cache is not None or not len(qhash):
            found = index.probe(qcanon, qhash)
        else:
            t0 = time.perf_counter()
            found = scan_probe(index, qcanon)
            if run is not None:
                run.scanned_rows += index.rows
                run.scan_ms += (time.perf_counter() - t0) * 1e3
        if run is not None:
            run.found += len(found.w)
        return found

    def index(self, plan: IndexPlan) -> Index:
        """The opened index of ``plan``."""
        return self._indexes[id(plan)]

    def stage(self, plan: IndexPlan, delta: Delta) -> None:
        """Stage a change to ``plan``'s stream into its index (the rows it keeps)."""
        self.staged.add(id(plan))
        idx = self.index(plan)
        table, w = plan.rows_to_store(*delta)
        if not table.num_rows:
            return
        batch = idx.prepare_rows(table.select(plan.stored_columns),
                                 np.ascontiguousarray(w, dtype=np.int64))
        if batch.rows:
            idx.stage(batch, self.txn)
            self.txn.after_commit(functools.partial(idx.after_write, batch))

    @contextlib.contextmanager
    def expression_errors(self, what: str | Callable[[], str]) -> Iterator[None]:
        """Arrow's errors from evaluating an expression on pushed rows, named.

        ``what`` names what was evaluated (a callable: computed only if it failed).
        """
        try:
            yield
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            text = what if isinstance(what, str) else what()
            raise ExpressionError(
                f"pipeline {self.pipeline!r}, {text}: an expression failed on the rows of "
                f"{self.blame}: {exc}; nothing was applied (widen the types or guard the "
                "expression, e.g. with if_else / CASE)") from exc


class Operator(Protocol):
    """A pipeline operator: one node's change, computed from its inputs' changes."""

    node: Node

    def reads(self) -> list[IndexPlan]:
        """The indexes its pushes probe (owned by the plan, opened by the runtime)."""

    def open(self, store: Database, pipeline: str) -> None:
        """Open (creating if need be) the state of its own in ``store``."""

    def column_families(self) -> tuple[str, ...]:
        """The column families of its own state (after :meth:`open`)."""

    def initial(self) -> Delta | None:
        """Its change at the pipeline's creation, over empty sources (usually None)."""

    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """Its output's change for its inputs' changes (``None`` where one is unchanged)."""


class OperatorBase(abc.ABC):
    """The common part of operators: node, columns, schema, consolidation; no state."""

    def __init__(self, node: Node, plan: PhysicalPlan) -> None:
        self.node = node
        self.plan = plan
        self.columns: list[str] = plan.columns[node.id]
        self.schema: pa.Schema = plan.schemas[node.id]
        self._codec: RowCodec | None = None
        self._input_codecs: dict[int, RowCodec] = {}

    def reads(self) -> list[IndexPlan]:
        """No index."""
        return []

    def open(self, store: Database, pipeline: str) -> None:  # noqa: B027 - a default
        """No state of its own."""

    def column_families(self) -> tuple[str, ...]:
        """No state of its own."""
        return ()

    def initial(self) -> Delta | None:
        """Nothing at creation."""
        return None

    def own_indexes(self) -> list[Index]:
        """Indexes of its own state (verified, saved and settled by the runtime)."""
        return []

    recomputable: bool = False
    """Whether it has a recompute path (reads its input state by whole-index scans)."""

    def scanned_indexes(self, indexes: Mapping[int, Index], changed: Sequence[bool]
                        ) -> list[Index]:
        """The indexes its recompute path scans when the inputs ``changed`` change.

        ``indexes``: the runtime's opened indexes, by id of their plan.
        """
        return []

    def explain_state(self) -> list[str]:
        """Lines ``explain`` shows about its own state and what a push costs."""
        return []

    @abc.abstractmethod
    def push(self, ins: list[Delta | None], ctx: PushContext) -> Delta | None:
        """Its output's change for its inputs' changes (see :class:`Operator`)."""

    def consolidate(self, table: pa.Table, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row positions of the distinct rows of ``table`` and their summed weights."""
        if self._codec is None:
            self._codec = RowCodec(self.schema)
        enc = self._codec.encode(table)
        return consolidate(row_hash(enc), enc, w,
                           f"{self.node.label}: the summed weight of a row")

    def cancelled(self, ins: list[Delta | None]) -> list[Delta | None]:
        """``ins`` with each change that both retracts and inserts consolidated.

        A dimension row rewritten in a column that a filter keeps true and a projection
        then drops arrives as ``-X, +X``: consolidated, it is nothing, where probed it
        would fan out to every matching row of the other side twice (a date touches
        thousands of sales).  A change that only inserts (a population) or only retracts
        cannot cancel and is passed as it is, unhashed.
        """
        out: list[Delta | None] = []
        for pos, d in enumerate(ins):
            if d is None:
                out.append(d)
                continue
            table, w = d
            kept = self.cancel_rows(pos, table, w)
            if kept is None:
                out.append(d)
                continue
            idx, sums = kept
            out.append(None if not len(sums) else (table.take(pa.array(idx)), sums))
        return out

    def cancel_rows(self, pos: int, table: pa.Table, w: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Input ``pos``'s change consolidated: ``(row positions, summed weights)``.

        None when nothing can cancel or nothing did (the change stays as it is): fewer
        than two rows, or no row retracted or none inserted.
        """
        codec = self._input_codecs.get(pos)
        if codec is None:
            codec = self._input_codecs[pos] = RowCodec(
                self.plan.schemas[self.node.inputs[pos].id])
        return cancel_rows(table, w, codec,
                           f"{self.node.label}: the summed weight of an input row")

    def consolidated(self, parts: list[Delta]) -> Delta | None:
        """The non-empty ``parts`` concatenated and consolidated (None if nothing is left)."""
        parts = [p for p in parts if len(p[1])]
        if not parts:
            return None
        table = pa.concat_tables([t for t, _ in parts])
        w = np.concatenate([w for _, w in parts])
        idx, sums = self.consolidate(table, w)
        return table.take(pa.array(idx)), sums


class IndexedOperator(OperatorBase):
    """An operator whose own state is one index.

    A window keeps its partitions' rows there, a key check its key holders; what the
    runtime asks of that state (the index, its families, its verification) is answered
    here once.
    """

    def __init__(self, node: Node, plan: PhysicalPlan) -> None:
        super().__init__(node, plan)
        self.index: Index | None = None

    def state(self) -> Index:
        """The opened index."""
        assert self.index is not None, "open() the operator first"
        return self.index

    def column_families(self) -> tuple[str, ...]:
        """The index's families."""
        return self.index.column_families() if self.index is not None else ()

    def own_indexes(self) -> list[Index]:
        """The index this operator keeps (the runtime verifies and saves it)."""
        return [self.index] if self.index is not None else []


def cancel_rows(table: pa.Table, w: np.ndarray, codec: RowCodec, what: str
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows of a change consolidated: ``(row positions, summed weights)``.

    None when nothing can cancel or nothing did (the change stays as it is): fewer than
    two rows, or no row retracted or none inserted (a change that cannot cancel is not
    hashed).  A row consolidated is named by its first position.
    """
    if len(w) < 2 or not ((w < 0).any() and (w > 0).any()):
        return None
    enc = codec.encode(table)
    idx, sums = consolidate(row_hash(enc), enc, w, what)
    return None if len(sums) == len(w) else (idx, sums)


def scan_probe(index: Index, qcanon: Bytes) -> Entries:
    """What ``index.probe`` returns for the distinct keys ``qcanon``, by one whole scan.

    Every stored entry is read in one pass (no seek per key), the keys of all of them
    are encoded, and one Arrow hash lookup (``index_in``) tags each with its query (or
    none); only the entries found are consolidated (a bag holds a row inserted by
    several batches as several entries; a probe returns it once, weights summed).  No
    per-row Python, and nothing kept: the index's probe cache is its policy's business.
    """
    rows, w, enc = index.layout.scan()
    if not len(w):
        return Entries(index.schema.empty_table(), np.zeros(0, np.int64), np.zeros(0, np.int64))
    canon, _ = index.key_codec.encode(rows)
    found = pc.index_in(canon.arrow(), value_set=qcanon.arrow())
    q = np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    hit = np.flatnonzero(q >= 0)
    if not len(hit):
        return Entries(rows.slice(0, 0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    henc = enc.take(hit)
    first, sums = consolidate(row_hash(henc), henc, w[hit],
                              f"{index.cf}: the summed weight of a row")
    pick = hit[first]
    return Entries(rows.take(pa.array(pick)), sums, q[pick])


def as_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``, or as it is when it already has it.

    A cast costs ~5 us per column even when nothing changes, and most pushes are small.
    """
    return table if table.schema.equals(schema) else table.cast(schema)
