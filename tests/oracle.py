"""Plain-Python reference semantics for joins over Z-sets.

The differential tests compare everything ``joinstate`` emits against this
module. It deliberately shares no code with the engine (no RocksDB, no codecs;
change sets are read into Z-sets by ``joinstate.testing``, plain Python over
``to_pylist``): it recomputes the whole join from the integrated inputs with the
most direct reading of SQL bag semantics, so that a bug in the incremental
machinery cannot hide behind the same bug in the oracle.

A Z-set is a ``collections.Counter`` mapping a row tuple (column values in a
fixed order, as produced by ``pyarrow``'s ``to_pylist()``) to a non-zero
integer weight.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from joinstate.testing import integrate, zset

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import pyarrow as pa

Row = tuple[Any, ...]

JOIN_TYPES: tuple[str, ...] = ("inner", "left", "right", "full", "left_semi", "left_anti")
"""Every ``how`` the library supports; tests parametrize over this tuple."""

WEIGHT_COLUMN = "_weight"


def zset_from_rows(rows: Iterable[tuple[Row, int]]) -> Counter[Row]:
    """Sum ``(row, weight)`` pairs into a Z-set, dropping rows whose weights cancel.

    ``Counter.update`` is used instead of ``+`` because ``Counter.__add__``
    silently discards negative counts, which are meaningful in a Z-set delta.
    """
    result: Counter[Row] = Counter()
    for row, weight in rows:
        result[row] += weight
    return Counter({row: w for row, w in result.items() if w != 0})


def zset_add(*zsets: Counter[Row]) -> Counter[Row]:
    """Sum Z-sets (weights may be negative) and drop zero entries."""
    return integrate(zsets)


def zset_from_table(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> Counter[Row]:
    """Read an Arrow change set into a Z-set keyed by ``columns`` in that order.

    Identical rows are summed, so a table that lists a row twice with weight 1
    and one that lists it once with weight 2 read the same. Without a
    ``_weight`` column every row counts +1, as the change-set format defines.
    """
    return zset(table, columns)


def _key_of(row: Row, key_idx: Sequence[int]) -> Row | None:
    """Return the join key of ``row``, or None when any key column is NULL.

    SQL equality with NULL is unknown, so a NULL anywhere in the key means the
    row can never match; returning None lets callers treat it as unmatched.
    """
    key = tuple(row[i] for i in key_idx)
    return None if any(v is None for v in key) else key


def _group_by_key(zset: Counter[Row], key_idx: Sequence[int]) -> dict[Row, list[tuple[Row, int]]]:
    """Index the matchable rows (non-NULL key, positive weight) of a Z-set by join key."""
    groups: dict[Row, list[tuple[Row, int]]] = defaultdict(list)
    for row, weight in zset.items():
        key = _key_of(row, key_idx)
        if key is not None and weight != 0:
            groups[key].append((row, weight))
    return groups


def _has_match(key: Row | None, other: dict[Row, list[tuple[Row, int]]]) -> bool:
    """Tell whether a key has at least one copy of a matching row on the other side."""
    if key is None or key not in other:
        return False
    return sum(w for _, w in other[key]) != 0


def join_oracle(
    left: Counter[Row],
    right: Counter[Row],
    left_key_idx: Sequence[int],
    right_key_idx: Sequence[int],
    how: str,
    left_width: int,
    right_width: int,
) -> Counter[Row]:
    """Compute ``left <how> right`` from scratch with SQL bag semantics.

    ``left``/``right`` are the integrated inputs (sum of every delta pushed to
    that side). Keys are compared positionally: ``left_key_idx[i]`` pairs with
    ``right_key_idx[i]``; Python value equality makes integers of different
    Arrow widths match. Output rows are ``left values + right values``
    (``left_semi``/``left_anti``: left values only); unmatched rows of an outer
    side are null-extended once per copy. ``left_anti`` keeps rows with a NULL
    key (NOT EXISTS semantics), ``left_semi`` never does.
    """
    if how not in JOIN_TYPES:
        msg = f"unknown join type {how!r}; expected one of {JOIN_TYPES}"
        raise ValueError(msg)
    if len(left_key_idx) != len(right_key_idx):
        msg = f"key arity differs: left {len(left_key_idx)}, right {len(right_key_idx)}"
        raise ValueError(msg)

    left_groups = _group_by_key(left, left_key_idx)
    right_groups = _group_by_key(right, right_key_idx)
    out: list[tuple[Row, int]] = []

    if how in ("left_semi", "left_anti"):
        want_match = how == "left_semi"
        for row, weight in left.items():
            if _has_match(_key_of(row, left_key_idx), right_groups) == want_match:
                out.append((row, weight))
        return zset_from_rows(out)

    for key, left_rows in left_groups.items():
        for right_row, right_weight in right_groups.get(key, ()):
            for left_row, left_weight in left_rows:
                out.append((left_row + right_row, left_weight * right_weight))

    if how in ("left", "full"):
        right_nulls = (None,) * right_width
        for row, weight in left.items():
            if not _has_match(_key_of(row, left_key_idx), right_groups):
                out.append((row + right_nulls, weight))
    if how in ("right", "full"):
        left_nulls = (None,) * left_width
        for row, weight in right.items():
            if not _has_match(_key_of(row, right_key_idx), left_groups):
                out.append((left_nulls + row, weight))
    return zset_from_rows(out)
