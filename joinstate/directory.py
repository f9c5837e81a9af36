"""A store directory before RocksDB opens it: one writer at a time, and what it holds.

**One writer per directory.**  RocksDB takes a POSIX record lock (fcntl ``F_SETLK``) on
``<dir>/LOCK`` when it opens a database for writing.  Such locks belong to the
*process*: a second lock attempt from the same process succeeds, and closing any
descriptor of the file releases the process's lock.  So writers inside this process are
tracked here, by resolved path (:func:`claim`, :func:`release`), and a restore that
replaces a directory (which must keep every writer out without opening the database)
locks ``<dir>/LOCK`` itself only once no writer of this process has it
(:func:`hold_directory`).

**Opening never destroys anything** (:func:`check_directory`): a new store is created
only in a missing or empty directory; a directory holding RocksDB files without
``CURRENT``, or anything else, is refused before a byte is written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import weakref
from typing import TYPE_CHECKING

from joinstate import _rocks
from joinstate.errors import NotAStateStoreError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

__all__ = ["check_directory", "claim", "hold_directory", "lock_file", "release"]

_ROCKSDB_FILES = ("CURRENT", "IDENTITY", "LOCK", "LOG")
_ROCKSDB_PREFIXES = ("MANIFEST-", "OPTIONS-", "LOG.old")
_ROCKSDB_SUFFIXES = (".sst", ".log", ".blob")

_HELD: dict[str, tuple[str, weakref.ref[object] | None]] = {}
"""Resolved directory -> who in this process holds it: ``"this process"`` and the store
(an open read-write store; a weak reference, so a store dropped without ``close()``
frees its entry when RocksDB lets its lock go) or ``"a restore in this process"``."""
_HELD_GUARD = threading.Lock()


def _held_key(path: Path) -> str:
    return str(path.resolve())


def claim(path: Path, what: str, store: object | None = None) -> str:
    """Register ``path`` as held by ``store`` (None: a restore), or raise StateLockedError."""
    key = _held_key(path)
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and (held[1] is None or held[1]() is not None):
            raise _rocks.locked_error(path, what, held[0])
        _HELD[key] = (("this process", weakref.ref(store)) if store is not None
                      else ("a restore in this process", None))
    return key


def release(key: str, store: object | None = None) -> None:
    """End the hold of ``key`` by ``store`` (None: a restore's)."""
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and (held[1]() if held[1] is not None else None) is store:
            del _HELD[key]


def lock_file(lock: Path, store: Path, what: str) -> int:
    """Take RocksDB's lock on ``lock`` (created if missing) the way RocksDB does.

    Returns the open descriptor: closing it releases the lock.  Raises
    :class:`~joinstate.errors.StateLockedError` if another process holds it.
    """
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise _rocks.locked_error(store, what, "another process") from exc
        raise
    return fd


@contextlib.contextmanager
def hold_directory(path: Path, what: str) -> Iterator[list[int]]:
    """Be the one writer of store directory ``path`` without opening it (a restore).

    Inside the block no store of this process opens ``path`` for writing, and, if it
    holds a database, no other process can (its LOCK is held).  Raises
    :class:`~joinstate.errors.StateLockedError` naming the holder if a writer has it.
    The yielded list takes more lock descriptors to close at the end (a restore locks
    the directory that replaces ``path`` too, so the lock survives the swap).
    """
    key = claim(path, what)
    fds: list[int] = []
    try:
        if (path / "CURRENT").exists() or (path / "LOCK").exists():
            fds.append(lock_file(path / "LOCK", path, what))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
        release(key)


def _looks_like_rocksdb(name: str) -> bool:
    return (name in _ROCKSDB_FILES or name.startswith(_ROCKSDB_PREFIXES)
            or name.endswith(_ROCKSDB_SUFFIXES))


def check_directory(path: Path, read_only: bool) -> bool:
    """Decide whether ``path`` may be opened; returns whether a new store is created.

    Raises :class:`NotAStateStoreError` (touching nothing) for anything that is not a
    joinstate store and is not empty.
    """
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            where = "is" if parent == path else f"is under {parent}, which is"
            raise NotAStateStoreError(
                f"state store path {path} {where} a regular file, not a directory; choose "
                "a directory path"
            )
        if parent.exists():
            break
    if not path.exists():
        if read_only:
            raise NotAStateStoreError(
                f"no state store at {path} to open read-only; create it with a writer first"
            )
        return True
    names = sorted(p.name for p in path.iterdir())
    if "CURRENT" in names:
        return False
    if not names:
        if read_only:
            raise NotAStateStoreError(f"{path} is empty: no state store to open read-only")
        return True
    rocks = [n for n in names if _looks_like_rocksdb(n)]
    if rocks:
        raise NotAStateStoreError(
            f"{path} holds RocksDB files ({', '.join(rocks[:4])}"
            f"{' ...' if len(rocks) > 4 else ''}) but no CURRENT file: the database is "
            "damaged, and opening it would replace it by an empty one. Nothing was changed; "
            "restore CURRENT (it names the latest MANIFEST file) or the directory from a copy"
        )
    raise NotAStateStoreError(
        f"{path} is a non-empty directory that is not a joinstate state store (it holds "
        f"{', '.join(names[:4])}{' ...' if len(names) > 4 else ''}); choose an empty or new "
        "directory"
    )
