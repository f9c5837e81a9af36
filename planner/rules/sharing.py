"""Whether operator inputs reading one stream on one key share an index.

A shared index stores what its readers need once: every row some reader passes (the
OR of their filters; every row if one reader does not filter) and each column only on
rows a reader of that column passes.  Per-reader indexes store, for each reader, the
rows its filters pass with its columns.  So sharing saves bytes and writes when readers
overlap (three joins reading the whole customer table: one index instead of three), and
costs little when their filters split the stream (q4's six ``year_total`` legs: each
row is stored once either way); a reader of a shared index also reads, at each key it
probes, the rows only other readers need (``read_amplification``).  The rule compares
estimated bytes:

    shared     = R x (entry + key + filter columns) + sum over other columns c of
                 width(c) x min(R, rows of the readers of c)
    per-reader = sum over readers r of rows(r) x (entry + key + width(r's columns))

where ``R`` is the stream's rows if some reader does not filter, else the sum of the
readers' rows (filters assumed disjoint: an upper bound), ``entry`` the per-entry
overhead of an index (:data:`ENTRY_BYTES`: hash prefix, row hash, sequence, count) and
widths come from the column types (:func:`width`).  It shares when ``shared <=
per-reader``.  An unfiltered reader needs every row of the stream; a filtered reader's
rows come from the figures recorded by an earlier population (rows of change per
operator); unknown rows keep the index shared (the pipeline's default).

Each input gets its own decision (subject: ``<stream>[<key>]``); the root decision is
the pipeline's setting that applies them, as ``Pipeline(share_indexes=...)`` takes it:
``True``, or ``{stream: False}`` for the streams whose every input is better read
through per-reader indexes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from planner.rule import Decision
from planner.rules._text import rows, times

if TYPE_CHECKING:
    from planner.context import PlanContext, ShareGroup

__all__ = ["ENTRY_BYTES", "IndexSharing", "VARIABLE_WIDTH", "group_subject", "width"]

TOPIC = "sharing"
ENTRY_BYTES = 40
"""Bytes an index entry costs besides its key and columns (8-byte key-hash prefix,
16-byte row hash, 8-byte batch sequence, 8-byte count)."""
VARIABLE_WIDTH = 16
"""Bytes counted for a string or binary value (offset plus a short value)."""

_FIXED = [
    (re.compile(r"^(bool|int8|uint8)$"), 1),
    (re.compile(r"^(int16|uint16|halffloat)$"), 2),
    (re.compile(r"^(int32|uint32|float|date32|time32.*)$"), 4),
    (re.compile(r"^(int64|uint64|double|date64|time64.*|timestamp.*|duration.*)$"), 8),
    (re.compile(r"^decimal(128)?\("), 16),
    (re.compile(r"^decimal256\("), 32),
    (re.compile(r"^fixed_size_binary\[(\d+)\]$"), -1),
]


def width(type_name: str | None) -> int:
    """Bytes of one value of the Arrow type spelled ``type_name`` (an estimate).

    >>> width("int64"), width("decimal128(7, 2)"), width("string"), width(None)
    (8, 16, 16, 8)
    """
    if type_name is None:
        return 8
    t = type_name.strip()
    for pattern, size in _FIXED:
        m = pattern.match(t)
        if m:
            return int(m.group(1)) if size < 0 else size
    return VARIABLE_WIDTH


def group_subject(stream: str, key: tuple[str, ...]) -> str:
    """The subject of a sharing decision: ``<stream>[<key columns>]``."""
    return f"{stream}[{','.join(key)}]"


class IndexSharing:
    """Decide, per shareable input, a shared index or one per reader.

    >>> from planner.context import PlanContext, ReaderShape, ShareGroup, StreamShape
    >>> from planner.stats import given
    >>> streams = {"union9": StreamShape("union9", "union", (), ("id", "y", "v"),
    ...                                  ("int64", "int32", "double")),
    ...            "f1": StreamShape("f1", "filter", ("union9",), ("id", "y", "v")),
    ...            "f2": StreamShape("f2", "filter", ("union9",), ("id", "y", "v"))}
    >>> def reader(name, stream, filtered):
    ...     return ReaderShape(name, stream, ("id", "v"), filtered, ("y",) if filtered else ())
    >>> split = ShareGroup("union9", ("id",), (reader("j[0]", "f1", True),
    ...                                      reader("j[1]", "f2", True)), ("id", "y", "v"))
    >>> ctx = PlanContext("pipeline", "p", {}, share_groups=(split,), streams=streams,
    ...                   stream_rows={"union9": 600, "f1": 100, "f2": 100})
    >>> d = IndexSharing().apply(ctx)[0]
    >>> d.choice, d.figures["shared_bytes"], d.figures["per_reader_bytes"]
    ('per-reader', 12000, 11200)
    """

    name = "sharing"

    def apply(self, context: PlanContext) -> list[Decision]:
        """One decision per shareable input with two readers or more, then the switch."""
        out = []
        totals = {"shared": 0, "per-reader": 0}
        unknown = []
        verdicts: dict[str, list[bool]] = {}
        for g in context.share_groups:
            if len(g.readers) < 2:
                continue
            d = self._one(context, g)
            out.append(d)
            verdicts.setdefault(g.stream, []).append(d.choice == "per-reader")
            if d.figures.get("per_reader_bytes") is None:
                unknown.append(d.subject)
            else:
                totals["shared"] += d.figures["shared_bytes"]
                totals["per-reader"] += d.figures["per_reader_bytes"]
        if not out:
            return out
        split = sorted(s for s, v in verdicts.items() if all(v))
        choice: bool | dict[str, bool] = {s: False for s in split} if split else True
        reason = ("per-reader indexes for " + ", ".join(split) if split else
                  "every input shared")
        reason += (f"; over the inputs of known sizes: shared ~{totals['shared']:,} bytes, "
                   f"per-reader ~{totals['per-reader']:,}")
        if unknown:
            reason += f"; {len(unknown)} input(s) of unknown reader sizes stay shared"
        reason += f" (the pipeline is built with share_indexes={context.share_indexes})"
        out.append(Decision(TOPIC, context.name, choice, reason,
                            {**totals, "unknown": unknown,
                             "current": context.share_indexes}, self.name))
        return out

    def _one(self, context: PlanContext, g: ShareGroup) -> Decision:
        subject = group_subject(g.stream, g.key)
        base = context.streams.get(g.stream)
        n = context.rows(g.stream)

        def w_of(cols: tuple[str, ...] | set[str]) -> int:
            return sum(width(base.type_of(c) if base else None) for c in cols)

        key = tuple(g.key)
        figures: dict[str, Any] = {"stream_rows": n, "readers": {},
                                   "indexes": list(g.indexes)}
        missing = []
        reader_rows: dict[str, int] = {}
        for r in g.readers:
            nr = n if not r.filtered else context.rows(r.stream)
            figures["readers"][r.name] = {"rows": nr, "filtered": r.filtered,
                                          "columns": list(r.columns)}
            if nr is None:
                missing.append(r.name)
            else:
                reader_rows[r.name] = nr
        if (n is None and any(not r.filtered for r in g.readers)) or missing:
            figures.update(shared_bytes=None, per_reader_bytes=None)
            what = (f"rows of {g.stream} unknown" if not missing else
                    f"rows of filtered reader(s) {', '.join(missing)} unknown (no recorded "
                    "population)")
            return Decision(TOPIC, subject, "shared", f"{what}: one shared index (one write "
                            "per change)", figures, self.name)
        total = sum(reader_rows.values())
        unfiltered = any(not r.filtered for r in g.readers)
        if unfiltered:
            assert n is not None  # checked above
            stored = n
        else:
            stored = total if n is None else min(n, total)
        always = set(key) | {c for r in g.readers for c in r.filter_columns}
        shared_bytes = stored * (ENTRY_BYTES + w_of(always))
        for c in sorted({c for r in g.readers for c in r.columns} - always):
            users = [r for r in g.readers if c in r.columns]
            kept = stored if any(not r.filtered for r in users) else min(
                stored, sum(reader_rows[r.name] for r in users))
            shared_bytes += kept * w_of({c})
        per_reader = sum(
            reader_rows[r.name] * (ENTRY_BYTES + w_of(set(key) | set(r.columns)))
            for r in g.readers)
        amplification = {r.name: round(stored / max(reader_rows[r.name], 1), 2)
                         for r in g.readers}
        figures.update(stored_rows=stored, shared_bytes=shared_bytes,
                       per_reader_bytes=per_reader, read_amplification=amplification)
        if shared_bytes <= per_reader:
            return Decision(TOPIC, subject, "shared", f"{len(g.readers)} readers need "
                            f"{rows(total)} rows in all, a shared index stores "
                            f"{rows(stored)}: ~{shared_bytes:,} bytes vs ~{per_reader:,} per "
                            "reader", figures, self.name)
        return Decision(TOPIC, subject, "per-reader", f"{len(g.readers)} readers need "
                        f"{rows(total)} rows in all, a shared index stores {rows(stored)}: "
                        f"per-reader indexes ~{per_reader:,} bytes vs ~{shared_bytes:,} "
                        f"shared ({times(shared_bytes / max(per_reader, 1))})", figures,
                        self.name)
