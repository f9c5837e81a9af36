"""Names of a pipeline's state in SQL terms: ``store_sales ⋈ date_dim by ss_customer_sk``.

A pipeline's column families are named after operator ids (``ix.q4~join3[ss_customer_sk]``,
``agg[q4~agg5]``): stable and unique, but meaningless on a chart.  :func:`state_labels`
rewrites each one from the graph that made it: a source is its name, a join the ``⋈`` of
its inputs, an aggregate what it groups and by which columns, an output its name; an
index says which key it is kept on.  Derived from the nodes, so it serves any graph (a
SQL view as well as q4), not a table written by hand for one query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from joinstate.names import pipeline_aggregate_of, pipeline_index_of, source_rows_of
from joinstate.nodes import (
    AggNode,
    FilterNode,
    JoinAllNode,
    JoinNode,
    ProjectNode,
    SourceNode,
    UnionNode,
    WindowNode,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from joinstate.graph import Graph
    from joinstate.nodes import Node

__all__ = ["state_labels"]

_JOIN_SIGN = {"inner": "⋈", "left": "⟕", "right": "⟖", "full": "⟗", "left_semi": "⋉",
              "left_anti": "▷"}


def _columns(cols: Iterable[str], at_most: int = 2) -> str:
    """``a, b`` or, for many columns, ``a, …, z (8 columns)``: titles stay one line."""
    cols = list(cols)
    if len(cols) <= at_most:
        return ", ".join(cols)
    return f"{cols[0]}, …, {cols[-1]} ({len(cols)} columns)"


def state_labels(graph: Graph, pipeline: str, families: Iterable[str]) -> dict[str, str]:
    """``{column family: label}`` for the families of ``pipeline`` among ``families``.

    Families that are not the pipeline's (or name an operator the graph lacks) are left
    out, so a caller falls back to the raw name.  ``.nulls``/``.deg``/``.minmax``
    families are labelled by the index or aggregate they belong to.
    """
    by_label: dict[str, Node] = {n.label: n for n in graph.nodes}
    output_of = {n.id: name for name, n in graph.outputs.items()}
    memo: dict[int, str] = {}

    def text(n: Node) -> str:
        if n.id in memo:
            return memo[n.id]
        if n.id in output_of:
            out = output_of[n.id]
        elif isinstance(n, SourceNode):
            out = n.name
        elif isinstance(n, JoinNode):
            out = f"{text(n.inputs[0])} {_JOIN_SIGN.get(n.how, '⋈')} {text(n.inputs[1])}"
        elif isinstance(n, JoinAllNode):
            out = f"{' ⋈ '.join(n.legs[:2])} ⋈ … ({len(n.legs)} legs on {n.keys[0]})"
        elif isinstance(n, AggNode):
            by = f" by {_columns(n.keys)}" if n.keys else ""
            out = f"{text(n.inputs[0])} grouped{by}"
        elif isinstance(n, FilterNode):
            out = f"{text(n.inputs[0])} (filtered)"
        elif isinstance(n, ProjectNode):
            out = text(n.inputs[0])  # a projection keeps the rows it reads
        elif isinstance(n, UnionNode):
            out = " \N{UNION} ".join(text(i) for i in n.inputs)
        elif isinstance(n, WindowNode):
            out = f"{text(n.inputs[0])} windowed"
        else:
            out = n.label
        memo[n.id] = out
        return out

    def reader_text(reader: str) -> str:
        op, _, pos = reader.rpartition("-")
        node = by_label.get(op)
        if isinstance(node, JoinAllNode) and pos.isdigit() and int(pos) < len(node.legs):
            return f"leg {node.legs[int(pos)]}"
        if isinstance(node, JoinNode) and pos in ("0", "1"):
            return f"the {('left', 'right')[int(pos)]} side of {text(node)}"
        return f"input {pos} of {text(node)}" if node is not None else reader

    labels: dict[str, str] = {}
    for cf in families:
        base = cf
        for suffix in (".nulls", ".deg", ".minmax"):
            if cf.endswith(suffix):
                base = cf[: -len(suffix)]
        index = pipeline_index_of(base, pipeline)
        if index is not None:
            stream, reader, key = index
            node = by_label.get(stream)
            if node is None:
                continue
            label = f"{text(node)} by {_columns(key)}"
            labels[cf] = label + (f", for {reader_text(reader)}" if reader else "")
            continue
        agg = pipeline_aggregate_of(base, pipeline)
        if agg is not None and agg in by_label:
            labels[cf] = f"aggregate: {text(by_label[agg])}"
            continue
        rows = source_rows_of(base)
        if rows is not None and rows[0] == pipeline:
            labels[cf] = f"{rows[1]}: row record"
    return labels
