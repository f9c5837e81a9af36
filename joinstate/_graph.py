"""The operator graph of a pipeline: nodes, their schemas, and the columns each needs.

A node is created by the public :class:`joinstate.Stream` methods and never changes.
Node ids follow creation order, so every input has a smaller id than its consumer and
ascending ids are a topological order.  :func:`needed_columns` walks the graph backwards
from the outputs: a node's change sets carry only the columns something downstream
reads, and an index stores only what its readers need (Feldera's projection of shared
state), which keeps values small and RocksDB writes cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from joinstate._expr import references
from joinstate.errors import SchemaMismatchError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "AggNode",
    "FilterNode",
    "JoinAllNode",
    "JoinNode",
    "Node",
    "ProjectNode",
    "SourceNode",
    "UnionNode",
    "needed_columns",
]


@dataclass(eq=False)
class Node:
    """One operator; ``schema`` is its declared output (without ``_weight``)."""

    id: int
    inputs: tuple[Node, ...]
    schema: pa.Schema

    kind = "node"

    @property
    def label(self) -> str:
        """A stable name for column families and messages: ``<kind><id>``."""
        return f"{self.kind}{self.id}"

    def spec(self) -> dict[str, Any]:
        """A JSON-able description (stored in the catalog, compared on re-attach)."""
        return {"kind": self.kind, "inputs": [i.id for i in self.inputs],
                "columns": [f"{f.name}: {f.type}" for f in self.schema], **self.params()}

    def params(self) -> dict[str, Any]:
        """Operator-specific fields of :meth:`spec`."""
        return {}

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Columns each input must carry so that this node can produce ``need``."""
        return [set(need) for _ in self.inputs]


@dataclass(eq=False)
class SourceNode(Node):
    """A named input of the pipeline; changes are pushed to it."""

    name: str = ""
    unique_key: tuple[str, ...] | None = None
    retractions: str = "checked"
    """``checked``: a retraction of a row the source does not hold is refused;
    ``unchecked``: trusted, only the indexes check what they hold."""
    kind = "source"

    @property
    def label(self) -> str:
        """Sources are named by the user."""
        return self.name

    def params(self) -> dict[str, Any]:
        """Name, unique key and how retractions are checked."""
        return {"name": self.name,
                "unique_key": None if self.unique_key is None else list(self.unique_key),
                "retractions": self.retractions}


@dataclass(eq=False)
class FilterNode(Node):
    """Rows of the input for which ``expr`` is true."""

    expr: pc.Expression = field(default_factory=lambda: pc.scalar(True))
    kind = "filter"

    def params(self) -> dict[str, Any]:
        """The predicate's text."""
        return {"expr": str(self.expr)}

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """The output's needs plus what the predicate reads."""
        return [set(need) | references(self.inputs[0].schema, self.expr)]


@dataclass(eq=False)
class ProjectNode(Node):
    """One expression per output column, over the input's columns."""

    exprs: tuple[pc.Expression, ...] = ()
    kind = "project"

    def params(self) -> dict[str, Any]:
        """Each output column's expression."""
        return {"exprs": [str(e) for e in self.exprs]}

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """What the needed output columns' expressions read."""
        src = self.inputs[0].schema
        out: set[str] = set()
        for f, e in zip(self.schema, self.exprs, strict=True):
            if f.name in need:
                out |= references(src, e)
        return [out]


@dataclass(eq=False)
class UnionNode(Node):
    """Bag union (SQL ``UNION ALL``) of inputs with equal column names and types."""

    kind = "union"


@dataclass(eq=False)
class JoinNode(Node):
    """A binary equi-join.

    ``out_left``/``out_right`` are the output names of the inputs' columns (suffixed
    where they collide).
    """

    left_key: tuple[str, ...] = ()
    right_key: tuple[str, ...] = ()
    how: str = "inner"
    suffixes: tuple[str, str] = ("", "_right")
    out_left: tuple[str, ...] = ()
    out_right: tuple[str, ...] = ()
    kind = "join"

    def params(self) -> dict[str, Any]:
        """Keys, how, suffixes."""
        return {"left_key": list(self.left_key), "right_key": list(self.right_key),
                "how": self.how, "suffixes": list(self.suffixes)}

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Each side's columns that appear in ``need``, plus its key."""
        left, right = self.inputs
        ln = {c for c, o in zip(left.schema.names, self.out_left, strict=True) if o in need}
        rn = ({c for c, o in zip(right.schema.names, self.out_right, strict=True) if o in need}
              if self.out_right else set())  # semi/anti joins output no right column
        return [ln | set(self.left_key), rn | set(self.right_key)]


@dataclass(eq=False)
class AggNode(Node):
    """``group_by(keys).aggregate(...)``: ``aggs`` are (name, function, argument)."""

    keys: tuple[str, ...] = ()
    aggs: tuple[tuple[str, str, pc.Expression | None], ...] = ()
    kind = "agg"

    def params(self) -> dict[str, Any]:
        """Group keys and aggregates."""
        return {"keys": list(self.keys),
                "aggs": [[n, f, None if e is None else str(e)] for n, f, e in self.aggs]}

    def input_needs(self, need: set[str]) -> list[set[str]]:
        """Group keys and what every aggregate argument reads."""
        src = self.inputs[0].schema
        out = set(self.keys)
        for _, _, e in self.aggs:
            if e is not None:
                out |= references(src, e)
        return [out]


@dataclass(eq=False)
class JoinAllNode(Node):
    """An inner join of several legs on one common key (a delta join: no state of its own)."""

    legs: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    kind = "joinall"

    def params(self) -> dict[str, Any]:
        """Leg names and each leg's key column."""
        return {"legs": list(self.legs), "keys": list(self.keys)}

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


def needed_columns(nodes: Sequence[Node], outputs: Sequence[Node]) -> dict[int, list[str]]:
    """For every node that feeds an output, the columns its change sets must carry.

    Outputs carry all their columns.  A node is absent from the result if no output
    depends on it (its changes are never computed).  Never empty: a node whose rows
    matter but none of its columns (``count(*)`` over it) keeps its first column, so
    a change set always has a column to hold its rows.
    """
    need: dict[int, set[str]] = {}
    for node in outputs:
        need[node.id] = set(node.schema.names)
    for node in sorted(nodes, key=lambda n: n.id, reverse=True):
        if node.id not in need:
            continue
        if isinstance(node, SourceNode) and node.unique_key:
            need[node.id] |= set(node.unique_key)
        if not need[node.id]:
            need[node.id] = {node.schema.names[0]}
        for inp, cols in zip(node.inputs, node.input_needs(need[node.id]), strict=True):
            need.setdefault(inp.id, set()).update(cols)
    by_id = {n.id: n for n in nodes}
    out = {}
    for nid, cols in need.items():
        names = by_id[nid].schema.names
        unknown = cols - set(names)
        if unknown:  # a bug in an input_needs, not a user error
            msg = f"internal: node {by_id[nid].label} asked for missing columns {unknown}"
            raise SchemaMismatchError(msg)
        out[nid] = [n for n in names if n in cols]
    return out
