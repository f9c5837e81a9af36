"""Apply a change batch to a join from snapshots: scans and hash joins instead of probes.

(A pipeline's recompute path is per operator: each join, ``join_all`` and window reads
its input state by one scan of each index instead of by key and computes the same
change set from it, inside the push's one transaction; :func:`recompute_change` runs a
push with every such operator on it, ``population.apply`` chooses per operator.  What
follows is the single join's.)

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

What the batch outputs is decided by :class:`joinstate.joinrule.JoinRule`, the rule
push uses, fed from the snapshots instead of probes.  Its arithmetic is the checked int64
arithmetic of :mod:`joinstate.zset` (exact, or :class:`joinstate.WeightOverflowError`);
a batch it refuses is handed to the incremental path, which validates the batch before
computing anything, so a batch that is also invalid in another way (an over-retraction,
a repeated unique key) raises what push raises.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joinstate import WEIGHT, StateClosedError, WeightOverflowError
from joinstate.joinrule import Crossings, Entries
from joinstate.ops import Strategies
from joinstate.zset import checked_add, checked_sum_by
from population.errors import PopulationError

if TYPE_CHECKING:
    from collections.abc import Callable

    import joinstate
    from joinstate.maintained import Maintained

__all__ = ["output_from_scans", "recompute", "recompute_change", "unavailable"]

log = logging.getLogger(__name__)


def _join_change(target: Maintained, input_name: str, delta: pa.Table | pa.RecordBatch, *,
                 commit_id: str | None, timings: dict[str, float] | None
                 ) -> dict[str, pa.Table]:
    join = cast("joinstate.Join", target)  # the "join" entry of RECOMPUTE
    side: joinstate.SideName = "left" if input_name == "left" else "right"
    return {join.name: recompute(join, side, delta, commit_id=commit_id, timings=timings)}


def _pipeline_change(target: Maintained, input_name: str, delta: pa.Table | pa.RecordBatch,
                     *, commit_id: str | None, timings: dict[str, float] | None
                     ) -> dict[str, pa.Table]:
    """A pipeline push with every operator that has a recompute path on it.

    The operators (joins, ``join_all``, windows) read their input state by whole-index
    scans instead of by key (:meth:`joinstate.ops.base.PushContext.probe`); the rest of
    the push, its one transaction and its commit record are the push's own.
    """
    pipeline = cast("joinstate.Pipeline", target)  # the "pipeline" entry of RECOMPUTE
    chosen = Strategies({label: "recompute"
                         for label in pipeline.recompute_candidates(input_name)})
    outs = pipeline.push(input_name, delta, commit_id=commit_id, strategies=chosen)
    if timings is not None:
        timings["scan_ms"] = sum(r.scan_ms for r in chosen.runs.values())
    return outs


RECOMPUTE: dict[str, Callable[..., dict[str, pa.Table]]] = {
    "join": _join_change, "pipeline": _pipeline_change}
"""The recompute path of each kind of maintained target (``target.kind``).

A pipeline's is per operator (``population.apply`` chooses it per operator and batch);
this entry puts every operator that has one on it."""


def unavailable(target: Maintained) -> str | None:
    """Why ``target`` has no recompute path (None: it has one)."""
    if target.kind in RECOMPUTE:
        return None
    return f"{target.kind}s have no recompute path"


def recompute_change(target: Maintained, input_name: str, delta: pa.Table | pa.RecordBatch,
                     *, commit_id: str | None = None, timings: dict[str, float] | None = None
                     ) -> dict[str, pa.Table]:
    """The recompute path for any target that has one: ``{output: change set}``.

    Same result as ``target.push_change(input_name, delta, commit_id=commit_id)`` (see
    :func:`recompute` for a join).  Raises :class:`~population.PopulationError` for a
    target without one (:func:`unavailable` says why).
    """
    why = unavailable(target)
    if why is not None:
        raise PopulationError(f"{target.kind} {target.name!r}: {why}")
    return RECOMPUTE[target.kind](target, input_name, delta, commit_id=commit_id,
                                  timings=timings)


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
        except WeightOverflowError:
            log.info("join %r, %s side: a weight beyond int64; applying the batch "
                     "incrementally, which validates it first", join.name, side)
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
    otherwise); ``other``: every entry of the other side.  Raises
    :class:`joinstate.WeightOverflowError` when a weight or degree leaves int64.
    """
    pos = 0 if side == "left" else 1
    keys = _column(batch, "_key")
    kset = pc.unique(keys.drop_null())
    n_keys = len(kset)
    group = _group_ids(keys, kset)
    w_batch = _weights(batch)
    g_other = _group_ids(_column(other, "_key"), kset)
    hit = np.flatnonzero(g_other >= 0)  # entries of the other side at the batch's keys
    hit, w_hit = _merge_entries(other, hit, _weights(other)[hit])
    sides = (join.left_side, join.right_side)
    crossings = None
    if own is not None:  # this side's degree per batch key, before and after the batch
        old = _degrees(_group_ids(_column(own, "_key"), kset), _weights(own), n_keys)
        new = checked_add(old, _degrees(group, w_batch, n_keys), "a key's degree")
        crossings = Crossings.of(old, new)
    theirs = _Snapshot(_side_columns(other, sides[1 - pos]), hit, w_hit, g_other[hit], n_keys)
    parts = join.rule.push(pos, _side_columns(batch, sides[pos]), w_batch, group, n_keys,
                           theirs, crossings)
    return join.rule.table(parts)


class _Snapshot:
    """The other side's entries at the batch's keys, from its snapshot.

    The join rule's :class:`~joinstate.joinrule.OtherSide`: the entries are located
    already (``hit``, merged); their rows are taken only if the rule asks for rows (a
    semi join's left push needs the degrees alone).
    """

    __slots__ = ("_entries", "_groups", "_hit", "_n_keys", "_table", "_w")

    def __init__(self, table: pa.Table, hit: np.ndarray, w: np.ndarray, groups: np.ndarray,
                 n_keys: int) -> None:
        self._table, self._hit, self._w, self._groups = table, hit, w, groups
        self._n_keys = n_keys
        self._entries: Entries | None = None

    def entries(self) -> Entries:
        if self._entries is None:
            rows = self._table.take(pa.array(self._hit, pa.int64()))
            self._entries = Entries(rows, self._w, self._groups)
        return self._entries

    def degrees(self) -> np.ndarray:
        return checked_sum_by(self._groups, self._w, self._n_keys, "a key's degree")

    def entries_at(self, groups: np.ndarray) -> Entries:
        return self.entries()


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
    return idx[first], checked_sum_by(g, w, len(distinct), "the multiplicity of a row")


def _degrees(g: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """Total weight per key group ``g`` (-1, a NULL or absent key, counts nowhere)."""
    valid = g >= 0
    return checked_sum_by(g[valid], w[valid], n, "a key's degree")
