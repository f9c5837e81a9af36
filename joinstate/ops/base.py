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

:class:`OperatorBase` holds what every operator shares (its node, columns and schema,
row consolidation); an operator without state of its own inherits its no-op defaults.
"""

from __future__ import annotations

import abc
import contextlib
import functools
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from joinstate.codec import RowCodec
from joinstate.errors import ExpressionError
from joinstate.keys import row_hash
from joinstate.schema import WEIGHT
from joinstate.zset import consolidate

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from joinstate._index import Index
    from joinstate.db import Database
    from joinstate.nodes import Node
    from joinstate.physical import IndexPlan, PhysicalPlan
    from joinstate.transaction import Transaction

__all__ = ["Delta", "Operator", "OperatorBase", "PushContext", "as_schema"]

Delta = tuple[pa.Table, np.ndarray]
"""A change set inside a push: rows (the node's needed columns) and their weights."""


class PushContext:
    """What one push (or the pipeline's creation) gives every operator it runs.

    ``txn``: the push's transaction; ``scratch``: per-push memos operators share (the
    masks of sibling filters evaluated together), dropped when the push ends.
    """

    __slots__ = ("_indexes", "blame", "pipeline", "scratch", "staged", "txn")

    def __init__(self, txn: Transaction, indexes: Mapping[int, Index], pipeline: str,
                 blame: str) -> None:
        self.txn = txn
        self._indexes = indexes
        self.pipeline = pipeline
        self.blame = blame
        self.scratch: dict[object, object] = {}
        self.staged: set[int] = set()
        """Ids of the index plans already staged in this push."""

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
        batch = idx.prepare(table.select(plan.stored_columns).append_column(
            pa.field(WEIGHT, pa.int64()), pa.array(w, pa.int64())))
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

    def consolidated(self, parts: list[Delta]) -> Delta | None:
        """The non-empty ``parts`` concatenated and consolidated (None if nothing is left)."""
        parts = [p for p in parts if len(p[1])]
        if not parts:
            return None
        table = pa.concat_tables([t for t, _ in parts])
        w = np.concatenate([w for _, w in parts])
        idx, sums = self.consolidate(table, w)
        return table.take(pa.array(idx)), sums


def as_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``, or as it is when it already has it.

    A cast costs ~5 us per column even when nothing changes, and most pushes are small.
    """
    return table if table.schema.equals(schema) else table.cast(schema)
