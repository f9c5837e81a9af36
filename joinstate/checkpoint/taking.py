"""Taking a checkpoint: RocksDB's snapshot of the store, uploaded as objects and a manifest.

The steps (:mod:`joinstate.checkpoint` says why each is safe): hard-link a consistent
snapshot inside the store (:func:`snapshot`); checksum its files (cached); upload the
objects the location lacks, reading back those it has before reusing them
(``verify``); write the manifest last; then delete checkpoints beyond ``keep`` and the
objects no remaining manifest references.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import rocksdict as rd

from joinstate import _rocks
from joinstate.errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    JoinStateError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path
from joinstate.checkpoint.local import LOCAL_DIR, Checksums, write_json_atomically, write_marker
from joinstate.checkpoint.location import (
    DEFAULT_KEEP,
    MANIFESTS,
    OBJECTS,
    CheckpointFile,
    CheckpointInfo,
    Damaged,
    Listed,
    Location,
    Verify,
    fs_errors,
    info_of,
    list_objects,
    manifest_doc,
    manifest_ids,
    parallel,
    read_manifest,
    read_object,
)

__all__ = [
    "snapshot",
    "upload",
]

log = logging.getLogger(__name__)

_VERIFIED = "verified.json"

_ATOMIC_PUT = frozenset({"s3", "gcs"})
"""Filesystems that publish a written file only once it is complete."""


def snapshot(db: Any, store_dir: Path) -> tuple[Path, int]:
    """RocksDB's checkpoint of the open database ``db`` in a staging folder of the store.

    Call with the store's lock held (no write in between): returns the folder and the
    sequence number it holds.  Leftover staging folders of interrupted checkpoints go.
    """
    folder = store_dir / LOCAL_DIR
    folder.mkdir(exist_ok=True)
    for old in folder.glob("staging-*"):
        shutil.rmtree(old, ignore_errors=True)
    staging = folder / f"staging-{uuid.uuid4().hex[:8]}"
    with _rocks.rocks_errors(store_dir, "create a RocksDB checkpoint"):
        sequence = int(db.latest_sequence_number())
        rd.Checkpoint(db).create_checkpoint(str(staging))
    return staging, sequence


def _put(loc: Location, dst: str, write: Callable[[str], None], replace: bool) -> None:
    """Publish ``dst`` complete or not at all (:mod:`joinstate.checkpoint`, step 3)."""
    if loc.fs.type_name in _ATOMIC_PUT:
        write(dst)
        return
    name = dst.rsplit("/", 1)[-1]
    tmp = f"{dst[: len(dst) - len(name)]}.{name}.{uuid.uuid4().hex[:8]}.tmp"
    write(tmp)
    if replace:
        with contextlib.suppress(FileNotFoundError):
            loc.fs.delete_file(dst)
    loc.fs.move(tmp, dst)


def _put_file(loc: Location, src: Path, dst: str, replace: bool) -> None:
    local = pafs.LocalFileSystem()

    def write(path: str) -> None:
        pafs.copy_files(str(src), path, source_filesystem=local, destination_filesystem=loc.fs)

    _put(loc, dst, write, replace)


def _put_bytes(loc: Location, dst: str, data: bytes) -> None:
    def write(path: str) -> None:
        with loc.fs.open_output_stream(path) as f:
            f.write(data)

    _put(loc, dst, write, replace=False)


def upload(staging: Path, store_dir: Path, loc: Location, sequence: int, *,
           keep: int = DEFAULT_KEEP, protect: Iterable[str] = (),
           verify: Verify = "all") -> CheckpointInfo:
    """Upload the staging folder of :func:`snapshot` as a new checkpoint at ``loc``.

    Steps 2-5 of :mod:`joinstate.checkpoint`; the staging folder is removed either way,
    and the store directory records the new checkpoint (:func:`local_checkpoint`).  ``verify``:
    which files already at the location are read back before the checkpoint reuses
    them (see :data:`Verify`); one that does not match is uploaded again.
    """
    t0 = time.perf_counter()
    try:
        with fs_errors(loc, "read the checkpoint location"):
            ids = manifest_ids(loc)
            present = list_objects(loc)
        generation = int(ids[-1][:12]) + 1 if ids else 1
        cid = f"{generation:012d}-{uuid.uuid4().hex[:8]}"
        checksums = Checksums(store_dir / LOCAL_DIR)
        files = [checksums.of(p) for p in sorted(staging.iterdir()) if p.is_file()]
        todo: dict[str, CheckpointFile] = {}
        for f in files:
            if f.object not in present or present[f.object].size != f.size:
                todo.setdefault(f.object, f)
        seen = _Verified(store_dir / LOCAL_DIR, loc)
        reused = {f.object: f for f in files if f.object not in todo}
        check = [f for obj, f in reused.items()
                 if verify == "all" or not seen.unchanged(obj, present[obj])]
        with fs_errors(loc, f"read back {len(check)} checkpoint file(s) to reuse"):
            damaged = _read_back(loc, check)
        for obj in damaged:
            log.warning("checkpoint location %s: objects/%s (%s) does not match the store's "
                        "file; uploading it again", loc.uri, obj, reused[obj].name)
            todo[obj] = reused[obj]
        with fs_errors(loc, f"upload {len(todo)} checkpoint file(s)"):
            loc.fs.create_dir(loc.path(OBJECTS), recursive=True)
            loc.fs.create_dir(loc.path(MANIFESTS), recursive=True)
            jobs = [(staging / f.name, loc.path(OBJECTS, obj), obj in present)
                    for obj, f in todo.items()]
            parallel([functools.partial(_put_file, loc, *job) for job in jobs])
            doc = manifest_doc(cid, generation, sequence, files, ids[-1] if ids else None)
            _put_bytes(loc, loc.path(MANIFESTS, f"{cid}.json"),
                       json.dumps(doc, indent=1).encode())
            # What this store now knows to be intact at the location, as listed now.
            known = todo.keys() | {f.object for f in check}
            seen.record({obj: info for obj, info in list_objects(loc).items()
                         if obj in known}, keep={f.object for f in files})
        checksums.save(f.name for f in files)
        write_marker(store_dir, cid, loc, sequence)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        _retain(loc, cid, files, keep, set(protect))
    except (OSError, pa.ArrowException, JoinStateError) as exc:
        log.warning("checkpoint %s at %s is complete, but removing old checkpoints failed: %s",
                    cid, loc.uri, exc)
    sent = {f.name for f in todo.values()}
    read = {f.name for f in check}
    return dataclasses.replace(
        info_of(doc, loc.uri), transferred=tuple(f.name for f in files if f.name in sent),
        transferred_bytes=sum(f.size for f in todo.values()),
        verified=tuple(f.name for f in files if f.name in read),
        verified_bytes=sum(f.size for f in check),
        repaired=tuple(sorted(reused[obj].name for obj in damaged)),
        seconds=time.perf_counter() - t0)


def _read_back(loc: Location, files: Sequence[CheckpointFile]) -> set[str]:
    """Read ``files`` from the location, checking each; the objects that do not match."""
    damaged: set[str] = set()

    def one(f: CheckpointFile) -> None:
        try:
            read_object(loc, f)
        except Damaged:
            damaged.add(f.object)

    parallel([functools.partial(one, f) for f in files])
    return damaged


class _Verified:
    """Objects of one location this store uploaded or read back intact, as then listed.

    Kept in the store's checkpoint folder (``verified.json``): per location, object
    name -> the size and modification time the location listed once the object was
    known intact.  ``verify="changed"`` reuses an object without reading it only while
    the location still lists it so; any rewrite, replacement or truncation changes that.
    """

    def __init__(self, folder: Path, loc: Location) -> None:
        self.path = folder / _VERIFIED
        self.loc = loc.key
        self.all: dict[str, dict[str, list[int]]] = {}
        with contextlib.suppress(OSError, ValueError):
            raw = json.loads(self.path.read_text())
            if isinstance(raw, dict):
                self.all = raw
        mine = self.all.get(self.loc)
        self.known: dict[str, list[int]] = mine if isinstance(mine, dict) else {}

    def unchanged(self, obj: str, listed: Listed) -> bool:
        stamp = self.known.get(obj)
        return listed.mtime_ns is not None and stamp == [listed.size, listed.mtime_ns]

    def record(self, now: dict[str, Listed], keep: set[str]) -> None:
        known = {obj: stamp for obj, stamp in self.known.items() if obj in keep}
        for obj, listed in now.items():
            if listed.mtime_ns is not None:
                known[obj] = [listed.size, listed.mtime_ns]
        self.all[self.loc] = known
        self.path.parent.mkdir(exist_ok=True)
        write_json_atomically(self.path, self.all)


def _retain(loc: Location, new: str, files: Sequence[CheckpointFile], keep: int,
            protect: set[str]) -> None:
    """Delete manifests beyond the newest ``keep`` (and ``protect``), then orphan objects."""
    ids = manifest_ids(loc)
    kept = set(ids[-keep:]) | (protect & set(ids)) | {new}
    for cid in ids:
        if cid not in kept:
            loc.fs.delete_file(loc.path(MANIFESTS, f"{cid}.json"))
    referenced = {f.object for f in files}
    for cid in kept - {new}:
        try:
            referenced |= {f.object for f in info_of(read_manifest(loc, cid), loc.uri).files}
        except (CheckpointCorruptedError, CheckpointNotFoundError) as exc:
            log.warning("not removing unreferenced checkpoint files at %s: %s", loc.uri, exc)
            return
    for folder, wanted in ((OBJECTS, referenced), (MANIFESTS, None)):
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path(folder), allow_not_found=True))
        for fi in infos:
            stale_tmp = fi.base_name.startswith(".") and fi.base_name.endswith(".tmp")
            if fi.type == pafs.FileType.File and (
                    stale_tmp or (wanted is not None and fi.base_name not in wanted)):
                loc.fs.delete_file(fi.path)
