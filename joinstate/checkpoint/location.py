"""Where checkpoints go and what a checkpoint is: locations, manifests, objects.

A location is a directory on any filesystem pyarrow reaches::

    <location>/objects/<xxh3-128 hex>-<size>          every file, named by its content
    <location>/checkpoints/<generation>-<token>.json  one manifest per checkpoint

A manifest lists every file of one checkpoint (name, size, checksum), RocksDB's sequence
number and its own checksum; it is written last, so a checkpoint exists once its
manifest does.  This module reads a location (manifests, object listings, an object
checked against its recorded size and checksum) for both directions: taking a
checkpoint (:mod:`joinstate.checkpoint.taking`) and restoring one
(:mod:`joinstate.checkpoint.restoring`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, cast

import pyarrow as pa
import pyarrow.fs as pafs
import xxhash

from joinstate.errors import (
    CheckpointCorruptedError,
    CheckpointIOError,
    CheckpointNotFoundError,
    JoinStateError,
    OptionsError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "CHUNK",
    "DEFAULT_KEEP",
    "FORMAT",
    "MANIFESTS",
    "OBJECTS",
    "VERIFY_MODES",
    "CheckpointFile",
    "CheckpointInfo",
    "Damaged",
    "Listed",
    "Location",
    "Verify",
    "check_keep",
    "check_verify",
    "child_uri",
    "fs_errors",
    "info_of",
    "latest_checkpoint",
    "list_checkpoints",
    "list_objects",
    "manifest_digest",
    "manifest_doc",
    "manifest_ids",
    "parallel",
    "parse_manifest",
    "read_manifest",
    "read_object",
]

log = logging.getLogger(__name__)

FORMAT = 1
"""Version of the checkpoint manifest format."""

DEFAULT_KEEP = 3
"""Checkpoints kept per location unless ``keep=`` says otherwise."""

OBJECTS = "objects"
MANIFESTS = "checkpoints"
CHUNK = 8 << 20  # bytes per read of a file or an object
_THREADS = 4
_MANIFEST_NAME = re.compile(r"^(\d{12})-([0-9a-f]{8})\.json$")


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
def fs_errors(loc: Location, what: str) -> Iterator[None]:
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


def manifest_digest(doc: dict[str, Any]) -> str:
    """The manifest's own checksum: xxh3-128 of its canonical JSON without ``digest``."""
    body = json.dumps({k: v for k, v in doc.items() if k != "digest"}, sort_keys=True,
                      separators=(",", ":"))
    return xxhash.xxh3_128_hexdigest(body.encode())


def manifest_doc(cid: str, generation: int, sequence: int, files: Sequence[CheckpointFile],
                 parent: str | None) -> dict[str, Any]:
    """The manifest of a new checkpoint, its digest included."""
    from joinstate.db import LAYOUT_VERSION
    from joinstate.version import __version__

    doc: dict[str, Any] = {
        "format": FORMAT, "id": cid, "generation": generation, "sequence": sequence,
        "created": time.time(), "parent": parent, "joinstate": __version__,
        "layout_version": LAYOUT_VERSION,
        "files": [{"name": f.name, "size": f.size, "xxh3_128": f.checksum} for f in files],
    }
    doc["digest"] = manifest_digest(doc)
    return doc


def info_of(doc: dict[str, Any], uri: str) -> CheckpointInfo:
    """The checkpoint a (checked) manifest describes."""
    return CheckpointInfo(
        id=str(doc["id"]), uri=uri, generation=int(doc["generation"]),
        sequence=int(doc["sequence"]), created=float(doc["created"]),
        files=tuple(CheckpointFile(str(f["name"]), int(f["size"]), str(f["xxh3_128"]))
                    for f in doc["files"]),
    )


def parse_manifest(raw: bytes, cid: str, loc: Location) -> dict[str, Any]:
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
    if doc.get("digest") != manifest_digest(doc):
        raise CheckpointCorruptedError(f"{where}: the manifest fails its checksum; {remedy}")
    if doc.get("id") != cid:
        raise CheckpointCorruptedError(
            f"{where}: the manifest names checkpoint {doc.get('id')!r}; {remedy}")
    try:
        info_of(doc, loc.uri)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointCorruptedError(f"{where}: the manifest lacks {exc}; {remedy}") from exc
    return doc


def manifest_ids(loc: Location) -> list[str]:
    """Ids of the complete checkpoints at ``loc``, oldest first."""
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path(MANIFESTS), allow_not_found=True))
    found = []
    for fi in infos:
        m = _MANIFEST_NAME.match(fi.base_name)
        if m and fi.type == pafs.FileType.File:
            found.append((int(m.group(1)), fi.base_name[: -len(".json")]))
    return [cid for _, cid in sorted(found)]


@dataclass(frozen=True)
class Listed:
    """An object as the location lists it."""

    size: int
    mtime_ns: int | None


def list_objects(loc: Location) -> dict[str, Listed]:
    """Every object at ``loc`` as listed (size, modification time)."""
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path(OBJECTS), allow_not_found=True))
    return {fi.base_name: Listed(int(fi.size or 0), fi.mtime_ns)
            for fi in infos if fi.type == pafs.FileType.File}


def read_manifest(loc: Location, cid: str) -> dict[str, Any]:
    """Manifest ``cid``, checked; :class:`CheckpointNotFoundError` lists the ones there."""
    path = loc.path(MANIFESTS, f"{cid}.json")
    try:
        with loc.fs.open_input_stream(path) as f:
            raw = f.read()
    except FileNotFoundError:
        known = manifest_ids(loc)
        raise CheckpointNotFoundError(
            f"no checkpoint {cid!r} at {loc.uri} (checkpoints there: "
            f"{', '.join(known) if known else 'none'})") from None
    return parse_manifest(raw, cid, loc)


def list_checkpoints(uri: str, *, filesystem: pafs.FileSystem | None = None
                     ) -> list[CheckpointInfo]:
    """Every complete checkpoint at ``uri``, oldest first.

    A checkpoint whose manifest is damaged is left out (and logged); restoring it by id
    raises :class:`~joinstate.errors.CheckpointCorruptedError`.
    """
    loc = Location.of(uri, filesystem)
    out = []
    with fs_errors(loc, "list checkpoints"):
        for cid in manifest_ids(loc):
            try:
                out.append(info_of(read_manifest(loc, cid), loc.uri))
            except (CheckpointCorruptedError, CheckpointNotFoundError) as exc:
                log.warning("%s", exc)
    return out


def latest_checkpoint(uri: str, *, filesystem: pafs.FileSystem | None = None
                      ) -> CheckpointInfo | None:
    """The newest complete checkpoint at ``uri`` (None if there is none).

    Raises :class:`~joinstate.errors.CheckpointCorruptedError` if its manifest is damaged.
    """
    loc = Location.of(uri, filesystem)
    with fs_errors(loc, "read the latest checkpoint"):
        ids = manifest_ids(loc)
        return info_of(read_manifest(loc, ids[-1]), loc.uri) if ids else None


class Damaged(Exception):
    """An object at the location is not the file the manifest records (internal)."""

    def __init__(self, f: CheckpointFile, problem: str) -> None:
        super().__init__(f"{f.name} (objects/{f.object}) {problem}")
        self.file = f


def read_object(loc: Location, f: CheckpointFile, out: BinaryIO | None = None) -> None:
    """Read object ``f`` from ``loc`` (into ``out``), checking size and checksum.

    Raises :class:`Damaged` saying what is wrong (missing, size, checksum).
    """
    h = xxhash.xxh3_128()
    n = 0
    try:
        stream = loc.fs.open_input_stream(loc.path(OBJECTS, f.object))
    except FileNotFoundError:
        raise Damaged(f, "is missing") from None
    with stream:
        while chunk := stream.read(CHUNK):
            h.update(chunk)
            if out is not None:
                out.write(chunk)
            n += len(chunk)
    if n != f.size:
        raise Damaged(f, f"has {n} bytes, the manifest records {f.size}")
    if h.hexdigest() != f.checksum:
        raise Damaged(f, "fails its xxh3-128 checksum")


def parallel(calls: Sequence[Callable[[], None]]) -> None:
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
