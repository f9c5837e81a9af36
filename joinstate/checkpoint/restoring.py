"""Restoring a checkpoint: download, check every file, swap the directory in atomically.

Downloads into a hidden folder beside the target (linking files the old target holds
with the recorded size and checksum), checks every file against the manifest, and only
then exchanges the folder with the target, holding the target's LOCK throughout so that
no writer's files are swapped away under it.  A damaged checkpoint raises
:class:`~joinstate.errors.CheckpointCorruptedError` naming the checkpoints that do not
use the damaged file; the target stays as it was.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from joinstate.checkpoint.local import LOCAL_DIR, Checksums, file_checksum, write_marker
from joinstate.checkpoint.location import (
    MANIFESTS,
    CheckpointFile,
    CheckpointInfo,
    Damaged,
    Location,
    fs_errors,
    info_of,
    manifest_ids,
    parallel,
    read_manifest,
    read_object,
)
from joinstate.directory import hold_directory, lock_file
from joinstate.errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    NotAStateStoreError,
    StateLockedError,
)

__all__ = [
    "is_replaceable",
    "restore",
]

log = logging.getLogger(__name__)


def is_replaceable(path: Path) -> bool:
    """Whether ``path`` holds a joinstate store or working copy (never anything else)."""
    names = {p.name for p in path.iterdir()}
    return not names or "CURRENT" in names or LOCAL_DIR in names


def _check_target(target: Path, replace: bool) -> None:
    for parent in (target, *target.parents):
        if parent.exists() and not parent.is_dir():
            raise NotAStateStoreError(
                f"cannot restore into {target}: {parent} is a regular file; choose a "
                "directory path")
        if parent.exists():
            break
    if not target.exists() or not any(target.iterdir()):
        return
    if not replace:
        raise NotAStateStoreError(
            f"cannot restore into {target}: the directory is not empty; restore into a "
            "missing or empty directory, or pass replace=True to replace the store there "
            "(closed in every process)")
    if not is_replaceable(target):
        raise NotAStateStoreError(
            f"cannot restore into {target}: it holds files that are not a joinstate store "
            "(no CURRENT); nothing was changed; choose another directory")


def _clean_leftovers(target: Path) -> None:
    """Folders of restores that a crash interrupted (hidden siblings of ``target``).

    Called with ``target`` held; a folder whose LOCK another process holds is a restore
    running there (into a ``target`` that was missing), not a leftover.
    """
    if not target.parent.exists():
        return
    for pattern in (f".{target.name}.restore-*", f".{target.name}.replaced-*"):
        for p in target.parent.glob(pattern):
            try:
                os.close(lock_file(p / "LOCK", p, "clean up"))
            except (StateLockedError, OSError):
                continue
            shutil.rmtree(p, ignore_errors=True)


def _get_file(loc: Location, f: CheckpointFile, dst: Path) -> None:
    """Download ``f`` to ``dst``, checking its size and checksum on the way."""
    with open(dst, "wb") as out:
        read_object(loc, f, out)


def _damaged_error(loc: Location, cid: str, damaged: Damaged) -> CheckpointCorruptedError:
    """The error for a damaged file of checkpoint ``cid``, with a remedy that is true.

    Checkpoints share files, so "restore an older one" helps only if one does not
    reference the damaged file: the message names those, or says that none is left.
    """
    obj = damaged.file.object
    others: list[str] = []
    unreadable: list[str] = []
    try:
        for other in reversed(manifest_ids(loc)):
            if other == cid:
                continue
            try:
                files = info_of(read_manifest(loc, other), loc.uri).files
            except (CheckpointCorruptedError, CheckpointNotFoundError):
                unreadable.append(other)
                continue
            if all(g.object != obj for g in files):
                others.append(other)
    except (OSError, pa.ArrowException) as exc:
        log.warning("listing the checkpoints at %s for a remedy: %s", loc.uri, exc)
    if others:
        remedy = (f"checkpoint(s) not using that file, newest first: {', '.join(others)} "
                  "(restore one by id: checkpoint=...)")
    else:
        remedy = ("no other checkpoint there can replace it: every other one uses that file "
                  f"too{' or is unreadable' if unreadable else ''}. If the store that took "
                  "them still has the file, its next checkpoint uploads it again (every "
                  "checkpoint reads back the files it reuses) and then restores")
    return CheckpointCorruptedError(
        f"checkpoint {cid} at {loc.uri}: file {damaged}; nothing was restored; {remedy}")


def _reuse(old: Path, f: CheckpointFile, dst: Path) -> bool:
    """Link ``old`` as ``dst`` if it is exactly ``f`` (size and checksum)."""
    try:
        if old.stat().st_size != f.size or file_checksum(old) != f.checksum:
            return False
        try:
            os.link(old, dst)
        except OSError:
            shutil.copy2(old, dst)
    except OSError:
        return False
    return True


def restore(uri: str, path: str | Path, *, checkpoint: str | None = None,
            replace: bool = False, filesystem: pafs.FileSystem | None = None
            ) -> CheckpointInfo:
    """Restore checkpoint ``checkpoint`` (default: the latest) of ``uri`` into ``path``.

    ``path`` must be missing or empty, or ``replace=True`` replaces the store there.  The
    store being replaced must not be open for writing (in this process or another):
    the restore holds its LOCK from before it reads the old files until the new ones
    are in place, and raises :class:`~joinstate.errors.StateLockedError` (changing
    nothing) if a writer has it.  Every file is checked against the manifest before the
    restored directory replaces ``path`` in one atomic exchange; see the module
    docstring.  Raises :class:`~joinstate.errors.CheckpointNotFoundError` (no such
    checkpoint; the message lists those there) or
    :class:`~joinstate.errors.CheckpointCorruptedError` (a damaged manifest or file),
    and in both cases ``path`` is left as it was.
    """
    loc = Location.of(uri, filesystem)
    target = Path(path).absolute()
    _check_target(target, replace)
    t0 = time.perf_counter()
    with fs_errors(loc, "read the checkpoint"):
        if checkpoint is None:
            ids = manifest_ids(loc)
            if not ids:
                raise CheckpointNotFoundError(
                    f"no checkpoint at {loc.uri} (no complete manifest under "
                    f"{MANIFESTS}/); take one with StateStore.checkpoint()")
            checkpoint = ids[-1]
        doc = read_manifest(loc, str(checkpoint))
    info = info_of(doc, loc.uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    what = f"restore checkpoint {info.id} of {loc.uri} over it (nothing was changed)"
    with hold_directory(target, what) as locks:
        _check_target(target, replace)  # as it is now that no writer can change it
        _clean_leftovers(target)
        tmp = target.parent / f".{target.name}.restore-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            # The new directory's LOCK is held too, so that once it is in place no
            # other process opens it before this restore has finished.
            locks.append(lock_file(tmp / "LOCK", tmp, what))
            todo = _fill(loc, info, target if replace else None, tmp)
            _publish(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dataclasses.replace(
        info, transferred=tuple(f.name for f in todo),
        transferred_bytes=sum(f.size for f in todo), seconds=time.perf_counter() - t0)


def _fill(loc: Location, info: CheckpointInfo, old: Path | None, tmp: Path
          ) -> list[CheckpointFile]:
    """Put every file of ``info`` into ``tmp``, checked; returns those downloaded.

    Files ``old`` (the store being replaced) holds with the recorded size and checksum
    are linked instead of downloaded.  Then the checksum cache and the marker.
    """
    reused = set()
    if old is not None and old.is_dir():
        reused = {f.name for f in info.files if _reuse(old / f.name, f, tmp / f.name)}
    todo = [f for f in info.files if f.name not in reused]
    try:
        with fs_errors(loc, f"download {len(todo)} checkpoint file(s)"):
            parallel([functools.partial(_get_file, loc, f, tmp / f.name) for f in todo])
    except Damaged as exc:
        raise _damaged_error(loc, info.id, exc) from None
    (tmp / LOCAL_DIR).mkdir()
    checksums = Checksums(tmp / LOCAL_DIR)
    for f in info.files:
        checksums.remember(tmp / f.name, f.checksum)
    checksums.save(f.name for f in info.files)
    write_marker(tmp, info.id, loc, info.sequence)
    return todo


def _publish(tmp: Path, target: Path) -> None:
    """Move the complete directory ``tmp`` to ``target`` in one step.

    An existing ``target`` is exchanged with ``tmp`` atomically (Linux ``renameat2``
    with ``RENAME_EXCHANGE``): at every instant ``target`` is either the old store or
    the new one, never missing, so a crash here cannot leave a path that opens as a new
    empty store.  Where the exchange is unavailable, two renames (a crash between them
    leaves ``target`` missing and both directories beside it).
    """
    if not target.exists():
        os.rename(tmp, target)
        return
    if _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old store
        return
    old = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:8]}"
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)

_RENAME_EXCHANGE = 2

_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (False where the system cannot)."""
    renameat2 = getattr(_libc(), "renameat2", None) if sys.platform == "linux" else None
    if renameat2 is None:
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # a filesystem or kernel without RENAME_EXCHANGE
    raise OSError(err, f"exchange {a} and {b}: {os.strerror(err)}")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
