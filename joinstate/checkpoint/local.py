"""What a store directory keeps about checkpoints: its marker and a checksum cache.

Inside the store, in ``checkpoint/`` (:data:`LOCAL_DIR`; RocksDB ignores sub-folders of
its directory): ``state.json``, the checkpoint the store is a copy of (id, location,
RocksDB sequence number then), written by a checkpoint and by a restore and read by
:mod:`joinstate.working_copy`; ``checksums.json``, every file's xxh3-128 by (name,
size, mtime, inode), so a checkpoint checksums only the files written since the last.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

if TYPE_CHECKING:
    from collections.abc import Iterable
from joinstate.checkpoint.location import CHUNK, CheckpointFile, Location

__all__ = [
    "LOCAL_DIR",
    "Checksums",
    "LocalCheckpoint",
    "file_checksum",
    "local_checkpoint",
    "write_json_atomically",
    "write_marker",
]

LOCAL_DIR = "checkpoint"
"""The folder inside a store directory with its checkpoint marker, checksum cache and
staging area (RocksDB ignores sub-folders of its directory)."""

_MARKER = "state.json"
_CHECKSUMS = "checksums.json"


@dataclass(frozen=True)
class LocalCheckpoint:
    """What a store directory says it is a copy of (see :func:`local_checkpoint`)."""

    id: str
    location: str  # Location.key
    sequence: int


def file_checksum(path: Path) -> str:
    """The xxh3-128 of a file, hex (read in chunks)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomically(path: Path, data: object) -> None:
    """Write ``data`` as JSON to ``path`` by a rename: the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Checksums:
    """xxh3-128 of a store's files, cached by (name, size, mtime, inode).

    A file RocksDB rewrites gets a new inode and mtime, so a cached checksum is never
    reused for other content; the links in a checkpoint's staging folder share their
    inode with the live file and hit the cache.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / _CHECKSUMS
        self.known: dict[str, list[Any]] = {}
        with contextlib.suppress(OSError, ValueError):
            raw = json.loads(self.path.read_text())
            if isinstance(raw, dict):
                self.known = raw

    def of(self, path: Path) -> CheckpointFile:
        """The file ``path`` with its checksum, from the cache when its stamp matches."""
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.known.get(path.name)
        if cached is not None and cached[:3] == stamp:
            return CheckpointFile(path.name, st.st_size, str(cached[3]))
        checksum = file_checksum(path)
        self.known[path.name] = [*stamp, checksum]
        return CheckpointFile(path.name, st.st_size, checksum)

    def remember(self, path: Path, checksum: str) -> None:
        """Record a checksum known by other means (a restored file checked on download)."""
        st = path.stat()
        self.known[path.name] = [st.st_size, st.st_mtime_ns, st.st_ino, checksum]

    def save(self, names: Iterable[str]) -> None:
        """Keep the entries of files ``names`` (the rest are gone) beside the store."""
        keep = set(names)
        self.path.parent.mkdir(exist_ok=True)
        write_json_atomically(self.path, {k: v for k, v in self.known.items() if k in keep})


def local_checkpoint(path: str | Path) -> LocalCheckpoint | None:
    """Which checkpoint the store directory ``path`` is a copy of, as it last recorded.

    Written by a checkpoint and by a restore.  The copy is exactly that checkpoint only
    while RocksDB's sequence number is still ``sequence`` (no write since).
    """
    try:
        raw = json.loads((Path(path) / LOCAL_DIR / _MARKER).read_text())
        return LocalCheckpoint(str(raw["id"]), str(raw["location"]), int(raw["sequence"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(store_dir: Path, cid: str, loc: Location, sequence: int) -> None:
    """Record that ``store_dir`` is checkpoint ``cid`` of ``loc`` at RocksDB ``sequence``."""
    folder = store_dir / LOCAL_DIR
    folder.mkdir(exist_ok=True)
    write_json_atomically(folder / _MARKER, {"id": cid, "location": loc.key,
                                             "sequence": sequence, "written": time.time()})
