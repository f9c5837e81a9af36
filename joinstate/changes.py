"""Change sets in the row-per-change form of a change data feed, and back.

A joinstate change set is a Z-set: each distinct row once, with an int64 ``_weight``
(+n: n copies inserted, -n: n copies deleted).  Delta Lake's change data feed (and most
CDC tools) show the same information as one row per copy with a ``_change_type``
column instead.  :func:`to_changes` expands a weighted change set into that form;
:func:`from_changes` consolidates such rows back into a weighted change set.  Both are
vectorised (Arrow ``take`` / ``group_by`` and numpy), with no Python loop per row.

``from_changes(to_changes(t))`` equals ``t`` consolidated (equal rows merged, zero
weights dropped); ``to_changes(from_changes(c))`` holds the net changes of ``c`` (an
insert and a delete of the same row cancel).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate.errors import SchemaMismatchError, WeightOverflowError
from joinstate.schema import WEIGHT, weights_of
from joinstate.zset import I64_MIN, checked_sum

__all__ = ["CHANGE_TYPE", "CHANGE_WEIGHTS", "DELTA_METADATA", "from_changes", "to_changes"]

CHANGE_TYPE = "_change_type"
"""The column naming each change: ``insert`` or ``delete`` (Delta Lake's names)."""

CHANGE_WEIGHTS = {"insert": 1, "delete": -1, "update_postimage": 1, "update_preimage": -1}
"""The weight of each ``_change_type`` :func:`from_changes` accepts (Delta's four)."""

DELTA_METADATA = ("_commit_version", "_commit_timestamp")
"""Delta Lake's per-commit columns: dropped by :func:`from_changes` (a change set has none)."""

_INSERT, _DELETE = "insert", "delete"
_TMP = "__joinstate_tmp_"  # prefix of helper columns while grouping


def _as_table(data: pa.Table | pa.RecordBatch, what: str) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise SchemaMismatchError(
            f"{what}: expected a pyarrow Table or RecordBatch, got {type(data).__name__}"
        )
    return data


def to_changes(table: pa.Table | pa.RecordBatch) -> pa.Table:
    """Expand a weighted change set into one row per copy, with ``_change_type``.

    A row of weight +n becomes n ``insert`` rows, -n becomes n ``delete`` rows, 0 none;
    rows keep their input order.  The ``_weight`` column is replaced by
    ``_change_type`` (string), last; a table without ``_weight`` counts every row as +1.
    """
    t = _as_table(table, "to_changes")
    w = weights_of(t, "to_changes")
    if CHANGE_TYPE in t.column_names:
        raise SchemaMismatchError(
            f"to_changes: the table already has a {CHANGE_TYPE!r} column; pass a weighted "
            f"change set (rows plus {WEIGHT!r})"
        )
    if (w == I64_MIN).any():
        raise WeightOverflowError(
            f"to_changes: a weight of {I64_MIN} has no row-per-copy form (too many rows)"
        )
    copies = np.abs(w)
    checked_sum(copies, "to_changes: the number of change rows")
    idx = np.repeat(np.arange(len(w), dtype=np.int64), copies)
    data = t.drop_columns([WEIGHT]) if WEIGHT in t.column_names else t
    out = data.take(pa.array(idx, pa.int64()))
    kinds = pa.array([_DELETE, _INSERT], pa.string()).take(
        pa.array((w[idx] > 0).astype(np.int8)))
    return out.append_column(pa.field(CHANGE_TYPE, pa.string(), nullable=False), kinds)


def _canonical(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Floats as the store compares them: ``-0.0`` as ``0.0``, every NaN as one NaN."""
    if not pa.types.is_floating(col.type):
        return col
    nan = pa.scalar(float("nan"), col.type)
    zero = pa.scalar(0.0, col.type)
    col = pc.if_else(pc.is_nan(col), nan, col)
    return pc.if_else(pc.equal(col, zero), zero, col)


def from_changes(table: pa.Table | pa.RecordBatch) -> pa.Table:
    """Consolidate rows with a ``_change_type`` column into a weighted change set.

    ``insert`` / ``update_postimage`` count +1, ``delete`` / ``update_preimage`` -1
    (another value or a NULL is an error naming it).  Equal rows are merged and their
    weights summed (floats compare as the store does: ``-0.0`` equals ``0.0``, NaN
    equals NaN, and come out in that canonical form; NULLs equal NULLs); rows whose
    weight sums to zero are dropped.  Delta Lake's ``_commit_version`` and
    ``_commit_timestamp`` columns are dropped.  Returns the data columns (input order)
    plus an int64 ``_weight``, one row per distinct row, in order of first appearance.
    """
    t = _as_table(table, "from_changes")
    if CHANGE_TYPE not in t.column_names:
        raise SchemaMismatchError(
            f"from_changes: the table has no {CHANGE_TYPE!r} column (columns: "
            f"{t.column_names}); pass change rows as to_changes() or a Delta change data "
            "feed writes them"
        )
    if WEIGHT in t.column_names:
        raise SchemaMismatchError(
            f"from_changes: the table has both {CHANGE_TYPE!r} and {WEIGHT!r}; drop one "
            "(each change row counts one copy)"
        )
    kinds = t.column(CHANGE_TYPE)
    if not (pa.types.is_string(kinds.type) or pa.types.is_large_string(kinds.type)
            or pa.types.is_dictionary(kinds.type)):
        raise SchemaMismatchError(
            f"from_changes: column {CHANGE_TYPE!r} must be strings, got {kinds.type}"
        )
    kinds = pc.cast(kinds, pa.string())
    w = np.zeros(t.num_rows, dtype=np.int64)
    known = np.zeros(t.num_rows, dtype=bool)
    for name, weight in CHANGE_WEIGHTS.items():
        hit = np.asarray(pc.fill_null(pc.equal(kinds, name), False).to_numpy(
            zero_copy_only=False), dtype=bool)
        w[hit] = weight
        known |= hit
    if not known.all():
        bad = kinds[int(np.flatnonzero(~known)[0])].as_py()
        raise SchemaMismatchError(
            f"from_changes: {CHANGE_TYPE!r} value {bad!r} is not one of "
            f"{sorted(CHANGE_WEIGHTS)}"
        )
    data = t.drop_columns([c for c in (CHANGE_TYPE, *DELTA_METADATA) if c in t.column_names])
    names = data.column_names
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SchemaMismatchError(f"from_changes: duplicate column(s) {dup}")
    if not names:
        total = int(w.sum())
        return pa.table({WEIGHT: pa.array([total] if total else [], pa.int64())})
    data = pa.Table.from_arrays([_canonical(c) for c in data.columns], names=names)
    return _consolidate(data, w)


def _consolidate(data: pa.Table, w: np.ndarray) -> pa.Table:
    """Sum the ``w`` (each +1 or -1: no sum can leave int64) per distinct row, drop zeros."""
    names = data.column_names
    weight, first = _TMP + "w", _TMP + "first"
    grouped = data.append_column(weight, pa.array(w, pa.int64())).append_column(
        first, pa.array(np.arange(len(w), dtype=np.int64)))
    try:
        agg = grouped.group_by(names, use_threads=False).aggregate(
            [(weight, "sum"), (first, "min")]
        )
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SchemaMismatchError(
            f"from_changes: cannot group rows of these column types ({exc}); supported: "
            "the types a join side may hold"
        ) from exc
    agg = agg.sort_by(first + "_min")
    total = np.asarray(agg.column(weight + "_sum").to_numpy(), dtype=np.int64)
    live = np.flatnonzero(total != 0)
    cols = [agg.column(n).take(pa.array(live)) for n in names]
    cols.append(pa.array(total[live], pa.int64()))
    fields = [pa.field(n, data.schema.field(n).type) for n in names]
    schema = pa.schema([*fields, pa.field(WEIGHT, pa.int64(), nullable=False)])
    return pa.Table.from_arrays(cols, schema=schema)
