"""The exception hierarchy: one root, builtin mixins, and messages that name the culprit.

Every error raised on purpose by the project derives from :class:`JoinStateError`, so a
caller can catch the whole family with one ``except``.  Subclasses also derive from the
closest builtin (``ValueError``, ``RuntimeError`` ...) so code that predates this library
still behaves sensibly.
"""

from __future__ import annotations

__all__ = [
    "BulkWriteRefused",
    "CheckpointCorruptedError",
    "CheckpointIOError",
    "CheckpointNotFoundError",
    "CheckViolationError",
    "CommitConflictError",
    "ExpressionError",
    "JoinSpecMismatchError",
    "JoinStateError",
    "NotAStateStoreError",
    "OptionsError",
    "OverRetractionError",
    "SchemaMismatchError",
    "StateClosedError",
    "StateCorruptedError",
    "StateLockedError",
    "StateIOError",
    "StateReadOnlyError",
    "UniqueKeyViolationError",
    "WeightOverflowError",
]


class JoinStateError(Exception):
    """Root of every error this project raises deliberately."""


class OptionsError(JoinStateError, ValueError):
    """An option value is out of range or inconsistent; the message lists every bad field."""


class SchemaMismatchError(JoinStateError, ValueError):
    """A delta or a join spec does not fit the declared schema; the message names the column."""


class ExpressionError(JoinStateError, ValueError):
    """An operator's expression failed on the pushed rows; nothing of the push was applied.

    Integer overflow, a failed cast, a division Arrow refuses.  The message names the
    operator and its expressions.
    """


class CheckViolationError(JoinStateError, ValueError):
    """A push would give a checked stream a row its check refuses; nothing was applied.

    A pipeline declares such a check where SQL raises on data rather than on the query:
    a scalar subquery that returns more than one row.  The message says what the check
    requires and the remedy.
    """


class JoinSpecMismatchError(JoinStateError, ValueError):
    """``store.join(name, ...)`` was called with a spec that differs from the stored one."""


class OverRetractionError(JoinStateError, ValueError):
    """A batch would take a row's multiplicity below zero; nothing of the batch was applied."""


class UniqueKeyViolationError(JoinStateError, ValueError):
    """A batch would leave two rows (or two copies of one row) under one declared unique key."""


class StateLockedError(JoinStateError, RuntimeError):
    """The RocksDB directory is already open, in this process or another one."""


class StateClosedError(JoinStateError, RuntimeError):
    """The store (or a join bound to it) was used after ``close()``."""


class StateCorruptedError(JoinStateError, RuntimeError):
    """Stored bytes do not decode as the catalog says they should."""


class StateReadOnlyError(JoinStateError, PermissionError):
    """A write was attempted through a store opened with ``read_only=True``."""



class WeightOverflowError(JoinStateError, OverflowError):
    """A weight, a product of weights or a counter would leave the int64 range.

    Weights are int64 (the ``_weight`` column); the engine checks every sum and product
    it forms instead of letting them wrap, and applies nothing of the batch.
    """


class CommitConflictError(JoinStateError, ValueError):
    """A ``commit_id`` was reused for a different side or a different change set."""


class StateIOError(JoinStateError, OSError):
    """RocksDB could not read or write its files (disk full, permissions, I/O error).

    The batch that hit it was not applied; the store can still be closed, and reopening
    it resumes from the last committed batch.
    """


class NotAStateStoreError(JoinStateError, FileExistsError):
    """The path is not a joinstate store and cannot become one without destroying data.

    Raised for a regular file (or a path under one), a non-empty directory that holds
    something other than a joinstate store, and RocksDB files without a ``CURRENT``
    file (a damaged database, which opening would silently replace by an empty one).
    """


class BulkWriteRefused(JoinStateError, RuntimeError):
    """A batch cannot go to a bulk (SST) sink: staging it had to read stored state.

    Retractions, degree updates and unique keys that may already be stored are checked
    by reading RocksDB, which cannot see writes still pending in a sink.  Nothing was
    written; make pending writes visible (ingest them), then apply without the sink.
    """


class CheckpointNotFoundError(JoinStateError, FileNotFoundError):
    """No checkpoint (or not the one asked for) exists at the checkpoint location.

    A location holds only checkpoints whose manifest was written completely: files of an
    upload that never finished are not a checkpoint.  The message lists what exists.
    """


class CheckpointCorruptedError(StateCorruptedError):
    """A checkpoint's manifest or one of its files does not match what was recorded.

    Raised by a restore, before anything is written to the target directory: a file is
    missing, has another size, or fails its xxh3-128 checksum, or the manifest itself is
    damaged.  Nothing is restored from such a checkpoint; restore an older one by id.
    """


class CheckpointIOError(StateIOError):
    """The checkpoint location could not be read or written (network, credentials, space).

    A checkpoint that fails this way was not taken: the previous one is still the latest
    and intact, because a checkpoint's manifest is written only after all of its files.
    """
