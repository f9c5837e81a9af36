"""The exception hierarchy: one root, builtin mixins, and messages that name the culprit.

Every error raised on purpose by the project derives from :class:`JoinStateError`, so a
caller can catch the whole family with one ``except``.  Subclasses also derive from the
closest builtin (``ValueError``, ``RuntimeError`` ...) so code that predates this library
still behaves sensibly.
"""

from __future__ import annotations

__all__ = [
    "JoinSpecMismatchError",
    "JoinStateError",
    "OptionsError",
    "OverRetractionError",
    "SchemaMismatchError",
    "StateClosedError",
    "StateCorruptedError",
    "StateLockedError",
    "StateReadOnlyError",
    "UniqueKeyViolationError",
]


class JoinStateError(Exception):
    """Root of every error this project raises deliberately."""


class OptionsError(JoinStateError, ValueError):
    """An option value is out of range or inconsistent; the message lists every bad field."""


class SchemaMismatchError(JoinStateError, ValueError):
    """A delta or a join spec does not fit the declared schema; the message names the column."""


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

