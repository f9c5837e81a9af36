"""Checkpoints: a state store copied to durable storage through :mod:`pyarrow.fs`, and back.

A checkpoint is a consistent copy of one store's RocksDB directory as of one commit,
kept at a *location*: a directory on any filesystem pyarrow reaches (a local path, an
NFS mount, ``s3://``, ``gs://``, ``hdfs://``)::

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

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import json
import logging
import os
import re
import shutil
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, cast

import pyarrow as pa
import pyarrow.fs as pafs
import rocksdict as rd
import xxhash

from joinstate import _rocks
from joinstate.db import hold_directory, lock_file
from joinstate.errors import (
    CheckpointCorruptedError,
    CheckpointIOError,
    CheckpointNotFoundError,
    JoinStateError,
    NotAStateStoreError,
    OptionsError,
    StateLockedError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

__all__ = [
    "DEFAULT_KEEP",
    "CheckpointFile",
    "CheckpointInfo",
    "LocalCheckpoint",
    "Location",
    "child_uri",
    "latest_checkpoint",
    "list_checkpoints",
    "is_replaceable",
    "local_checkpoint",
    "restore",
    "snapshot",
    "upload",
]

log = logging.getLogger(__name__)

FORMAT = 1
"""Version of the checkpoint manifest format."""

DEFAULT_KEEP = 3
"""Checkpoints kept per location unless ``keep=`` says otherwise."""

LOCAL_DIR = "checkpoint"
"""The folder inside a store directory with its checkpoint marker, checksum cache and
staging area (RocksDB ignores sub-folders of its directory)."""

_OBJECTS = "objects"
_MANIFESTS = "checkpoints"
_MARKER = "state.json"
_CHECKSUMS = "checksums.json"
_VERIFIED = "verified.json"
_CHUNK = 8 << 20
_THREADS = 4
_MANIFEST_NAME = re.compile(r"^(\d{12})-([0-9a-f]{8})\.json$")
_ATOMIC_PUT = frozenset({"s3", "gcs"})
"""Filesystems that publish a written file only once it is complete."""


# ---- where checkpoints go ---------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A checkpoint location: a pyarrow filesystem and a directory in it."""

    fs: pafs.FileSystem
    root: str
    uri: str

    @classmethod
    def of(cls, uri: object, filesystem: pafs.FileSystem | None = None) -> Location:
        """Resolve ``uri`` (a URI, or a local path) or a path in ``filesystem``.

        Raises :class:`~joinstate.errors.OptionsError` for anything else, naming it.
        """
        if isinstance(uri, os.PathLike):
            uri = os.fspath(uri)
        if not isinstance(uri, str) or not uri.strip():
            raise OptionsError(
                f"checkpoint uri={uri!r} must be a non-empty URI (s3://bucket/prefix, "
                "hdfs://..., file:///...) or a local directory path"
            )
        if filesystem is not None:
            if not isinstance(filesystem, pafs.FileSystem):
                raise OptionsError(
                    f"filesystem={filesystem!r} must be a pyarrow.fs.FileSystem (or None to "
                    "resolve the uri with pyarrow.fs.FileSystem.from_uri)"
                )
            return cls(filesystem, uri.rstrip("/") or "/", uri)
        if "://" not in uri:
            return cls(pafs.LocalFileSystem(), str(Path(uri).resolve()), uri)
        try:
            fs, root = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowException, OSError) as exc:
            raise OptionsError(
                f"checkpoint uri={uri!r} is not a location pyarrow.fs can open ({exc}); use "
                "a local path or a URI of a filesystem this pyarrow supports (s3://, gs://, "
                "hdfs://, file://)"
            ) from exc
        return cls(fs, root.rstrip("/") or "/", uri)

    @property
    def key(self) -> str:
        """The location as one comparable string (filesystem type and directory)."""
        return f"{self.fs.type_name}:{self.root}"

    def path(self, *parts: str) -> str:
        """A path under the location's directory."""
        base = self.root.rstrip("/")
        return "/".join([base, *parts]) if base else "/" + "/".join(parts)


def child_uri(uri: str, relative: str) -> str:
    """``uri`` with ``relative`` appended to its path (a query string stays at the end).

    >>> child_uri("s3://bucket/state?region=eu-west-1", "shard-00001")
    's3://bucket/state/shard-00001?region=eu-west-1'
    """
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{relative.strip('/')}{sep}{query}"


Verify = Literal["all", "changed"]
"""Which files already at the location a checkpoint reads back before reusing them.

``"all"`` (the default): every one, so no checkpoint ever references a copy that rotted
at the location since it was uploaded; costs reading the reused bytes back (the
location's read bandwidth; no upload).  ``"changed"``: only those whose listing (size,
modification time) differs from when this store last uploaded or read them (a file
rewritten, truncated or replaced in place); decay that leaves the listing alone is then
found only by a restore.
"""
VERIFY_MODES: tuple[str, ...] = ("all", "changed")


def check_verify(verify: object) -> Verify:
    """``verify`` as a :data:`Verify` mode, else :class:`~joinstate.errors.OptionsError`."""
    if verify not in VERIFY_MODES:
        raise OptionsError(f"verify={verify!r} must be one of {VERIFY_MODES} (which files "
                           "at the checkpoint location are read back before reuse)")
    return cast("Verify", verify)


def check_keep(keep: object) -> int:
    """``keep`` as an int >= 1, else :class:`~joinstate.errors.OptionsError`."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise OptionsError(f"keep={keep!r} must be an int >= 1 (checkpoints kept per location)")
    return keep


@contextlib.contextmanager
def _fs_errors(loc: Location, what: str) -> Iterator[None]:
    """Raise filesystem failures as :class:`~joinstate.errors.CheckpointIOError`."""
    try:
        yield
    except JoinStateError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise CheckpointIOError(
            f"{what} at checkpoint location {loc.uri}: {exc}. Check that the location is "
            "reachable and writable (path, credentials, network, space); a checkpoint that "
            "failed was not taken and the previous one is intact"
        ) from exc


# ---- what a checkpoint is ------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a checkpoint: its name in the store directory, size and checksum."""

    name: str
    size: int
    checksum: str  # xxh3-128, hex

    @property
    def object(self) -> str:
        """Its object name under ``objects/`` (content-addressed)."""
        return f"{self.checksum}-{self.size}"


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint, and what taking or restoring it transferred.

    ``transferred`` names the files uploaded (by a checkpoint) or downloaded (by a
    restore); files already at the destination are not in it.
    """

    id: str
    uri: str
    generation: int
    sequence: int
    created: float
    files: tuple[CheckpointFile, ...]
    transferred: tuple[str, ...] = ()
    transferred_bytes: int = 0
    seconds: float = 0.0
    verified: tuple[str, ...] = ()
    """Files already at the location that a checkpoint read back before reusing them."""
    verified_bytes: int = 0
    repaired: tuple[str, ...] = ()
    """Files whose copy at the location did not match: uploaded again (and logged)."""

    @property
    def bytes(self) -> int:
        """Total size of the checkpoint's files."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class LocalCheckpoint:
    """What a store directory says it is a copy of (see :func:`local_checkpoint`)."""

    id: str
    location: str  # Location.key
    sequence: int


def _digest(doc: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in doc.items() if k != "digest"}, sort_keys=True,
                      separators=(",", ":"))
    return xxhash.xxh3_128_hexdigest(body.encode())


def _manifest_doc(cid: str, generation: int, sequence: int, files: Sequence[CheckpointFile],
                  parent: str | None) -> dict[str, Any]:
    from joinstate.db import LAYOUT_VERSION
    from joinstate.version import __version__

    doc: dict[str, Any] = {
        "format": FORMAT, "id": cid, "generation": generation, "sequence": sequence,
        "created": time.time(), "parent": parent, "joinstate": __version__,
        "layout_version": LAYOUT_VERSION,
        "files": [{"name": f.name, "size": f.size, "xxh3_128": f.checksum} for f in files],
    }
    doc["digest"] = _digest(doc)
    return doc


def _info(doc: dict[str, Any], uri: str) -> CheckpointInfo:
    return CheckpointInfo(
        id=str(doc["id"]), uri=uri, generation=int(doc["generation"]),
        sequence=int(doc["sequence"]), created=float(doc["created"]),
        files=tuple(CheckpointFile(str(f["name"]), int(f["size"]), str(f["xxh3_128"]))
                    for f in doc["files"]),
    )


def _parse_manifest(raw: bytes, cid: str, loc: Location) -> dict[str, Any]:
    """The manifest ``cid``, checked (format, fields, its own checksum)."""
    where = f"checkpoint {cid} at {loc.uri}"
    remedy = ("this checkpoint cannot be trusted; restore an older one by id "
              "(joinstate.checkpoint.list_checkpoints lists them)")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CheckpointCorruptedError(f"{where}: the manifest is not valid JSON ({exc}); "
                                       f"{remedy}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise CheckpointCorruptedError(
            f"{where}: manifest format {got!r}, this joinstate reads format {FORMAT}; {remedy}")
    if doc.get("digest") != _digest(doc):
        raise CheckpointCorruptedError(f"{where}: the manifest fails its checksum; {remedy}")
    if doc.get("id") != cid:
        raise CheckpointCorruptedError(
            f"{where}: the manifest names checkpoint {doc.get('id')!r}; {remedy}")
    try:
        _info(doc, loc.uri)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointCorruptedError(f"{where}: the manifest lacks {exc}; {remedy}") from exc
    return doc


# ---- reading the location -------------------------------------------------------------------


def _manifest_ids(loc: Location) -> list[str]:
    """Ids of the complete checkpoints at ``loc``, oldest first."""
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path(_MANIFESTS), allow_not_found=True))
    found = []
    for fi in infos:
        m = _MANIFEST_NAME.match(fi.base_name)
        if m and fi.type == pafs.FileType.File:
            found.append((int(m.group(1)), fi.base_name[: -len(".json")]))
    return [cid for _, cid in sorted(found)]


@dataclass(frozen=True)
class _Listed:
    """An object as the location lists it."""

    size: int
    mtime_ns: int | None


def _list_objects(loc: Location) -> dict[str, _Listed]:
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path(_OBJECTS), allow_not_found=True))
    return {fi.base_name: _Listed(int(fi.size or 0), fi.mtime_ns)
            for fi in infos if fi.type == pafs.FileType.File}


def _read_manifest(loc: Location, cid: str) -> dict[str, Any]:
    path = loc.path(_MANIFESTS, f"{cid}.json")
    try:
        with loc.fs.open_input_stream(path) as f:
            raw = f.read()
    except FileNotFoundError:
        known = _manifest_ids(loc)
        raise CheckpointNotFoundError(
            f"no checkpoint {cid!r} at {loc.uri} (checkpoints there: "
            f"{', '.join(known) if known else 'none'})") from None
    return _parse_manifest(raw, cid, loc)


def list_checkpoints(uri: str, *, filesystem: pafs.FileSystem | None = None
                     ) -> list[CheckpointInfo]:
    """Every complete checkpoint at ``uri``, oldest first.

    A checkpoint whose manifest is damaged is left out (and logged); restoring it by id
    raises :class:`~joinstate.errors.CheckpointCorruptedError`.
    """
    loc = Location.of(uri, filesystem)
    out = []
    with _fs_errors(loc, "list checkpoints"):
        for cid in _manifest_ids(loc):
            try:
                out.append(_info(_read_manifest(loc, cid), loc.uri))
            except (CheckpointCorruptedError, CheckpointNotFoundError) as exc:
                log.warning("%s", exc)
    return out


def latest_checkpoint(uri: str, *, filesystem: pafs.FileSystem | None = None
                      ) -> CheckpointInfo | None:
    """The newest complete checkpoint at ``uri`` (None if there is none).

    Raises :class:`~joinstate.errors.CheckpointCorruptedError` if its manifest is damaged.
    """
    loc = Location.of(uri, filesystem)
    with _fs_errors(loc, "read the latest checkpoint"):
        ids = _manifest_ids(loc)
        return _info(_read_manifest(loc, ids[-1]), loc.uri) if ids else None


# ---- local files: checksums and the marker -----------------------------------------------------


def _file_checksum(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_json_atomically(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _Checksums:
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
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.known.get(path.name)
        if cached is not None and cached[:3] == stamp:
            return CheckpointFile(path.name, st.st_size, str(cached[3]))
        checksum = _file_checksum(path)
        self.known[path.name] = [*stamp, checksum]
        return CheckpointFile(path.name, st.st_size, checksum)

    def remember(self, path: Path, checksum: str) -> None:
        st = path.stat()
        self.known[path.name] = [st.st_size, st.st_mtime_ns, st.st_ino, checksum]

    def save(self, names: Iterable[str]) -> None:
        keep = set(names)
        self.path.parent.mkdir(exist_ok=True)
        _write_json_atomically(self.path, {k: v for k, v in self.known.items() if k in keep})


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


def _write_marker(store_dir: Path, cid: str, loc: Location, sequence: int) -> None:
    folder = store_dir / LOCAL_DIR
    folder.mkdir(exist_ok=True)
    _write_json_atomically(folder / _MARKER, {"id": cid, "location": loc.key,
                                              "sequence": sequence, "written": time.time()})


# ---- taking a checkpoint --------------------------------------------------------------------


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


def _parallel(calls: Sequence[Callable[[], None]]) -> None:
    """Run ``calls`` on a few threads (pyarrow and file I/O release the GIL).

    The first failure cancels the calls not started yet and is raised.
    """
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(min(_THREADS, len(calls))) as pool:
        futures = [pool.submit(call) for call in calls]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _put(loc: Location, dst: str, write: Callable[[str], None], replace: bool) -> None:
    """Publish ``dst`` complete or not at all (see the module docstring, step 3)."""
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

    Steps 2-5 of the module docstring; the staging folder is removed either way, and the
    store directory records the new checkpoint (:func:`local_checkpoint`).  ``verify``:
    which files already at the location are read back before the checkpoint reuses
    them (see :data:`Verify`); one that does not match is uploaded again.
    """
    t0 = time.perf_counter()
    try:
        with _fs_errors(loc, "read the checkpoint location"):
            ids = _manifest_ids(loc)
            present = _list_objects(loc)
        generation = int(ids[-1][:12]) + 1 if ids else 1
        cid = f"{generation:012d}-{uuid.uuid4().hex[:8]}"
        checksums = _Checksums(store_dir / LOCAL_DIR)
        files = [checksums.of(p) for p in sorted(staging.iterdir()) if p.is_file()]
        todo: dict[str, CheckpointFile] = {}
        for f in files:
            if f.object not in present or present[f.object].size != f.size:
                todo.setdefault(f.object, f)
        seen = _Verified(store_dir / LOCAL_DIR, loc)
        reused = {f.object: f for f in files if f.object not in todo}
        check = [f for obj, f in reused.items()
                 if verify == "all" or not seen.unchanged(obj, present[obj])]
        with _fs_errors(loc, f"read back {len(check)} checkpoint file(s) to reuse"):
            damaged = _read_back(loc, check)
        for obj in damaged:
            log.warning("checkpoint location %s: objects/%s (%s) does not match the store's "
                        "file; uploading it again", loc.uri, obj, reused[obj].name)
            todo[obj] = reused[obj]
        with _fs_errors(loc, f"upload {len(todo)} checkpoint file(s)"):
            loc.fs.create_dir(loc.path(_OBJECTS), recursive=True)
            loc.fs.create_dir(loc.path(_MANIFESTS), recursive=True)
            jobs = [(staging / f.name, loc.path(_OBJECTS, obj), obj in present)
                    for obj, f in todo.items()]
            _parallel([functools.partial(_put_file, loc, *job) for job in jobs])
            doc = _manifest_doc(cid, generation, sequence, files, ids[-1] if ids else None)
            _put_bytes(loc, loc.path(_MANIFESTS, f"{cid}.json"),
                       json.dumps(doc, indent=1).encode())
            # What this store now knows to be intact at the location, as listed now.
            known = todo.keys() | {f.object for f in check}
            seen.record({obj: info for obj, info in _list_objects(loc).items()
                         if obj in known}, keep={f.object for f in files})
        checksums.save(f.name for f in files)
        _write_marker(store_dir, cid, loc, sequence)
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
        _info(doc, loc.uri), transferred=tuple(f.name for f in files if f.name in sent),
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
            _read_object(loc, f)
        except _Damaged:
            damaged.add(f.object)

    _parallel([functools.partial(one, f) for f in files])
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

    def unchanged(self, obj: str, listed: _Listed) -> bool:
        stamp = self.known.get(obj)
        return listed.mtime_ns is not None and stamp == [listed.size, listed.mtime_ns]

    def record(self, now: dict[str, _Listed], keep: set[str]) -> None:
        known = {obj: stamp for obj, stamp in self.known.items() if obj in keep}
        for obj, listed in now.items():
            if listed.mtime_ns is not None:
                known[obj] = [listed.size, listed.mtime_ns]
        self.all[self.loc] = known
        self.path.parent.mkdir(exist_ok=True)
        _write_json_atomically(self.path, self.all)


def _retain(loc: Location, new: str, files: Sequence[CheckpointFile], keep: int,
            protect: set[str]) -> None:
    """Delete manifests beyond the newest ``keep`` (and ``protect``), then orphan objects."""
    ids = _manifest_ids(loc)
    kept = set(ids[-keep:]) | (protect & set(ids)) | {new}
    for cid in ids:
        if cid not in kept:
            loc.fs.delete_file(loc.path(_MANIFESTS, f"{cid}.json"))
    referenced = {f.object for f in files}
    for cid in kept - {new}:
        try:
            referenced |= {f.object for f in _info(_read_manifest(loc, cid), loc.uri).files}
        except (CheckpointCorruptedError, CheckpointNotFoundError) as exc:
            log.warning("not removing unreferenced checkpoint files at %s: %s", loc.uri, exc)
            return
    for folder, wanted in ((_OBJECTS, referenced), (_MANIFESTS, None)):
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path(folder), allow_not_found=True))
        for fi in infos:
            stale_tmp = fi.base_name.startswith(".") and fi.base_name.endswith(".tmp")
            if fi.type == pafs.FileType.File and (
                    stale_tmp or (wanted is not None and fi.base_name not in wanted)):
                loc.fs.delete_file(fi.path)


# ---- restoring -----------------------------------------------------------------------------


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


class _Damaged(Exception):
    """An object at the location is not the file the manifest records (internal)."""

    def __init__(self, f: CheckpointFile, problem: str) -> None:
        super().__init__(f"{f.name} (objects/{f.object}) {problem}")
        self.file = f


def _read_object(loc: Location, f: CheckpointFile, out: BinaryIO | None = None) -> None:
    """Read object ``f`` from ``loc`` (into ``out``), checking size and checksum.

    Raises :class:`_Damaged` saying what is wrong (missing, size, checksum).
    """
    h = xxhash.xxh3_128()
    n = 0
    try:
        stream = loc.fs.open_input_stream(loc.path(_OBJECTS, f.object))
    except FileNotFoundError:
        raise _Damaged(f, "is missing") from None
    with stream:
        while chunk := stream.read(_CHUNK):
            h.update(chunk)
            if out is not None:
                out.write(chunk)
            n += len(chunk)
    if n != f.size:
        raise _Damaged(f, f"has {n} bytes, the manifest records {f.size}")
    if h.hexdigest() != f.checksum:
        raise _Damaged(f, "fails its xxh3-128 checksum")


def _get_file(loc: Location, f: CheckpointFile, dst: Path) -> None:
    """Download ``f`` to ``dst``, checking its size and checksum on the way."""
    with open(dst, "wb") as out:
        _read_object(loc, f, out)


def _damaged_error(loc: Location, cid: str, damaged: _Damaged) -> CheckpointCorruptedError:
    """The error for a damaged file of checkpoint ``cid``, with a remedy that is true.

    Checkpoints share files, so "restore an older one" helps only if one does not
    reference the damaged file: the message names those, or says that none is left.
    """
    obj = damaged.file.object
    others: list[str] = []
    unreadable: list[str] = []
    try:
        for other in reversed(_manifest_ids(loc)):
            if other == cid:
                continue
            try:
                files = _info(_read_manifest(loc, other), loc.uri).files
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
        if old.stat().st_size != f.size or _file_checksum(old) != f.checksum:
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
    with _fs_errors(loc, "read the checkpoint"):
        if checkpoint is None:
            ids = _manifest_ids(loc)
            if not ids:
                raise CheckpointNotFoundError(
                    f"no checkpoint at {loc.uri} (no complete manifest under "
                    f"{_MANIFESTS}/); take one with StateStore.checkpoint()")
            checkpoint = ids[-1]
        doc = _read_manifest(loc, str(checkpoint))
    info = _info(doc, loc.uri)
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
        with _fs_errors(loc, f"download {len(todo)} checkpoint file(s)"):
            _parallel([functools.partial(_get_file, loc, f, tmp / f.name) for f in todo])
    except _Damaged as exc:
        raise _damaged_error(loc, info.id, exc) from None
    (tmp / LOCAL_DIR).mkdir()
    checksums = _Checksums(tmp / LOCAL_DIR)
    for f in info.files:
        checksums.remember(tmp / f.name, f.checksum)
    checksums.save(f.name for f in info.files)
    _write_marker(tmp, info.id, loc, info.sequence)
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
