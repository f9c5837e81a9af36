"""Window functions over partitions, vectorised: what the window operator computes.

:func:`evaluate` takes rows, a partition id per row, the ORDER BY and the functions of a
:class:`~joinstate.nodes.WindowNode`, and returns the rows' order (sorted by partition,
then the ORDER BY, then a tie-break) and every function's value in that order.  No
Python runs per row (one exception below): rows are ordered with one ``np.lexsort``
over dense ranks of the ORDER BY columns (``pyarrow.compute.rank``, so NULLs and NaN
land where DuckDB puts them: NULLs last unless asked, NaN above every number in both
directions), partitions and peer groups (rows tied on every ORDER BY column) are runs
of the sorted rows, and each function is a prefix computation taken at the end of each
row's frame:

* ``row_number``/``rank``/``dense_rank``: positions and counts of peer groups;
* ``count``: a prefix count of non-NULL values; ``sum``/``avg`` of integers and
  decimals: exact prefix sums (int64 where a bound proves no partition can overflow, the
  rare partition beyond that in Python integers), of floats: a cumulative sum per
  partition (partitions of similar length in one 2-D ``np.cumsum``);
* ``min``/``max``: a running maximum of ``partition ordinal * K + value rank``, which
  starts over at each partition.

**Deterministic.**  The operator emits a partition's new outputs minus its old ones,
recomputed from the stored rows: a value computed twice from the same rows must be
equal to the bit, or a retraction would not cancel the row it retracts.  So each
partition is computed from its own rows only (never a running value carried across
partitions: a float cumulative sum over several partitions minus a base would depend
on the other partitions), and when the result depends on the order of tied rows
(``row_number``, a ROWS frame, a float sum) ties are broken by the rows' encoded
values, not by the order they were read in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate.codec import RowCodec
from joinstate.zset import ExactInts

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["Frames", "evaluate", "needs_tiebreak"]

_SAFE = float(2**62)  # below this bound on sum(|x|) no int64 prefix sum can wrap
RANKING = ("row_number", "rank", "dense_rank")

Func = tuple[str, str, "str | None", str]
"""(output name, function, argument column or None, frame), as a WindowNode has them."""


def needs_tiebreak(funcs: Sequence[Func], schema: pa.Schema) -> bool:
    """Whether a result depends on the order of rows tied on every ORDER BY column."""
    for _, func, arg, frame in funcs:
        if func == "row_number" or (frame == "rows" and func not in RANKING):
            return True
        if func in ("sum", "avg") and arg is not None and \
                pa.types.is_floating(schema.field(arg).type):
            return True  # a float sum depends on the order it adds in
    return False


class Frames:
    """The sorted rows' partitions and peer groups, as index arrays over sorted positions.

    ``start[i]``/``end[i]``: first/last position of row i's partition; ``peer_start``/
    ``peer_end``: of its peer group; ``ordinal[i]``: its partition's number (0, 1, ...).
    """

    def __init__(self, part: np.ndarray, ranks: Sequence[np.ndarray]) -> None:
        n = len(part)
        self.n = n
        self.pos = np.arange(n, dtype=np.int64)
        starts = np.ones(n, dtype=bool)
        if n:
            starts[1:] = part[1:] != part[:-1]
        peers = starts.copy()
        for r in ranks:
            if n:
                peers[1:] |= r[1:] != r[:-1]
        self.part_starts = starts
        self.peer_starts = peers
        self.start = self._first(starts)
        self.end = self._last(starts)
        self.peer_start = self._first(peers)
        self.peer_end = self._last(peers)
        self.ordinal = np.cumsum(starts, dtype=np.int64) - 1
        self.parts = int(self.ordinal[-1]) + 1 if n else 0

    def _first(self, flags: np.ndarray) -> np.ndarray:
        return np.maximum.accumulate(np.where(flags, self.pos, 0)) if self.n else self.pos

    def _last(self, flags: np.ndarray) -> np.ndarray:
        if not self.n:
            return self.pos
        ends = np.empty(self.n, dtype=bool)
        ends[:-1] = flags[1:]
        ends[-1] = True
        return np.minimum.accumulate(np.where(ends, self.pos, self.n)[::-1])[::-1]

    def frame_end(self, frame: str) -> np.ndarray:
        """The last position of each row's frame (every frame starts at its partition)."""
        if frame == "partition":
            return self.end
        if frame == "range":
            return self.peer_end
        return self.pos


def order_rank(col: pa.Array | pa.ChunkedArray, direction: str, nulls: str) -> np.ndarray:
    """Dense ranks of ``col`` in the ORDER BY's direction, NULLs where ``nulls`` says.

    NaN ranks above every number (DuckDB's order): last ascending, first descending.
    """
    r = _dense_rank(col)
    valid = _valid(col)
    m = int(r[valid].max()) if valid.any() else 0
    if direction == "descending":
        r = np.where(valid, m + 1 - r, r)
    if not valid.all():
        r = np.where(valid, r, m + 1 if nulls == "at_end" else 0)
    return r


def evaluate(table: pa.Table, rows: np.ndarray | None, part: np.ndarray,
             order_by: Sequence[tuple[str, str, str]], funcs: Sequence[Func],
             out_types: Sequence[pa.DataType], what: Callable[[], str]
             ) -> tuple[np.ndarray, list[pa.Array]]:
    """Sort rows by (``part``, ORDER BY, tie-break) and compute ``funcs``.

    The rows are ``table``'s rows at ``rows`` (None: every row once): a row of
    ``table`` may be several rows (copies of a row held several times, one row in a
    partition before and after a change), ranked once.  Returns the sorting permutation
    (of ``rows``) and one array per function, in sorted order.  ``out_types``: each
    function's output type; ``what`` names the operator in errors (an int64 sum that
    overflows, a decimal sum beyond 38 digits).
    """
    n = len(part)
    idx = np.arange(n, dtype=np.int64) if rows is None else rows
    ranks = [order_rank(table.column(c), d, p)[idx] for c, d, p in order_by]
    keys: list[np.ndarray] = []
    if needs_tiebreak(funcs, table.schema) and n > 1:
        enc = RowCodec(table.schema).encode(table)
        keys.append(_dense_rank(enc.arrow())[idx])
    keys += ranks[::-1]
    keys.append(part)
    perm = _sort(keys) if n > 1 else np.arange(n, dtype=np.int64)
    fr = Frames(part[perm], [r[perm] for r in ranks])
    taken = pa.array(idx[perm])
    sorted_cols: dict[str, pa.Array] = {}
    out: list[pa.Array] = []
    for (name, func, arg, frame), t in zip(funcs, out_types, strict=True):
        if func in RANKING or arg is None:
            out.append(pa.array(_counting(fr, func, frame), pa.int64()))
            continue
        col = sorted_cols.get(arg)
        if col is None:
            col = sorted_cols[arg] = _contiguous(table.column(arg).take(taken))
        out.append(_aggregate(fr, func, frame, col, t, _naming(what, name)))
    return perm, out


# ---- functions -------------------------------------------------------------------------


def _counting(fr: Frames, func: str, frame: str) -> np.ndarray:
    """row_number, rank, dense_rank, count(*)."""
    if func == "row_number":
        return fr.pos - fr.start + 1
    if func == "rank":
        return fr.peer_start - fr.start + 1
    if func == "dense_rank":
        c = np.cumsum(fr.peer_starts, dtype=np.int64)
        return c - c[fr.start] + 1
    return fr.frame_end(frame) - fr.start + 1  # count(*)


def _aggregate(fr: Frames, func: str, frame: str, col: pa.Array, t: pa.DataType,
               what: Callable[[], str]) -> pa.Array:
    e = fr.frame_end(frame)
    valid = _valid(col)
    cv = np.cumsum(valid, dtype=np.int64)
    count = cv[e] - cv[fr.start] + valid[fr.start]
    if func == "count":
        return pa.array(count, pa.int64())
    empty = count == 0
    if func in ("min", "max"):
        return _extreme(fr, col, valid, e, func == "max")
    if pa.types.is_floating(col.type):
        v = np.asarray(pc.fill_null(col.cast(pa.float64()), 0.0), dtype=np.float64)
        total = _segmented_cumsum(v, fr)[e]
        if func == "avg":
            total = total / np.maximum(count, 1)
        return pa.array(total, pa.float64(), mask=empty)
    sums = _take(_prefix_exact(fr, col), e)
    if func == "avg":
        scale = col.type.scale if pa.types.is_decimal(col.type) else 0
        f = sums.small.astype(np.float64)
        for i, big in sums.big.items():
            f[i] = float(big)
        return pa.array(f / 10.0**scale / np.maximum(count, 1), pa.float64(), mask=empty)
    if pa.types.is_decimal(t):
        arr = sums.to_decimal(t, lambda i: f"{what()} (its {i}th value)")
        return pc.if_else(pa.array(empty), pa.scalar(None, t), arr) if empty.any() else arr
    return pa.array(sums.to_int64(lambda i: f"{what()} (its {i}th value)"), pa.int64(),
                    mask=empty)


def _prefix_exact(fr: Frames, col: pa.Array) -> ExactInts:
    """Per sorted row, the exact sum of its partition's values up to it (NULLs as 0)."""
    if pa.types.is_decimal(col.type):
        ex = ExactInts.of_decimals(_contiguous(pc.fill_null(col, pa.scalar(0, col.type))))
    else:
        ex = ExactInts.of_ints(pc.fill_null(col, 0))
    v = ex.small
    bound = np.bincount(fr.ordinal, weights=np.abs(v.astype(np.float64)), minlength=fr.parts)
    risky = bound >= _SAFE
    if ex.big:
        risky[fr.ordinal[list(ex.big)]] = True
    with np.errstate(over="ignore"):
        c = np.cumsum(v, dtype=np.int64)  # wraps past int64: exact where the bound holds
        prefix = c - (c[fr.start] - v[fr.start])
    big: dict[int, int] = {}
    if risky.any():
        # Partitions whose values may sum beyond int64: their running sums in Python
        # integers (decimals hold 38 digits; a hundred such values can pass 2**63).
        rows = np.flatnonzero(risky[fr.ordinal])
        vals = np.array([ex.exact(int(i)) for i in rows.tolist()] + [0], dtype=object)[:-1]
        run = np.cumsum(vals)
        first = fr.start[rows]
        at_first = np.searchsorted(rows, first)
        base = run[at_first] - vals[at_first]
        prefix[rows] = 0
        big = dict(zip(rows.tolist(), (run - base).tolist(), strict=True))
    return ExactInts(prefix, big)


def _take(ex: ExactInts, idx: np.ndarray) -> ExactInts:
    if not ex.big:
        return ExactInts(ex.small[idx])
    hit = np.flatnonzero(np.isin(idx, np.fromiter(ex.big, np.int64, len(ex.big))))
    return ExactInts(ex.small[idx], {int(i): ex.big[int(idx[i])] for i in hit.tolist()})


def _segmented_cumsum(v: np.ndarray, fr: Frames) -> np.ndarray:
    """Cumulative sums restarting at each partition, each from its own values only.

    Partitions are grouped by length class (powers of two) and each class is one 2-D
    ``np.cumsum`` along rows, zero-padded on the right: a partition's sums never depend
    on another's, and the padding costs at most twice the rows.
    """
    out = np.empty_like(v)
    if not len(v):
        return out
    starts = np.flatnonzero(fr.part_starts)
    lens = np.diff(np.append(starts, len(v)))
    cls = np.ceil(np.log2(lens)).astype(np.int64)
    for c in np.unique(cls).tolist():
        sel = np.flatnonzero(cls == c)
        width = 1 << c
        ln = lens[sel]
        total = int(ln.sum())
        row = np.repeat(np.arange(len(sel), dtype=np.int64), ln)
        colpos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(ln) - ln, ln)
        src = np.repeat(starts[sel], ln) + colpos
        mat = np.zeros((len(sel), width), dtype=np.float64)
        mat[row, colpos] = v[src]
        np.cumsum(mat, axis=1, out=mat)
        out[src] = mat[row, colpos]
    return out


def _extreme(fr: Frames, col: pa.Array, valid: np.ndarray, e: np.ndarray,
             largest: bool) -> pa.Array:
    """Running min/max per partition, taken at each row's frame end."""
    r = _dense_rank(col)
    m = int(r[valid].max()) if valid.any() else 0
    key_r = np.where(valid, r if largest else m + 1 - r, 0)
    k = m + 2
    base = fr.ordinal * k
    run = np.maximum.accumulate(base + key_r) - base if len(r) else key_r
    at = run[e]
    rep = np.zeros(k, dtype=np.int64)
    rep[key_r[valid]] = fr.pos[valid]
    return col.take(pa.array(rep[at], mask=at == 0))


# ---- helpers ---------------------------------------------------------------------------


def _sort(keys: list[np.ndarray]) -> np.ndarray:
    """The order of ``keys`` (non-negative ints, the last one first), as ``np.lexsort``.

    Keys whose ranges multiply below 2**62 are folded into one int64 and sorted once
    (about twice as fast as ``lexsort``); rows equal in every key are equal in all that
    the functions read, so their order does not matter.
    """
    width = 1.0
    for k in keys:
        width *= float(k.max()) + 1.0
    if width >= 2.0**62:
        return np.lexsort(keys).astype(np.int64)
    folded = np.zeros(len(keys[0]), dtype=np.int64)
    for k in reversed(keys):
        folded = folded * (int(k.max()) + 1) + k
    return np.argsort(folded).astype(np.int64)


def _naming(what: Callable[[], str], name: str) -> Callable[[], str]:
    return lambda: f"{what()}: {name}"


def _dense_rank(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """1 for the smallest value, +1 per distinct larger one (NaN above numbers).

    NULLs get some rank: the callers place them.  Numbers (decimals whose unscaled values
    fit int64 too) are ranked by numpy, ~2x faster than Arrow's ``rank``; ``np.unique``
    puts NaN last and -0.0 with 0.0, as Arrow and DuckDB do.
    """
    if not len(col):
        return np.zeros(0, dtype=np.int64)
    t = col.type
    values: np.ndarray | None = None
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        values = np.asarray(_contiguous(pc.fill_null(col, pa.scalar(0, t))).to_numpy(
            zero_copy_only=False))
    elif pa.types.is_decimal128(t):
        arr = _contiguous(pc.fill_null(col, pa.scalar(0, t)))
        raw = np.frombuffer(arr.buffers()[1], dtype="<i8")
        raw = raw[2 * arr.offset:2 * (arr.offset + len(arr))]
        lo, hi = raw[0::2], raw[1::2]
        if (hi == (lo >> 63)).all():
            values = lo
    if values is not None:
        return np.unique(values, return_inverse=True)[1].astype(np.int64).reshape(-1) + 1
    return pc.rank(col, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64)


def _valid(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if col.null_count == 0:
        return np.ones(len(col), dtype=bool)
    return np.asarray(pc.is_valid(col), dtype=bool)


def _contiguous(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
