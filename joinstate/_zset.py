"""Vectorised grouping helpers for Z-sets (rows with integer weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from joinstate.errors import StateCorruptedError

if TYPE_CHECKING:
    from joinstate._bytes import Bytes

__all__ = ["Groups", "expand", "group_rows", "group_u64", "sum_by"]


class Groups:
    """``inv[i]`` is row i's group; ``first[g]`` is the first row of group g."""

    __slots__ = ("first", "inv")

    def __init__(self, inv: np.ndarray, first: np.ndarray) -> None:
        self.inv = inv
        self.first = first

    def __len__(self) -> int:
        return len(self.first)


def _groups_from_sorted(order: np.ndarray, boundary: np.ndarray) -> Groups:
    gid_sorted = np.cumsum(boundary) - 1
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = gid_sorted
    return Groups(inv, order[boundary])


def group_u64(h: np.ndarray) -> Groups:
    """Group equal uint64 values."""
    if len(h) == 0:
        return Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    order = np.argsort(h, kind="stable")
    s = h[order]
    boundary = np.empty(len(s), dtype=bool)
    boundary[0] = True
    np.not_equal(s[1:], s[:-1], out=boundary[1:])
    return _groups_from_sorted(order, boundary)


def group_rows(rh: Bytes, enc: Bytes) -> Groups:
    """Group rows by their 128-bit hash, verifying that grouped rows really are equal."""
    n = len(rh)
    if n == 0:
        return Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    words = np.ascontiguousarray(rh.matrix()).view("<u8")
    first_word = np.sort(words[:, 0])
    if not (first_word[1:] == first_word[:-1]).any():
        # Common case: no two rows share even 64 bits of hash, so all rows are distinct.
        ident = np.arange(n, dtype=np.int64)
        return Groups(ident, ident)
    order = np.lexsort((words[:, 1], words[:, 0]))
    s = words[order]
    boundary = np.empty(n, dtype=bool)
    boundary[0] = True
    np.any(s[1:] != s[:-1], axis=1, out=boundary[1:])
    groups = _groups_from_sorted(order, boundary)
    if len(groups) < n:
        dup = np.flatnonzero(groups.first[groups.inv] != np.arange(n))
        if not enc.take(dup).equals(enc.take(groups.first[groups.inv[dup]])).all():
            msg = "xxh3_128 collision between two different rows"
            raise StateCorruptedError(msg)
    return groups


def group_keys(khash: np.ndarray, canon: Bytes) -> Groups:
    """Group rows by canonical key (hash first, then an exact check)."""
    groups = group_u64(khash)
    if len(groups) < len(khash):
        rep = groups.first[groups.inv]
        if not canon.equals(canon.take(rep)).all():
            # A 64-bit collision between different keys: group exactly instead.
            firsts: dict[bytes, int] = {}
            inv = np.fromiter(
                (firsts.setdefault(k, len(firsts)) for k in canon.to_list()),
                dtype=np.int64, count=len(khash),
            )
            first = np.zeros(len(firsts), dtype=np.int64)
            first[inv[::-1]] = np.arange(len(khash) - 1, -1, -1)
            return Groups(inv, first)
    return groups


def sum_by(inv: np.ndarray, w: np.ndarray, n_groups: int) -> np.ndarray:
    """Exact int64 sums of ``w`` per group."""
    out = np.zeros(n_groups, dtype=np.int64)
    np.add.at(out, inv, w)
    return out


def expand(row_group: np.ndarray, entry_group: np.ndarray, n_groups: int) -> tuple[
    np.ndarray, np.ndarray
]:
    """All pairs (row, entry) with equal group; ``row_group`` < 0 never pairs."""
    order = np.argsort(entry_group, kind="stable")
    counts = np.bincount(entry_group, minlength=n_groups).astype(np.int64)
    starts = np.cumsum(counts) - counts
    valid = row_group >= 0
    rows = np.flatnonzero(valid)
    g = row_group[rows]
    c = counts[g]
    total = int(c.sum())
    row_idx = np.repeat(rows, c)
    first_out = np.cumsum(c) - c
    pos = np.repeat(starts[g] - first_out, c) + np.arange(total, dtype=np.int64)
    return row_idx, order[pos]
