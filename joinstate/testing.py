"""Z-set helpers for testing what a join or a pipeline emits.

A change set is an Arrow table whose rows carry an int64 ``_weight`` (+n: n copies
inserted, -n: n copies deleted; a table without it counts +1 per row, and a
``_change_type`` column as a change data feed writes it counts +1 per insert and -1 per
delete).  Its *Z-set* is a :class:`collections.Counter` from row tuples to summed
weights, zeros dropped: equal rows merge whatever order or batching produced them, so
two Z-sets are equal exactly when the change sets mean the same change.  Integrating
the outputs of every push gives the output's current contents; a pipeline is right when
that equals its query computed from scratch over the integrated inputs::

    from joinstate.testing import assert_zset_equal, integrate, zset

    outs = [p.push("orders", batch)["per_customer"] for batch in batches]
    assert_zset_equal(integrate(outs), zset(expected), what="per_customer")

Values are compared exactly (Python values from ``to_pylist``; decimals as
:class:`decimal.Decimal`), with floats as SQL compares them: ``-0.0`` equals ``0.0``
and every NaN equals every NaN (``float_bits=True`` compares floats bit for bit
instead, to check that stored state is untouched).  Nested values (lists, structs,
maps) become tuples, so every row is hashable.

For comparisons with another engine's answer, whose doubles carry its own rounding,
:func:`compare` compares two tables as multisets with a tolerance on doubles;
:func:`consolidate` and :func:`expand` convert between change sets and plain tables
with Arrow kernels (no Python object per row), for tables too large for a Counter.

These helpers share nothing with the engine but Arrow: a bug in the engine cannot
hide behind the same bug here.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = ["assert_zset_equal", "compare", "consolidate", "expand", "integrate", "zset"]

Row = tuple[Any, ...]
"""One row of a Z-set: the values of its columns, in column order."""

WEIGHT = "_weight"
CHANGE_TYPE = "_change_type"
_CHANGE_WEIGHTS = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}
_NAN = math.nan
"""The one NaN every NaN becomes: tuples compare (and hash) it by identity."""

ChangeSet: TypeAlias = "pa.Table | pa.RecordBatch"
"""What the helpers read: an Arrow table or record batch."""


# ---- Counter Z-sets ------------------------------------------------------------------


def zset(table: ChangeSet, columns: Sequence[str] | None = None, *,
         float_bits: bool = False) -> Counter[Row]:
    """The Z-set of a change set: row tuple -> summed weight, zero weights dropped.

    ``columns`` picks the columns of each row tuple and their order (default: every
    column but ``_weight`` / ``_change_type``, in table order).  ``float_bits=True``
    keeps floats apart by their bits (``-0.0`` is not ``0.0``).  Raises ``ValueError``
    for a NULL weight, an unknown ``_change_type`` or a table with both columns, and
    ``KeyError`` for a column the table does not have.
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names = _data_columns(table, columns)
    values = [table.column(n).to_pylist() for n in names]
    weights = _weights(table)
    out: Counter[Row] = Counter()
    if not names:  # rows without columns (a count): all the same row
        out[()] = sum(weights)
    else:
        for row, w in zip(zip(*values, strict=True), weights, strict=True):
            out[tuple(_value(v, float_bits) for v in row)] += w
    return _nonzero(out)


def integrate(change_sets: Iterable[ChangeSet | Mapping[Row, int]],
              columns: Sequence[str] | None = None, *, float_bits: bool = False
              ) -> Counter[Row]:
    """The sum of several change sets (tables or Z-sets) as one Z-set, zeros dropped.

    Tables are read with the first table's columns (or ``columns``), by name, so
    change sets with the same columns in another order add up correctly.
    """
    total: Counter[Row] = Counter()
    for part in change_sets:
        if isinstance(part, pa.Table | pa.RecordBatch):
            if columns is None:
                columns = _data_columns(part, None)
            rows: Mapping[Row, int] = zset(part, columns, float_bits=float_bits)
        else:
            rows = part
        for row, w in rows.items():
            total[row] += w
    return _nonzero(total)


def assert_zset_equal(got: ChangeSet | Mapping[Row, int], want: ChangeSet | Mapping[Row, int],
                      what: str = "output", *, limit: int = 10,
                      float_bits: bool = False) -> None:
    """Assert two change sets (tables or Z-sets) are the same Z-set.

    On a difference the ``AssertionError`` names ``what``, counts the differing rows
    and lists the first ``limit`` of them (sorted) with both weights, e.g.
    ``(1, 'a'): got 2, want 1``.  Tables must have the same columns (any order).
    """
    names: list[str] | None = None
    if isinstance(got, pa.Table | pa.RecordBatch):
        names = _data_columns(got, None)
    if isinstance(want, pa.Table | pa.RecordBatch):
        want_names = _data_columns(want, None)
        if names is not None and sorted(names) != sorted(want_names):
            msg = f"{what}: the columns differ: got {names}, want {want_names}"
            raise AssertionError(msg)
        names = names or want_names
    g = _as_zset(got, names, float_bits)
    w = _as_zset(want, names, float_bits)
    if g == w:
        return
    differ = sorted((r for r in g.keys() | w.keys() if g.get(r, 0) != w.get(r, 0)),
                    key=repr)
    head = (f"{what}: {len(differ)} row(s) differ (got {len(g)} distinct rows, weight "
            f"{sum(g.values())}; want {len(w)} distinct rows, weight {sum(w.values())})")
    if names is not None:
        head += f"; columns ({', '.join(names)})"
    lines = [head, *(f"  {r!r}: got {g.get(r, 0)}, want {w.get(r, 0)}"
                     for r in differ[:limit])]
    if len(differ) > limit:
        lines.append(f"  ... and {len(differ) - limit} more")
    raise AssertionError("\n".join(lines))


def _as_zset(data: ChangeSet | Mapping[Row, int], names: Sequence[str] | None,
             float_bits: bool) -> Counter[Row]:
    if isinstance(data, pa.Table | pa.RecordBatch):
        return zset(data, names, float_bits=float_bits)
    return _nonzero(Counter(dict(data)))


def _data_columns(table: ChangeSet, columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        return [n for n in table.schema.names if n not in (WEIGHT, CHANGE_TYPE)]
    missing = [c for c in columns if c not in table.schema.names]
    if missing:
        msg = f"column(s) {missing} not in the change set (its columns: {table.schema.names})"
        raise KeyError(msg)
    return list(columns)


def _weights(table: pa.Table) -> list[int]:
    names = table.column_names
    if WEIGHT in names and CHANGE_TYPE in names:
        msg = f"the change set has both {WEIGHT!r} and {CHANGE_TYPE!r}: keep one"
        raise ValueError(msg)
    if WEIGHT in names:
        weights = table.column(WEIGHT).to_pylist()
        if None in weights:
            msg = f"{weights.count(None)} row(s) have a NULL {WEIGHT!r}"
            raise ValueError(msg)
        return [int(w) for w in weights]
    if CHANGE_TYPE in names:
        kinds = table.column(CHANGE_TYPE).to_pylist()
        unknown = sorted({repr(k) for k in kinds if k not in _CHANGE_WEIGHTS})
        if unknown:
            msg = (f"{CHANGE_TYPE!r} values {', '.join(unknown)}: expected one of "
                   f"{', '.join(_CHANGE_WEIGHTS)}")
            raise ValueError(msg)
        return [_CHANGE_WEIGHTS[k] for k in kinds]
    return [1] * table.num_rows


def _value(v: Any, float_bits: bool) -> Any:
    """A value as rows compare it: floats as SQL (or by bits), nested values as tuples."""
    if isinstance(v, float):
        if float_bits:
            return v.hex()
        return _NAN if math.isnan(v) else v + 0.0  # -0.0 + 0.0 is 0.0
    if isinstance(v, list | tuple):
        return tuple(_value(x, float_bits) for x in v)
    if isinstance(v, dict):
        return tuple((k, _value(x, float_bits)) for k, x in v.items())
    return v


def _nonzero(c: Counter[Row]) -> Counter[Row]:
    return Counter({r: w for r, w in c.items() if w != 0})


# ---- Arrow change sets ---------------------------------------------------------------


def consolidate(delta: pa.Table) -> pa.Table:
    """Equal rows merged, their weights summed, zero weights dropped (NULLs group).

    An Arrow ``group_by`` over every column but ``_weight``: no Python object per row.
    """
    cols = [c for c in delta.column_names if c != WEIGHT]
    if delta.num_rows == 0:
        return delta
    g = delta.group_by(cols, use_threads=False).aggregate([(WEIGHT, "sum")])
    g = g.rename_columns([*cols, WEIGHT])
    return g.filter(pc.not_equal(g[WEIGHT], 0))


def expand(table: pa.Table) -> pa.Table:
    """A consolidated change set with positive weights as a plain table of its rows.

    Each row appears ``weight`` times, without ``_weight``; a negative weight (a
    retraction of something never inserted) raises ``ValueError``.
    """
    w = table[WEIGHT].to_numpy()
    if (w < 0).any():
        msg = f"{int((w < 0).sum())} rows have a negative weight"
        raise ValueError(msg)
    rows = table.drop_columns([WEIGHT])
    if (w == 1).all():
        return rows
    return rows.take(pa.array(np.repeat(np.arange(len(w)), w)))


RTOL = 1e-9
ATOL = 1e-6
"""Doubles compare to 1e-9 relative, or 1e-6 absolute: a total that cancels to (nearly)
zero is exact in a pipeline (a decimal sum) but carries another engine's float rounding,
~1e-16 of the summed magnitudes, so a relative test alone would reject an exact 0 against
that engine's 1e-12."""


def _common(a: pa.ChunkedArray, b: pa.ChunkedArray) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """Both columns cast to one type (ints to int64, strings to string, decimals widened)."""
    ta, tb = a.type, b.type
    if ta == tb:
        return a, b
    if pa.types.is_integer(ta) and pa.types.is_integer(tb):
        return a.cast(pa.int64()), b.cast(pa.int64())
    if pa.types.is_floating(ta) and pa.types.is_floating(tb):
        return a.cast(pa.float64()), b.cast(pa.float64())
    if pa.types.is_decimal(ta) and pa.types.is_decimal(tb):
        t = pa.decimal128(38, max(ta.scale, tb.scale))
        return a.cast(t), b.cast(t)
    string = (pa.types.is_string(ta) or pa.types.is_large_string(ta)
              or pa.types.is_string_view(ta))
    if string and (pa.types.is_string(tb) or pa.types.is_large_string(tb)
                   or pa.types.is_string_view(tb)):
        return a.cast(pa.string()), b.cast(pa.string())
    return a.cast(tb), b


def _row(table: pa.Table, i: int) -> dict[str, Any]:
    return {c: table[c][i].as_py() for c in table.column_names}


def _rounded(table: pa.Table, floats: set[str]) -> Counter[Row]:
    cols = []
    for c in table.column_names:
        vals = table[c].to_pylist()
        cols.append([float(f"{v:.9g}") if v is not None else v for v in vals]
                    if c in floats else vals)
    return Counter(zip(*cols, strict=True))


def compare(got: pa.Table, want: pa.Table, *, rtol: float = RTOL, atol: float = ATOL,
            show: int = 3) -> dict[str, Any]:
    """Compare two tables (no ``_weight``) as multisets of rows; doubles to a tolerance.

    Decimals and all else compare exactly, doubles to ``rtol`` relative (or ``atol``
    absolute).  Both are sorted on every column (exact columns first) and compared row
    by row with Arrow kernels.  Returns ``{"ok", "mismatches", "got_rows", "want_rows"}``
    and, on a mismatch, the first differing position and, from a multiset difference
    (doubles rounded to 9 digits), the first ``show`` rows only one side has.
    """
    res: dict[str, Any] = {"got_rows": got.num_rows, "want_rows": want.num_rows}
    if got.column_names != want.column_names:
        res.update(ok=False, mismatches=None,
                   reason=f"columns differ: {got.column_names} vs {want.column_names}")
        return res
    cols_g, cols_w = [], []
    for c in want.column_names:
        a, b = _common(got[c], want[c])
        cols_g.append(a)
        cols_w.append(b)
    got = pa.table(cols_g, names=want.column_names)
    want = pa.table(cols_w, names=want.column_names)
    floats = {c for c in want.column_names if pa.types.is_floating(want.schema.field(c).type)}
    order = [c for c in want.column_names if c not in floats] + sorted(floats)
    keys = [(c, "ascending", "at_start") for c in order]
    if got.num_rows:
        got = got.take(pc.sort_indices(got, sort_keys=keys))
    if want.num_rows:
        want = want.take(pc.sort_indices(want, sort_keys=keys))
    n = min(got.num_rows, want.num_rows)
    bad = np.zeros(n, bool)
    for c in want.column_names:
        a, b = got[c].slice(0, n), want[c].slice(0, n)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        if c in floats:
            diff = pc.abs(pc.subtract(a, b))
            tol = pc.max_element_wise(pc.multiply(pc.max_element_wise(pc.abs(a), pc.abs(b)),
                                                  rtol), atol)
            # the tolerance is for finite values (an infinity's is infinite: it would
            # match anything); infinities match when equal, NaN matches NaN
            finite = pc.and_(pc.is_finite(a), pc.is_finite(b))
            same = pc.or_(pc.or_(pc.and_(finite, pc.less_equal(diff, tol)), pc.equal(a, b)),
                          pc.and_(pc.is_nan(a), pc.is_nan(b)))
        else:
            same = pc.equal(a, b)
        ok = pc.or_kleene(pc.fill_null(same, False), both_null)
        bad |= ~ok.to_numpy(zero_copy_only=False)
    mism = int(bad.sum()) + abs(got.num_rows - want.num_rows)
    res["mismatches"] = mism
    res["ok"] = mism == 0
    if mism:
        first = int(np.argmax(bad)) if bad.any() else n
        res["first_position"] = first
        if first < got.num_rows:
            res["got_at_first"] = _row(got, first)
        if first < want.num_rows:
            res["want_at_first"] = _row(want, first)
        cg, cw = _rounded(got, floats), _rounded(want, floats)
        names = want.column_names
        only_g, only_w = cg - cw, cw - cg
        res["only_got"] = [dict(zip(names, r, strict=True))
                           for r in sorted(only_g, key=repr)[:show]]
        res["only_want"] = [dict(zip(names, r, strict=True))
                            for r in sorted(only_w, key=repr)[:show]]
        res["only_got_rows"] = sum(only_g.values())
        res["only_want_rows"] = sum(only_w.values())
    return res
