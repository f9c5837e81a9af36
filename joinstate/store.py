"""The state store: one RocksDB directory (a shard) holding the state of many joins.

:class:`StateStore` is the :class:`~joinstate.db.Database` plus what it holds: the joins
of its catalog (created, re-attached, verified) and transactions over their indexes.
See :mod:`joinstate.db` for the lifecycle, threading and opening contracts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from joinstate import _rocks
from joinstate import checkpoint as ckpt
from joinstate.db import LAYOUT_VERSION, Database
from joinstate.errors import JoinSpecMismatchError, SchemaMismatchError
from joinstate.join import Join
from joinstate.names import (
    batch_cost_prefix,
    commit_prefix,
    counter_prefix,
    join_spec_key,
    phase_key,
    planner_history_key,
    progress_prefix,
    validate_name,
)
from joinstate.side import Side
from joinstate.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Iterable
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

        Indexes, catalog entry, phase, progress markers, commit records and counters all
        go.  The remedy for an interrupted population that should not be resumed.
        """
        self.require_writable(f"drop join {name!r}")
        with self.lock:
            join = self._attach(name)
            cfs = join.column_families()
            join.detach()
            self._joins.pop(name, None)
            keys = [join_spec_key(name), phase_key(name)]
            keys += self.meta_keys(progress_prefix(name)) + self.meta_keys(commit_prefix(name))
            # What earlier runs measured belongs to this join too: a new join of the same
            # name must not plan from it.
            keys += self.meta_keys(batch_cost_prefix(name))
            if self.meta_get(planner_history_key(name)) is not None:
                keys.append(planner_history_key(name))
            for cf in cfs:
                keys += self.meta_keys(counter_prefix(cf))
            self.drop_column_families(cfs)
            txn = Transaction(self)
            for key in keys:
                txn.record(key, None)
            txn.commit()
            self.forget_counters(cfs)

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
        """Read every block of every column family and check every join's counters.

        Returns ``{"column_families": {name: entries}, "joins": {name: per-side
        counts}}``; raises :class:`~joinstate.errors.StateCorruptedError` if a block
        fails its checksum or a count disagrees with its counter.
        """
        with self.lock:
            entries = {
                cf: len(_rocks.iter_keys(self.cf(cf), self.path, f"verify {cf}"))
                for cf in self.column_families() if cf != "default"
            }
            joins = {name: self.join(name).verify() for name in self.joins()}
        return {"column_families": entries, "joins": joins}

    # ---- checkpoints (see joinstate.checkpoint) ------------------------------------------

    def last_sequence(self) -> int:
        """RocksDB's sequence number of the last write (unchanged by reopening or reading)."""
        with self.lock, _rocks.rocks_errors(self.path, "read the sequence number"):
            return int(self._require_open().latest_sequence_number())

    def checkpoint(self, uri: str, *, keep: int = 3, protect: Iterable[str] = (),
                   filesystem: pafs.FileSystem | None = None) -> ckpt.CheckpointInfo:
        """Copy the store as of now to ``uri``, uploading only files not already there.

        ``uri`` is a local path or a ``pyarrow.fs`` URI (``s3://bucket/prefix``,
        ``hdfs://...``); with ``filesystem`` it is a path in that filesystem.  One store
        per location.  Pushes wait only while RocksDB links the live files (a memtable
        flush); the upload runs without the lock.  The newest ``keep`` checkpoints and
        those whose ids are in ``protect`` are kept, older ones deleted.  Returns the new
        checkpoint (``transferred``: the files uploaded).  See :mod:`joinstate.checkpoint`.
        """
        self.require_writable(f"checkpoint to {uri}")
        loc = ckpt.Location.of(uri, filesystem)
        keep = ckpt.check_keep(keep)
        with self.lock:
            staging, sequence = ckpt.snapshot(self._require_open(), self.path)
        return ckpt.upload(staging, self.path, loc, sequence, keep=keep, protect=protect)

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
