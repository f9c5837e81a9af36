"""Apply a change batch to a join from snapshots: scans and hash joins instead of probes.

The incremental path of :meth:`joinstate.Join.push` reads, per distinct key of the
batch, the other side's rows (a multi-get or a prefix iteration, or its probe cache) and
this side's degree.  This path reads whole snapshots instead and computes the batch's
output with vectorised whole-table operations:

* the other side: one scan of every entry (:meth:`joinstate.Join.scan`);
* this side: one scan as well when the join needs its per-key degrees (the side is
  preserved by the other side's outer join, or is the right side of a semi/anti join:
  :attr:`joinstate.IndexInfo.tracks_degree`; ``planner.batch.scanned_rows`` counts
  these rows for the cost model); otherwise the output does not depend on it;
* the batch's keys are looked up in the snapshots by Arrow hash lookups on canonical
  key bytes (``index_in``), and the output is assembled from numpy index arrays and
  Arrow ``take``: the pairs Δ ⋈ other, the batch rows without a partner (outer joins),
  the other side's rows whose null-extended row appears or disappears because this
  side's degree of their key crosses zero (outer, semi and anti joins).

The new snapshot of this side is ``old + Δ``; its difference from the old one is exactly
the consolidated batch, and that difference is what is written: through
:meth:`joinstate.Join.apply` with the output given, i.e. one
:class:`joinstate.Transaction` staged by the same layout code as a push.  So validation
(over-retraction, unique keys, weight overflow), the bytes on disk, the counters, the
derived in-memory structures (entry maps, key sets, probe caches), atomicity and the
commit record are those of a push by construction, and a refused batch raises what push
raises.  Rewriting the whole side from the new snapshot instead (sorted SST files) was
not chosen: it costs in proportion to the side (every row rewritten, ~0.6 µs per row to
write an SST file on the development VM, plus sorting) on every batch, while the
difference costs in proportion to the batch and leaves the same logical state.

Checked arithmetic: weights are int64.  Sums and products that could leave the range
(any magnitude near 2**53 in a sum, 2**62 in a product) are not computed here; the
batch is handed to the incremental path, whose exact checks raise
:class:`joinstate.WeightOverflowError` or compute the exact result, as push does.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate import WEIGHT, StateClosedError

if TYPE_CHECKING:
    import joinstate

__all__ = ["output_from_scans", "recompute"]

log = logging.getLogger(__name__)

_SUM_SAFE = float(2**53)  # float64 sums of integers are exact while every partial sum is
_MUL_SAFE = float(2**62)  # below this bound no int64 product or sum of two can wrap


class _Fallback(Exception):
    """A weight too large for the vectorised arithmetic here: use the incremental path."""


def recompute(
    join: joinstate.Join, side: joinstate.SideName, delta: pa.Table | pa.RecordBatch, *,
    commit_id: str | None = None, timings: dict[str, float] | None = None,
) -> pa.Table:
    """Apply ``delta`` to ``side`` of ``join`` from snapshots; return the output change set.

    Same result as ``join.push(side, delta, commit_id=commit_id)``: the same output (as
    a Z-set: rows may be listed in another order or split differently), the same state,
    counters and commit record, the same errors with nothing applied.  Holds the store's
    lock from the first scan to the commit, so no other push interleaves.  A
    ``commit_id`` already committed replays the recorded output (or raises
    :class:`joinstate.CommitConflictError` for another change) without scanning.

    ``timings``, if given, receives the milliseconds of the phases: ``scan_ms`` (reading
    the snapshots: the part that grows with the state), ``compute_ms`` (the hash joins)
    and ``write_ms`` (staging and committing the difference).  The planner learns the
    per-row costs of the two parts from them.
    """
    store = join.store
    if store is None or store.closed:
        raise StateClosedError(f"join {join.name!r} is bound to a closed state store")
    clock = timings if timings is not None else {}
    with store.lock:
        if commit_id is not None and join.committed(commit_id):
            return join.push(side, delta, commit_id=commit_id)  # replay or conflict
        batch = join.prepare(side, delta)
        if not batch.rows:
            return join.apply(side, batch, commit_id=commit_id)
        other: joinstate.SideName = "right" if side == "left" else "left"
        t0 = time.perf_counter()
        own = join.scan(side) if join.index(side).tracks_degree else None
        theirs = join.scan(other)
        t1 = time.perf_counter()
        clock["scan_ms"] = (t1 - t0) * 1e3
        try:
            out = output_from_scans(join, side, join.scan(side, batch), own, theirs)
        except _Fallback:
            log.info("join %r, %s side: weights near the int64 limits; applying the batch "
                     "incrementally (exact checks)", join.name, side)
            return join.apply(side, batch, commit_id=commit_id)
        t2 = time.perf_counter()
        clock["compute_ms"] = (t2 - t1) * 1e3
        result = join.apply(side, batch, commit_id=commit_id, output=out)
        clock["write_ms"] = (time.perf_counter() - t2) * 1e3
        return result


def output_from_scans(
    join: joinstate.Join, side: joinstate.SideName, batch: pa.Table, own: pa.Table | None,
    other: pa.Table,
) -> pa.Table:
    """The output of pushing ``batch`` into ``side``, from snapshots (:meth:`Join.scan`).

    ``batch``: the consolidated batch (``join.scan(side, prepared)``); ``own``: every
    entry of ``side`` before the batch, needed only when the side tracks degrees (None
    otherwise); ``other``: every entry of the other side.  Raises :class:`_Fallback` when
    a weight is too large for the checked arithmetic here.
    """
    how = join.how
    is_left = side == "left"
    keys = _column(batch, "_key")
    kset = pc.unique(keys.drop_null())
    n_keys = len(kset)
    g_batch = _group_ids(keys, kset)
    w_batch = _weights(batch)
    g_other = _group_ids(_column(other, "_key"), kset)
    hit = np.flatnonzero(g_other >= 0)  # entries of the other side at the batch's keys
    hit, w_hit = _merge_entries(other, hit, _weights(other)[hit])
    g_hit = g_other[hit]
    mine = _side_columns(batch, join.left_side if is_left else join.right_side)
    theirs = _side_columns(other, join.right_side if is_left else join.left_side)
    parts: list[pa.Table] = []

    def orient(m: pa.Table | None, o: pa.Table | None, w: np.ndarray) -> pa.Table:
        return _assemble(join, m, o, w) if is_left else _assemble(join, o, m, w)

    crossing: tuple[np.ndarray, np.ndarray] | None = None
    if own is not None:  # this side's degree per batch key, before and after the batch
        deg_old = _sum_by(_group_ids(_column(own, "_key"), kset), _weights(own), n_keys)
        deg_new = _add(deg_old, _sum_by(g_batch, w_batch, n_keys))
        crossing = ((deg_old == 0) & (deg_new > 0), (deg_old > 0) & (deg_new == 0))

    if how in ("left_semi", "left_anti"):
        if is_left:
            other_deg = _sum_by(g_hit, w_hit, n_keys)
            matched = np.zeros(len(w_batch), dtype=bool)
            nn = g_batch >= 0
            matched[nn] = other_deg[g_batch[nn]] > 0
            keep = np.flatnonzero(matched if how == "left_semi" else ~matched)
            if len(keep):
                parts.append(_assemble(join, _take(mine, keep), None, w_batch[keep]))
        elif crossing is not None:
            parts += _transitions(join, crossing, g_hit, w_hit, hit, theirs,
                                  sign=1 if how == "left_semi" else -1, other_is_left=True)
        return _concat(parts, join.output_schema)

    ri, ei = _pairs(g_batch, g_hit, n_keys)
    if len(ri):
        parts.append(orient(_take(mine, ri), _take(theirs, hit[ei]),
                            _mul(w_batch[ri], w_hit[ei])))
    mine_preserved = how == "full" or how == ("left" if is_left else "right")
    theirs_preserved = how == "full" or how == ("right" if is_left else "left")
    if mine_preserved:
        has_partner = np.zeros(n_keys + 1, dtype=bool)  # slot n_keys: NULL keys
        has_partner[g_hit] = True  # stored weights are positive: an entry is a partner
        lone = np.flatnonzero(~has_partner[np.where(g_batch < 0, n_keys, g_batch)])
        if len(lone):
            parts.append(orient(_take(mine, lone), None, w_batch[lone]))
    if theirs_preserved and crossing is not None:
        parts += _transitions(join, crossing, g_hit, w_hit, hit, theirs, sign=-1,
                              other_is_left=not is_left)
    return _concat(parts, join.output_schema)


def _transitions(
    join: joinstate.Join, crossing: tuple[np.ndarray, np.ndarray], g_hit: np.ndarray,
    w_hit: np.ndarray, hit: np.ndarray, theirs: pa.Table, sign: int, other_is_left: bool,
) -> list[pa.Table]:
    """The other side's rows at keys whose degree on this side crossed zero.

    ``sign`` is their weight's sign for a 0 -> >0 crossing (the opposite for >0 -> 0):
    -1 retracts a null-extended row that now has a partner, +1 emits a semi-join match.
    """
    up, down = crossing
    sel = np.flatnonzero(up[g_hit] | down[g_hit])
    if not len(sel):
        return []
    w = w_hit[sel] * np.where(up[g_hit[sel]], sign, -sign)
    rows = _take(theirs, hit[sel])
    return [_assemble(join, rows, None, w) if other_is_left else _assemble(join, None, rows, w)]


# ---- vectorised helpers ------------------------------------------------------------------


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _weights(table: pa.Table) -> np.ndarray:
    return np.asarray(_column(table, WEIGHT).to_numpy(zero_copy_only=False), dtype=np.int64)


def _group_ids(keys: pa.Array, kset: pa.Array) -> np.ndarray:
    """Position of every key in ``kset`` (a hash lookup); -1 for NULL or absent keys."""
    if not len(keys):
        return np.zeros(0, np.int64)
    pos = pc.index_in(keys, value_set=kset)
    return np.asarray(pos.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _side_columns(table: pa.Table, side: joinstate.Side) -> pa.Table:
    return table.select(list(side.schema.names))


def _take(table: pa.Table, idx: np.ndarray) -> pa.Table:
    return table.take(pa.array(idx, pa.int64()))


def _sum_by(g: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``w`` per group ``g`` (>= 0); _Fallback if they could be inexact."""
    valid = g >= 0
    g, w = g[valid], w[valid]
    if not len(g):
        return np.zeros(n, np.int64)
    if float(np.bincount(g, weights=np.abs(w.astype(np.float64)), minlength=n).max()) \
            >= _SUM_SAFE:
        raise _Fallback
    return np.bincount(g, weights=w.astype(np.float64), minlength=n).astype(np.int64)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if len(a) and max(float(np.abs(a.astype(np.float64)).max()),
                      float(np.abs(b.astype(np.float64)).max())) >= _MUL_SAFE:
        raise _Fallback
    return a + b


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if len(a) and float((np.abs(a.astype(np.float64)) * np.abs(b.astype(np.float64))).max()) \
            >= _MUL_SAFE:
        raise _Fallback
    return a * b


def _merge_entries(table: pa.Table, idx: np.ndarray, w: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """One entry per distinct row among ``table``'s entries ``idx``, weights summed.

    A row inserted by several batches into a side without a unique key has an entry
    per batch; push merges them when it reads them, so that its output lists every
    distinct row once, and so does this path.
    """
    if len(idx) < 2:
        return idx, w
    rows = _column(table, "_row").take(pa.array(idx, pa.int64()))
    distinct = pc.unique(rows)
    if len(distinct) == len(idx):
        return idx, w
    g = _group_ids(rows, distinct)
    first = np.full(len(distinct), len(idx), dtype=np.int64)
    np.minimum.at(first, g, np.arange(len(idx), dtype=np.int64))
    return idx[first], _sum_by(g, w, len(distinct))


def _pairs(g_rows: np.ndarray, g_entries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, entry) pair with one group (rows with group -1 pair with nothing)."""
    order = np.argsort(g_entries, kind="stable")
    counts = np.bincount(g_entries, minlength=n).astype(np.int64)
    starts = np.cumsum(counts) - counts
    rows = np.flatnonzero(g_rows >= 0)
    g = g_rows[rows]
    c = counts[g]
    total = int(c.sum())
    first_out = np.cumsum(c) - c
    pos = np.repeat(starts[g] - first_out, c) + np.arange(total, dtype=np.int64)
    return np.repeat(rows, c), order[pos]


def _assemble(join: joinstate.Join, left: pa.Table | None, right: pa.Table | None,
              w: np.ndarray) -> pa.Table:
    """Output rows in the join's output schema; a missing side is null-extended."""
    n = len(w)
    cols: list[pa.Array] = []
    sides = ((left, join.left_side), (right, join.right_side))
    for part, decl in sides[:1] if join.how in ("left_semi", "left_anti") else sides:
        if part is None:
            cols += [pa.nulls(n, f.type) for f in decl.schema]
        else:
            cols += [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                     for c in part.columns]
    cols.append(pa.array(w, pa.int64()))
    return pa.Table.from_arrays(cols, schema=join.output_schema)


def _concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    if not parts:
        return schema.empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
