"""The state store: one RocksDB directory (a shard) holding the state of many joins.

:class:`StateStore` is the :class:`~joinstate.db.Database` plus what it holds: the joins
of its catalog (created, re-attached, verified) and transactions over their indexes.
See :mod:`joinstate.db` for the lifecycle, threading and opening contracts.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import pyarrow as pa

from joinstate import _rocks
from joinstate import checkpoint as ckpt
from joinstate._source_rows import check_record
from joinstate.codec import RowCodec
from joinstate.db import LAYOUT_VERSION, Database
from joinstate.errors import JoinSpecMismatchError, SchemaMismatchError, StateCorruptedError
from joinstate.join import Join
from joinstate.keys import KeyCodec
from joinstate.layouts import BagLayout
from joinstate.names import (
    aggregate_values_cf,
    batch_cost_prefix,
    commit_prefix,
    counter_prefix,
    initial_outputs_key,
    join_spec_key,
    nulls_cf,
    phase_key,
    pipeline_column_families,
    pipeline_owner,
    pipeline_spec_key,
    planner_history_key,
    progress_prefix,
    source_rows_of,
    validate_name,
    view_sql_key,
)
from joinstate.side import Side
from joinstate.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from pathlib import Path

    import pyarrow.fs as pafs

    from joinstate.join import How
    from joinstate.options import StoreOptions

__all__ = ["LAYOUT_VERSION", "StateStore"]


class Attached(Protocol):
    """An owner of column families with derived in-memory state (a pipeline).

    The store saves its derived state and detaches it on close.
    """

    name: str

    def detach(self) -> None:
        """Save derived state; the object becomes unusable."""


class StateStore(Database):
    """A RocksDB directory with the state of one or more joins.

    Use as a context manager, or call :meth:`close` explicitly.  ``read_only=True`` opens
    a store another process is writing (no LOCK; the writer's committed pushes as of the
    open are visible) for inspection.  Safe to share between threads (see
    :mod:`joinstate.db`).
    """

    def __init__(
        self, path: str | Path, options: StoreOptions | None = None, *, read_only: bool = False
    ) -> None:
        self._joins: dict[str, Join] = {}
        self._pipelines: dict[str, Attached] = {}
        super().__init__(path, options, read_only=read_only)

    def _detach(self) -> None:
        for j in self._joins.values():
            j.detach()
        self._joins.clear()
        for p in self._pipelines.values():
            p.detach()
        self._pipelines.clear()

    def register(self, pipeline: Attached) -> None:
        """Attach a compiled pipeline: the store saves its derived state on close.

        One pipeline object per name and open store: two objects over the same column
        families would keep diverging in-memory state (key sets, probe caches).
        """
        self._require_open()
        with self.lock:
            existing = self._pipelines.get(pipeline.name)
            if existing is not None and existing is not pipeline:
                raise SchemaMismatchError(
                    f"pipeline {pipeline.name!r} is already open on this store; use that "
                    "object (or close the store and reopen it)"
                )
            self._pipelines[pipeline.name] = pipeline

    def transaction(self) -> Transaction:
        """A new transaction against this store (see :mod:`joinstate.transaction`)."""
        self._require_open()
        return Transaction(self)

    # ---- joins ------------------------------------------------------------------------

    def join(
        self, name: str, left: Side | None = None, right: Side | None = None,
        how: How | Literal["inner"] = "inner",
        suffixes: tuple[str, str] = ("", "_right"),
    ) -> Join:
        """Create the join ``name``, or re-attach to it if the store already has it.

        With ``left`` and ``right``, the spec must equal the stored one (schemas, keys,
        unique keys, how, suffixes), else :class:`~joinstate.errors.JoinSpecMismatchError`.
        Without them, the join is re-attached from the catalog as it was created (for
        inspection and tools that do not know the schemas).
        """
        self._require_open()
        validate_name("join", name)
        with self.lock:
            if left is None and right is None:
                return self._attach(name)
            if left is None or right is None:
                raise SchemaMismatchError(
                    f"join {name!r}: give both sides (left= and right=) to create it, or "
                    "neither to re-attach it from the catalog"
                )
            existing = self._joins.get(name)
            j = Join(self, name, left, right, how, suffixes)
            if existing is not None:
                if existing.spec != j.spec:
                    j.raise_spec_mismatch(existing.spec)
                return existing
            self._joins[name] = j
            return j

    def drop_join(self, name: str) -> None:
        """Delete join ``name`` and all of its state (irreversible).

        Indexes, catalog entry, phase, progress markers, commit records, counters, what
        the planner measured and derived files all go, in one crash-safe step
        (:meth:`~joinstate.db.Database.drop_durably`).  The remedy for an interrupted
        population that should not be resumed.
        """
        self.require_writable(f"drop join {name!r}")
        with self.lock:
            join = self._attach(name)
            cfs = join.column_families()
            join.detach()
            self._joins.pop(name, None)
            # What earlier runs measured belongs to this join too: a new join of the same
            # name must not plan from it.
            exact = {join_spec_key(name), phase_key(name), planner_history_key(name)}
            prefixes = (progress_prefix(name), commit_prefix(name), batch_cost_prefix(name),
                        *(counter_prefix(cf) for cf in cfs))
            keys = [k for k in self.meta_keys(b"") if k in exact or k.startswith(prefixes)]
            self.drop_durably(cfs, [(k, None) for k in keys])

    def drop_pipeline(self, name: str) -> None:
        """Delete pipeline ``name`` and all of its state (irreversible).

        Every column family of the pipeline (indexes, aggregates, source row records:
        :func:`joinstate.names.pipeline_column_families`), its catalog entry and SQL,
        phase, progress markers, commit records, counters, what the planner measured,
        batch costs and derived files go, in one crash-safe step.  An open
        :class:`~joinstate.Pipeline` object of that name becomes unusable; the name can
        then be defined again, with any definition.  The remedy for an interrupted
        population that should not be resumed.  Raises
        :class:`~joinstate.errors.JoinSpecMismatchError` if the store holds nothing of
        such a pipeline.
        """
        validate_name("pipeline", name)
        self.require_writable(f"drop pipeline {name!r}")
        with self.lock:
            owner = pipeline_owner(name)
            cfs = pipeline_column_families(self.column_families(), name)
            exact = {pipeline_spec_key(name), view_sql_key(name), initial_outputs_key(name),
                     phase_key(owner), planner_history_key(owner)}
            prefixes = (progress_prefix(owner), commit_prefix(owner), batch_cost_prefix(owner),
                        *(counter_prefix(cf) for cf in cfs))
            keys = [k for k in self.meta_keys(b"") if k in exact or k.startswith(prefixes)]
            if not cfs and not keys:
                raise JoinSpecMismatchError(
                    f"pipeline {name!r} does not exist in {self.path} (pipelines there: "
                    f"{self._pipeline_names()}); nothing was dropped"
                )
            attached = self._pipelines.pop(name, None)
            if attached is not None:
                attached.detach()
            self.drop_durably(cfs, [(k, None) for k in keys])

    def _pipeline_names(self) -> list[str]:
        prefix = pipeline_spec_key("")
        return sorted(k[len(prefix):].decode() for k in self.meta_keys(prefix))

    def _attach(self, name: str) -> Join:
        existing = self._joins.get(name)
        if existing is not None:
            return existing
        spec = self.catalog_get(name)
        if spec is None:
            raise JoinSpecMismatchError(
                f"join {name!r} does not exist in {self.path} (joins there: {self.joins()}); "
                "create it with store.join(name, left=Side(...), right=Side(...))"
            )
        left, right = (Side.from_spec(spec[s], s) for s in ("left", "right"))
        j = Join(self, name, left, right, spec["how"], tuple(spec["suffixes"]))
        self._joins[name] = j
        return j

    def verify(self) -> dict[str, Any]:
        """Read every block of every column family; check every join's and pipeline's state.

        Returns ``{"column_families": {name: entries}, "joins": {name: per-side
        counts}, "pipelines": {name: {"indexes": ..., "aggregates": ...,
        "source_rows": ...}}}`` (see :func:`_verify_pipeline`); raises
        :class:`~joinstate.errors.StateCorruptedError` if a block fails its checksum, a
        count disagrees with its counter, or derived state disagrees with what it was
        derived from.  Needs no pipeline definition: what is checked is read from the
        store.
        """
        with self.lock:
            families = [cf for cf in self.column_families() if cf != "default"]
            pipelines = self._pipeline_names()
            heads: dict[str, np.ndarray] = {}
            for name in pipelines:
                for cf in _counted_families(self, name, families):
                    heads[cf] = self._scan_counts(cf)
            entries = {cf: len(heads[cf]) if cf in heads else
                       len(_rocks.iter_keys(self.cf(cf), self.path, f"verify {cf}"))
                       for cf in families}
            joins = {name: self.join(name).verify() for name in self.joins()}
            checked = {name: _verify_pipeline(self, name, families, entries, heads)
                       for name in pipelines}
        return {"column_families": entries, "joins": joins, "pipelines": checked}

    def _scan_counts(self, cf: str) -> np.ndarray:
        """The int64 at the head of every value of ``cf`` (a bag count, a multiplicity)."""
        _, heads = _rocks.iter_keys_heads(self.cf(cf), 8, self.path, f"verify {cf}")
        if any(len(h) != 8 for h in heads):
            raise StateCorruptedError(
                f"{cf} in {self.path} holds a value shorter than its 8-byte count: the "
                "state is corrupted; restore it from a copy or repopulate")
        return np.frombuffer(b"".join(heads), "<i8").astype(np.int64)

    # ---- checkpoints (see joinstate.checkpoint) ------------------------------------------

    def last_sequence(self) -> int:
        """RocksDB's sequence number of the last write (unchanged by reopening or reading)."""
        with self.lock, _rocks.rocks_errors(self.path, "read the sequence number"):
            return int(self._require_open().latest_sequence_number())

    def checkpoint(self, uri: str, *, keep: int = 3, protect: Iterable[str] = (),
                   filesystem: pafs.FileSystem | None = None,
                   verify: ckpt.Verify = "all") -> ckpt.CheckpointInfo:
        """Copy the store as of now to ``uri``, uploading only files not already there.

        ``uri`` is a local path or a ``pyarrow.fs`` URI (``s3://bucket/prefix``,
        ``hdfs://...``); with ``filesystem`` it is a path in that filesystem.  One store
        per location.  Pushes wait only while RocksDB links the live files (a memtable
        flush); the upload runs without the lock.  A file already at the location is
        reused only once read back intact (``verify="all"``, the default), or, with
        ``verify="changed"``, while the location lists it as when this store last knew
        it intact (see :data:`joinstate.checkpoint.Verify`); a damaged copy is uploaded
        again.  The newest ``keep`` checkpoints and those whose ids are in ``protect``
        are kept, older ones deleted.  Returns the new checkpoint (``transferred``: the
        files uploaded; ``verified``: those read back; ``repaired``: those uploaded again
        because the location's copy was damaged).  See :mod:`joinstate.checkpoint`.
        """
        self.require_writable(f"checkpoint to {uri}")
        self.create_pending()  # a checkpoint holds every family the store has
        loc = ckpt.Location.of(uri, filesystem)
        keep = ckpt.check_keep(keep)
        verify = ckpt.check_verify(verify)
        with self.lock:
            staging, sequence = ckpt.snapshot(self._require_open(), self.path)
        return ckpt.upload(staging, self.path, loc, sequence, keep=keep, protect=protect,
                           verify=verify)

    @classmethod
    def restore(cls, uri: str, path: str | Path, options: StoreOptions | None = None, *,
                checkpoint: str | None = None, replace: bool = False, read_only: bool = False,
                filesystem: pafs.FileSystem | None = None) -> StateStore:
        """Restore a checkpoint of ``uri`` into ``path`` and open it there.

        ``checkpoint``: an id (default: the latest).  ``path`` must be missing or empty,
        or ``replace=True`` replaces the (closed) store there.  Every file is checked
        against the checkpoint's manifest before anything lands in ``path``; a damaged
        checkpoint raises :class:`~joinstate.errors.CheckpointCorruptedError`, a missing
        one :class:`~joinstate.errors.CheckpointNotFoundError`.  Use the result as a
        context manager, like any store.
        """
        ckpt.restore(uri, path, checkpoint=checkpoint, replace=replace, filesystem=filesystem)
        return cls(path, options, read_only=read_only)


# ---- verifying a pipeline from the store alone ---------------------------------------------


def _counted_families(store: StateStore, name: str, families: Sequence[str]) -> list[str]:
    """Pipeline ``name``'s families whose every value starts with an int64 count.

    Bag entries and min/max multiplicities.  An index stores bag entries unless it
    indexes a source with a unique key (then one entry per row, the row alone); its
    NULL-key family is always a bag.  Told from the stored definition alone.
    """
    spec = json.loads(store.meta_get(pipeline_spec_key(name)) or b"{}")
    unique = {str(n.get("name")) for n in spec.get("nodes", [])
              if n.get("kind") == "source" and n.get("unique_key")}
    prefix = f"ix.{name}~"
    out = []
    for cf in pipeline_column_families(families, name):
        if cf.endswith((".nulls", ".minmax")):
            out.append(cf)
        elif cf.startswith(prefix) and cf.endswith("]"):
            # The stream a pipeline index is named after: a source's name, or an
            # operator's label (``join3``), up to the reader or the key.
            stream = re.match(r"[A-Za-z0-9_\-]*", cf[len(prefix):])
            if stream is None or stream.group(0) not in unique:
                out.append(cf)
    return out


def _verify_pipeline(store: StateStore, name: str, families: Sequence[str],
                     entries: Mapping[str, int], heads: Mapping[str, np.ndarray]
                     ) -> dict[str, Any]:
    """Check pipeline ``name``'s families against their counters; return what was counted.

    Needs only the stored definition: an index of a source with a unique key stores one
    entry per row (``rows`` equals ``entries``); any other index stores bag entries whose
    counts (``heads``: see :func:`_counted_families`) sum to ``rows``; its NULL-key
    family is a bag too.  An aggregate's ``entries``
    counter counts its groups, its min/max family's counters its (group, value) entries
    and their multiplicities.  A source's row record checks itself.  An entry map saved
    beside the store for a bag family must list exactly the family's entries (it decides
    retractions without reading once loaded).  Returns ``{"indexes": {cf: {"rows",
    "entries", "null_rows", "null_entries"}}, "aggregates": {cf: {"groups"[, "values",
    "value_rows"]}}, "source_rows": {cf: {...}}}``.
    """
    where = f"pipeline {name!r} in {store.path}"
    remedy = (f"the state is inconsistent: restore it from a copy, or drop it "
              f"(store.drop_pipeline({name!r})) and populate again")

    def check(cf: str, what: str, counter: str, got: int) -> None:
        want = store.counter(cf, counter)
        if got != want:
            raise StateCorruptedError(
                f"{where}: {cf} holds {got:,} {what} but its {counter!r} counter says "
                f"{want:,}; {remedy}")

    def summed(cf: str) -> int:
        return int(heads[cf].sum()) if len(heads[cf]) else 0

    prefix = f"ix.{name}~"
    out: dict[str, dict[str, Any]] = {"indexes": {}, "aggregates": {}, "source_rows": {}}
    for cf in pipeline_column_families(families, name):
        if cf.startswith(prefix) and cf.endswith("]"):
            bag = cf in heads
            rows = summed(cf) if bag else entries[cf]
            nulls = nulls_cf(cf)
            counted = {"rows": rows, "entries": entries[cf],
                       "null_rows": summed(nulls) if nulls in heads else 0,
                       "null_entries": entries.get(nulls, 0)}
            check(cf, "entries", "entries", counted["entries"])
            check(cf, "rows", "rows", rows)
            if nulls in heads:
                check(nulls, "entries", "entries", counted["null_entries"])
                check(nulls, "rows", "rows", counted["null_rows"])
            for bag_cf in ([cf] if bag else []) + ([nulls] if nulls in heads else []):
                _check_saved_map(store, bag_cf, where, remedy)
            out["indexes"][cf] = counted
        elif cf.startswith("agg[") and cf.endswith("]"):
            agg: dict[str, int] = {"groups": entries[cf]}
            check(cf, "groups", "entries", entries[cf])
            values = aggregate_values_cf(cf[len("agg["):-1])
            if values in heads:
                agg["values"], agg["value_rows"] = entries[values], summed(values)
                check(values, "(group, value) entries", "entries", agg["values"])
                check(values, "values counted", "rows", agg["value_rows"])
            out["aggregates"][cf] = agg
        elif source_rows_of(cf) is not None:
            out["source_rows"][cf] = check_record(store, cf)
    return out


def _check_saved_map(store: StateStore, cf: str, where: str, remedy: str) -> None:
    """The entry map saved for bag family ``cf``, if a writer would load it, must be exact.

    Loaded through the layout's own rules (same stamp, same checks), then compared with
    the entries read from the family; no row is decoded, so no schema is needed.
    """
    layout = BagLayout(store, cf, where, [], KeyCodec([], [], cf), RowCodec(pa.schema([])))
    try:
        layout.check_derived()
    except StateCorruptedError as exc:
        files = ", ".join(str(f) for f in store.derived_files([cf])) or "none left"
        raise StateCorruptedError(
            f"{where}: the entry map saved beside the store for {cf} lists other entries "
            f"than the family holds. Delete the family's derived files ({files}): "
            f"derived state is rebuilt when needed; if the store was written with it "
            f"loaded, {remedy}"
        ) from exc
