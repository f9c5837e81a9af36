"""The join rule, written once: what a binary join outputs for a change of its inputs.

Three execution paths compute a join's output change and must agree to the row: a push
into one side of a :class:`~joinstate.Join` (probing the other side's index), the
pipeline's join operator (probing its inputs' indexes, then ``J(new) - J(old)`` over the
changed keys), and ``population.recompute`` (from whole snapshots of both sides).  They
differ in how they read state, not in what a join means; this module is the meaning,
over numpy arrays of key groups and Arrow tables, and each path supplies only its reads.

Rows arrive tagged with a *key group* (``0 .. G-1``, numbered by the caller over the
distinct keys of the change; ``-1`` for a NULL key, which never matches): as
:class:`Entries` (rows, weights, groups) or as rows beside a group array.  Then:

* pairs of rows with equal groups, weighted by the product of their weights (checked:
  the exact product or :class:`~joinstate.WeightOverflowError`);
* a *preserved* input's rows without a partner are output too, null-extended (outer
  joins) or as they are (``left_anti``): :func:`preserves`;
* ``left_semi`` / ``left_anti`` output the left input's rows only, those whose key has a
  right partner (semi) or has none (anti), never the pairs;
* when a push takes an input's per-key *degree* (total weight) across zero, the other
  input's rows of that key change: a preserved other input's null-extended rows
  disappear (0 -> >0) or come back (>0 -> 0); a semi join's left rows appear (0 -> >0)
  or go (>0 -> 0), an anti join's the opposite.  An input whose degree matters so is
  one that must keep per-key degrees: :func:`tracks_degree`;
* output rows are assembled by Arrow ``take`` from the inputs' rows, a missing side
  filled with NULLs.

:meth:`JoinRule.push` is the output of a change to one input against the other (``ΔS ⋈
O`` plus the preserved and crossing terms); :meth:`JoinRule.join` the output of two row
sets against each other (what ``J(new) - J(old)`` evaluates twice).  Both return parts
``(rows, weights)``, unconsolidated; :meth:`JoinRule.table` makes one weighted table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from joinstate._bytes import is_identity
from joinstate._probe import Entries
from joinstate.schema import WEIGHT
from joinstate.zset import checked_mul, checked_sum_by, expand

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Crossings",
    "Delta",
    "Entries",
    "JoinRule",
    "OtherSide",
    "expand",
    "is_semi",
    "preserves",
    "tracks_degree",
]

Delta = tuple[pa.Table, np.ndarray]
"""Rows and their int64 weights (not consolidated)."""

_SEMI = frozenset({"left_semi", "left_anti"})


def is_semi(how: str) -> bool:
    """Whether the join outputs the left input's rows only (``left_semi``, ``left_anti``)."""
    return how in _SEMI


def preserves(how: str, pos: int) -> bool:
    """Whether input ``pos`` (0 left, 1 right)'s rows without a partner are output.

    Null-extended for ``left``/``right``/``full`` joins, as they are for ``left_anti``;
    a row with a NULL key never has a partner.
    """
    if pos == 0:
        return how in ("left", "full", "left_anti")
    return how in ("right", "full")


def tracks_degree(how: str, pos: int) -> bool:
    """Whether the output depends on input ``pos``'s per-key degree crossing zero.

    True when the other input is preserved (its unmatched rows depend on whether this
    input has the key) and for the right input of a semi or anti join (it filters the
    left rows): such an input keeps per-key degrees.
    """
    return preserves(how, 1 - pos) or (pos == 1 and is_semi(how))


class Crossings:
    """Per key group, whether a push took a side's degree from 0 to >0 (``up``) or back."""

    __slots__ = ("down", "up")

    def __init__(self, up: np.ndarray, down: np.ndarray) -> None:
        self.up = up
        self.down = down

    @classmethod
    def of(cls, old: np.ndarray, new: np.ndarray) -> Crossings:
        """From the degrees of every key group before and after the push."""
        return cls((old == 0) & (new > 0), (old > 0) & (new == 0))

    def groups(self) -> np.ndarray:
        """The key groups whose degree crossed zero."""
        return np.flatnonzero(self.up | self.down)


class OtherSide(Protocol):
    """The other input of a push, at the push's key groups, read on demand.

    Each method is called at most once per push, and only when the join type needs it,
    so an implementation reads lazily: e.g. a semi join's left push asks only for
    :meth:`degrees` (a degree index answers by multi-get, no rows read).
    """

    def entries(self) -> Entries:
        """Its rows at every key group of the push (``q``: the group, weights > 0)."""
        ...

    def degrees(self) -> np.ndarray:
        """Its total weight per key group (``G`` values)."""
        ...

    def entries_at(self, groups: np.ndarray) -> Entries:
        """Its rows at least at ``groups`` (more are fine: the caller filters by ``q``)."""
        ...


class JoinRule:
    """One join's rule: its type, its output columns, the label its errors carry.

    ``schema`` holds the output columns (no weight); ``sources[i]`` says where output
    column ``i`` comes from: ``(0, name)`` the left input's column ``name``, ``(1,
    name)`` the right's.  Inputs may carry more columns than the output reads.
    """

    __slots__ = ("how", "label", "schema", "sources", "weighted")

    def __init__(self, how: str, schema: pa.Schema, sources: Sequence[tuple[int, str]],
                 label: str = "") -> None:
        if len(sources) != len(schema):
            msg = f"internal: {len(sources)} column sources for {len(schema)} output columns"
            raise ValueError(msg)
        self.how = how
        self.schema = schema
        self.sources = tuple(sources)
        self.label = label
        self.weighted = schema.append(pa.field(WEIGHT, pa.int64(), nullable=False))

    @classmethod
    def of_sides(cls, how: str, left: pa.Schema, right: pa.Schema, output: pa.Schema,
                 label: str = "") -> JoinRule:
        """The rule of :func:`joinstate.output_schema`'s layout.

        Left columns, then right columns (none for semi and anti joins), then
        ``_weight`` (left out of :attr:`schema`).
        """
        sources = [(0, n) for n in left.names]
        if not is_semi(how):
            sources += [(1, n) for n in right.names]
        fields = [f for f in output if f.name != WEIGHT]
        return cls(how, pa.schema(fields), sources, label)

    # ---- assembly ---------------------------------------------------------------------

    def assemble(self, left: pa.Table | None, right: pa.Table | None, w: np.ndarray) -> Delta:
        """Output rows from aligned left and right rows; a missing side is all NULL."""
        n = len(w)
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for (pos, name), f in zip(self.sources, self.schema, strict=True):
            part = left if pos == 0 else right
            arrays.append(pa.nulls(n, f.type) if part is None else part.column(name))
        return pa.Table.from_arrays(arrays, schema=self.schema), w

    def table(self, parts: Sequence[Delta]) -> pa.Table:
        """The parts as one table with a ``_weight`` column."""
        if not parts:
            return self.weighted.empty_table()
        rows = parts[0][0] if len(parts) == 1 else pa.concat_tables([t for t, _ in parts])
        w = parts[0][1] if len(parts) == 1 else np.concatenate([w for _, w in parts])
        return pa.Table.from_arrays([*rows.columns, pa.array(w, pa.int64())],
                                    schema=self.weighted)

    def _oriented(self, pos: int, mine: pa.Table | None, other: pa.Table | None,
                  w: np.ndarray) -> Delta:
        return self.assemble(mine, other, w) if pos == 0 else self.assemble(other, mine, w)

    def _what(self, what: str) -> str:
        return f"{self.label}: {what}" if self.label else what

    # ---- the rule -----------------------------------------------------------------------

    def pairs(self, rows: pa.Table, w: np.ndarray, group: np.ndarray, other: Entries,
              n_groups: int, pos: int) -> list[Delta]:
        """Every (row, other row) pair with one key group, weighted by the product."""
        ri, ei = expand(group, other.q, n_groups)
        if not len(ri):
            return []
        wo = checked_mul(w[ri], other.w[ei], self._what("the weight of a joined pair"))
        return [self._oriented(pos, _take(rows, ri), _take(other.rows, ei), wo)]

    def unmatched(self, rows: pa.Table, w: np.ndarray, group: np.ndarray,
                  other_degree: np.ndarray, pos: int) -> list[Delta]:
        """Input ``pos``'s rows whose key the other input does not have, null-extended."""
        lone = np.flatnonzero(~_matched(group, other_degree))
        if not len(lone):
            return []
        return [self._oriented(pos, _take(rows, lone), None, w[lone])]

    def semi(self, rows: pa.Table, w: np.ndarray, group: np.ndarray,
             right_degree: np.ndarray) -> list[Delta]:
        """The left rows a semi join keeps (a right partner) or an anti join (none)."""
        hit = _matched(group, right_degree)
        keep = np.flatnonzero(hit if self.how == "left_semi" else ~hit)
        if not len(keep):
            return []
        return [self.assemble(_take(rows, keep), None, w[keep])]

    def null_keyed(self, rows: pa.Table, w: np.ndarray, pos: int) -> list[Delta]:
        """Input ``pos``'s rows whose key is NULL: output as they come if it is preserved.

        Such rows never have a partner, so whatever the other input holds they are
        output (null-extended, or as they are for an anti join) exactly when
        :func:`preserves` says unmatched rows are, and never otherwise.
        """
        if not len(w) or not preserves(self.how, pos):
            return []
        return [self._oriented(pos, rows, None, w)]

    def crossing(self, crossings: Crossings, other: Entries, pos: int) -> list[Delta]:
        """The other input's rows at keys whose degree on input ``pos`` crossed zero.

        Their weight is negated for a 0 -> >0 crossing and kept for >0 -> 0, except
        for a semi join, whose left rows appear with the right key and go without it.
        """
        sign = 1 if self.how == "left_semi" else -1
        q = other.q
        sel = np.flatnonzero(crossings.up[q] | crossings.down[q])
        if not len(sel):
            return []
        w = other.w[sel] * np.where(crossings.up[q[sel]], sign, -sign)
        return [self._oriented(1 - pos, _take(other.rows, sel), None, w)]

    def push(self, pos: int, rows: pa.Table, w: np.ndarray, group: np.ndarray, n_groups: int,
             other: OtherSide, crossings: Crossings | None) -> list[Delta]:
        """The output of a change ``rows``/``w`` to input ``pos`` against the other input.

        ``group``: each row's key group (-1: NULL key), ``n_groups`` of them;
        ``crossings``: how the push moves input ``pos``'s degree per group (None when
        no degree crossed, or the input does not track them).  The other input is as
        it was before the push.
        """
        parts: list[Delta] = []
        if is_semi(self.how):
            if pos == 0:
                parts += self.semi(rows, w, group, other.degrees())
        else:
            entries = other.entries()
            if len(entries.w):
                parts += self.pairs(rows, w, group, entries, n_groups, pos)
            if preserves(self.how, pos):
                parts += self.unmatched(rows, w, group, other.degrees(), pos)
        if crossings is not None and tracks_degree(self.how, pos):
            changed = crossings.groups()
            if len(changed):
                parts += self.crossing(crossings, other.entries_at(changed), pos)
        return parts

    def join(self, left: Entries, right: Entries, n_groups: int) -> list[Delta]:
        """The join of two key-tagged row sets (``q``: key group), e.g. a state at some keys.

        Weights may be of either sign (a state plus an unconsolidated change): a
        degree is the sum of a group's weights.
        """
        right_degree = self._degrees(right, n_groups)
        if is_semi(self.how):
            return self.semi(left.rows, left.w, left.q, right_degree)
        parts = self.pairs(left.rows, left.w, left.q, right, n_groups, 0)
        if preserves(self.how, 0):
            parts += self.unmatched(left.rows, left.w, left.q, right_degree, 0)
        if preserves(self.how, 1):
            parts += self.unmatched(right.rows, right.w, right.q,
                                    self._degrees(left, n_groups), 1)
        return parts

    def _degrees(self, entries: Entries, n_groups: int) -> np.ndarray:
        return checked_sum_by(entries.q, entries.w, n_groups, self._what("a key's degree"))


def _matched(group: np.ndarray, other_degree: np.ndarray) -> np.ndarray:
    """Rows whose key group has a partner on the other input (NULL keys: never)."""
    hit = np.zeros(len(group), dtype=bool)
    nn = group >= 0
    hit[nn] = other_degree[group[nn]] > 0
    return hit


def _take(table: pa.Table, idx: np.ndarray) -> pa.Table:
    """``table.take(idx)``, without the copy when ``idx`` takes every row in order."""
    return table if is_identity(idx, table.num_rows) else table.take(pa.array(idx))
