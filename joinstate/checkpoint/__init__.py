"""Checkpoints: a state store copied to durable storage through :mod:`pyarrow.fs`, and back.

A checkpoint is a consistent copy of one store's RocksDB directory as of one commit,
kept at a *location* (:mod:`joinstate.checkpoint.location`): a directory on any
filesystem pyarrow reaches (a local path, an NFS mount, ``s3://``, ``gs://``,
``hdfs://``)::

    <location>/objects/<xxh3-128 hex>-<size>          every file, named by its content
    <location>/checkpoints/<generation>-<token>.json  one manifest per checkpoint

**Taking one** (:meth:`joinstate.StateStore.checkpoint`):

1. Under the store's lock, RocksDB's checkpoint facility flushes the memtables and
   hard-links the live files into a staging folder inside the store, at one sequence
   number.  SST files are immutable, so linking them is a consistent copy that copies
   nothing.
2. Each file's xxh3-128 checksum (cached per file by name, size, mtime and inode) names
   its object.  An object already at the location with the same size is not uploaded
   again once it is known intact: by default it is read back and checksummed first
   (``verify="all"``; ``"changed"`` reads back only objects whose listed size or
   modification time changed since this store uploaded or read them), and a copy that
   rotted at the location is uploaded again from the store's file.  So a checkpoint
   uploads the SSTs written since the previous one and the small files that changed
   (RocksDB's MANIFEST, OPTIONS, CURRENT), and never references a damaged object.
3. A name under ``objects/`` is always a complete file: object stores (S3, GCS) publish
   an object only when its upload completes; elsewhere (local, HDFS) the file is written
   under a hidden temporary name and renamed.
4. The manifest (every file's name, size and checksum, the RocksDB sequence number, its
   own checksum) is written **last**.  A checkpoint exists once its manifest does, so an
   upload that stops midway (an exception, ``kill -9``, a lost machine) leaves the
   previous checkpoint the latest one, intact.
5. Retention: the newest ``keep`` manifests, and those in ``protect``, stay; older ones
   are deleted, then every object no remaining manifest references (files of dropped
   checkpoints, leftovers of interrupted uploads).  A failure here is logged: the new
   checkpoint is already complete.

**Restoring one** (:meth:`joinstate.StateStore.restore`, :func:`restore`) downloads into a
hidden folder beside the target, checks every file's size and checksum against the
manifest, and only then swaps the folder into place (an atomic exchange of the two
directories where the system has one): a damaged checkpoint raises
:class:`~joinstate.errors.CheckpointCorruptedError`, naming the checkpoints that do not
use the damaged file, and the target stays as it was.  A store being replaced must not
be open for writing: the restore holds its LOCK throughout (refusing with
:class:`~joinstate.errors.StateLockedError` if a writer has it), so no writer's files are
swapped away under it.  Files the old target already holds with the recorded size and
checksum are linked instead of downloaded (a working copy that is a little behind
downloads only the difference).

Derived files kept beside a store (entry maps and probe-cache decisions, see
:meth:`joinstate.db.Database.save_arrays`) are not part of a checkpoint: they describe
the in-memory state as of the last close, rarely the checkpointed one.  A restored store
rebuilds them as any store opened without them does (a bag side's retractions seek until
a scan rebuilds its entry map).

**Working copies.**  A store records which checkpoint it is a copy of
(``checkpoint/state.json`` inside the store directory: the checkpoint id, the location,
RocksDB's sequence number at that checkpoint).  :mod:`joinstate.working_copy` opens a
working copy only if it is exactly a given checkpoint (same id, no write since: same
sequence number) and restores that checkpoint otherwise: this is how a store moves
between machines (``spark_io`` does it for every shard).

One writer per location: two stores checkpointing into one location delete each other's
files.  Give every store its own location (:func:`child_uri`).
"""

from joinstate.checkpoint.local import LOCAL_DIR, LocalCheckpoint, local_checkpoint
from joinstate.checkpoint.location import (
    DEFAULT_KEEP,
    FORMAT,
    CheckpointFile,
    CheckpointInfo,
    Location,
    Verify,
    check_keep,
    check_verify,
    child_uri,
    latest_checkpoint,
    list_checkpoints,
)
from joinstate.checkpoint.restoring import is_replaceable, restore
from joinstate.checkpoint.taking import snapshot, upload

__all__ = [
    "DEFAULT_KEEP",
    "FORMAT",
    "LOCAL_DIR",
    "CheckpointFile",
    "CheckpointInfo",
    "LocalCheckpoint",
    "Location",
    "Verify",
    "check_keep",
    "check_verify",
    "child_uri",
    "is_replaceable",
    "latest_checkpoint",
    "list_checkpoints",
    "local_checkpoint",
    "restore",
    "snapshot",
    "upload",
]
