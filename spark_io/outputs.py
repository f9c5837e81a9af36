"""Where operation outputs live: one directory the driver and every executor name alike.

Tasks write each operation's output Parquet files and the driver returns a DataFrame
reading them, so the directory must be reachable from both by one name.  Without
checkpoints that is ``<state_dir>/_spark/outputs`` (``state_dir`` is shared storage
then anyway).  With ``checkpoint_uri`` it defaults to ``<checkpoint_uri>/_outputs``,
which is already a location every executor writes to, so that the driver's
``state_dir`` (manifest, reports) may be a directory on the driver alone.

An :class:`OutputDir` is a URI or local path, opened with ``pyarrow.fs`` wherever it is
used (it pickles as its string; the filesystem is made again in each process).  Files
are published complete or not at all: written under a hidden ``.``-name and moved into
place, or written in place on object stores where a PUT is atomic.  Spark reads the
directory by the same name (:attr:`OutputDir.spark_path`); names starting with ``_`` or
``.`` are skipped by Spark's readers, which is where markers and temporary files go.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from joinstate.checkpoint import Location, child_uri

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["ATOMIC_PUT", "OutputDir", "ParquetOut"]

ATOMIC_PUT = frozenset({"s3", "gcs"})
"""Filesystems whose writes become visible only once complete (no rename needed)."""


@dataclass(frozen=True)
class OutputDir:
    """A directory of output files, by URI (``s3://...``, ``file:///...``) or local path."""

    uri: str

    def __getstate__(self) -> dict[str, str]:
        return {"uri": self.uri}  # the opened filesystem is not shipped to executors

    def __setstate__(self, state: dict[str, str]) -> None:
        object.__setattr__(self, "uri", state["uri"])

    @cached_property
    def location(self) -> Location:
        """The filesystem and its path (opened once per process)."""
        return Location.of(self.uri)

    @property
    def fs(self) -> pafs.FileSystem:
        """The pyarrow filesystem holding the directory."""
        return self.location.fs

    @property
    def root(self) -> str:
        """The directory's path in :attr:`fs`."""
        return self.location.root

    @property
    def is_local(self) -> bool:
        """Whether this is a directory of the local file system."""
        return self.fs.type_name == "local"

    @property
    def local_path(self) -> Path:
        """The directory as a local path (only for :attr:`is_local`)."""
        assert self.is_local, self.uri
        return Path(self.root)

    @property
    def spark_path(self) -> str:
        """The name Spark reads and writes the directory by."""
        return self.root if self.is_local else self.uri

    def child(self, name: str) -> OutputDir:
        """The subdirectory ``name`` (``/``-separated parts allowed)."""
        if self.is_local and "://" not in self.uri:
            return OutputDir(str(Path(self.uri) / name))
        return OutputDir(child_uri(self.uri, name))

    def path(self, name: str) -> str:
        """The filesystem path of entry ``name``."""
        return self.location.path(name)

    # ---- inspection ----------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the directory exists."""
        return self.fs.get_file_info(self.root).type == pafs.FileType.Directory

    def entries(self) -> list[tuple[str, bool]]:
        """``(name, is_directory)`` of every direct entry (none if the directory is missing)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return [(i.base_name, i.type == pafs.FileType.Directory) for i in infos]

    def names(self) -> list[str]:
        """Names of the direct entries, sorted."""
        return sorted(n for n, _ in self.entries())

    def holds_output(self) -> bool:
        """Whether a visible (not ``.``/``_``) entry exists."""
        with contextlib.suppress(OSError, pa.ArrowException):
            return any(not n.startswith((".", "_")) for n, _ in self.entries())
        return False

    def read_small(self, max_rows: int) -> pa.Table | None:
        """The rows of the directory's visible Parquet files as one table, or None.

        None if there are more than ``max_rows`` (counted from the footers first) or no
        file at all.  For the driver, which routes a small stage input itself instead of
        asking Spark for a job to read it.
        """
        import pyarrow.parquet as pq

        try:
            names = [n for n, is_dir in self.entries()
                     if not is_dir and n.endswith(".parquet") and not n.startswith((".", "_"))]
        except FileNotFoundError:
            return None
        if not names:
            return None
        files = [pq.ParquetFile(self.fs.open_input_file(self.path(n))) for n in sorted(names)]
        if sum(f.metadata.num_rows for f in files) > max_rows:
            return None
        return pa.concat_tables([f.read() for f in files], promote_options="permissive")

    def read_text(self, name: str) -> str | None:
        """The text of file ``name``, or None if it is missing or unreadable."""
        try:
            with self.fs.open_input_stream(self.path(name)) as f:
                data: bytes = f.read()
        except (OSError, pa.ArrowException):
            return None
        return data.decode()

    # ---- changes -------------------------------------------------------------------------

    def make(self) -> None:
        """Create the directory (and its parents); nothing if it exists."""
        self.fs.create_dir(self.root, recursive=True)

    def remove(self) -> None:
        """Delete the directory and everything in it; nothing if it is missing."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.root)

    def delete_file(self, name: str) -> None:
        """Delete file ``name``; nothing if it is missing."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(name))

    def write_text(self, name: str, text: str) -> None:
        """Write file ``name`` complete or not at all (replacing it)."""
        data = text.encode()

        def write(path: str) -> None:
            with self.fs.open_output_stream(path) as f:
                f.write(data)

        self._publish(name, write)

    def write_table(self, name: str, table: pa.Table, **options: object) -> None:
        """Write ``table`` as Parquet file ``name``, complete or not at all (replacing it)."""

        def write(path: str) -> None:
            pq.write_table(table, path, filesystem=self.fs, **options)

        self._publish(name, write)

    def copy_to(self, target: OutputDir) -> None:
        """Copy every file of this directory (recursively) into ``target``."""
        target.make()
        pafs.copy_files(self.root, target.root, source_filesystem=self.fs,
                        destination_filesystem=target.fs)

    def temporary(self, name: str) -> str:
        """A hidden path next to ``name`` (Spark's readers skip it)."""
        head, _, base = name.rpartition("/")
        hidden = f".{base}.{uuid.uuid4().hex[:8]}.tmp"
        return self.path(f"{head}/{hidden}" if head else hidden)

    def _publish(self, name: str, write: Callable[[str], None]) -> None:
        dst = self.path(name)
        parent = dst.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if self.fs.type_name in ATOMIC_PUT:
            write(dst)
            return
        tmp = self.temporary(name)
        try:
            write(tmp)
            self.fs.move(tmp, dst)  # a rename: replaces an earlier attempt's file
        except BaseException:
            with contextlib.suppress(OSError, pa.ArrowException):
                self.fs.delete_file(tmp)
            raise


class ParquetOut:
    """Rows written to Parquet file ``name`` of ``directory`` in pieces, published at the end.

    The file is written under a hidden temporary name and moved into place by
    :meth:`commit` (written in place on object stores), so readers never see a partial
    file and a failed attempt leaves at most a hidden file behind.
    """

    def __init__(self, directory: OutputDir, name: str, options: dict[str, object]) -> None:
        self.directory = directory
        self.name = name
        self.options = options
        atomic = directory.fs.type_name in ATOMIC_PUT
        self.target = directory.path(name)
        self.tmp = self.target if atomic else directory.temporary(name)
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        """Append ``table``'s rows (opening the file at the first non-empty one)."""
        if not table.num_rows:
            return
        if self.writer is None:
            fs = self.directory.fs
            fs.create_dir(self.target.rsplit("/", 1)[0], recursive=True)
            self.writer = pq.ParquetWriter(self.tmp, table.schema, filesystem=fs,
                                           **self.options)
        self.writer.write_table(table)
        self.rows += table.num_rows

    def commit(self) -> None:
        """Publish the file (or remove a stale one if this attempt produced no rows)."""
        if self.writer is None:
            self.directory.delete_file(self.name)
            return
        self.writer.close()
        self.writer = None
        if self.tmp != self.target:
            self.directory.fs.move(self.tmp, self.target)

    def abort(self) -> None:
        """Close and delete the unfinished file."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        with contextlib.suppress(OSError, pa.ArrowException):
            self.directory.fs.delete_file(self.tmp)


@contextlib.contextmanager
def parquet_out(directory: OutputDir, name: str, options: dict[str, object]
                ) -> Iterator[ParquetOut]:
    """A :class:`ParquetOut` committed on a clean exit and removed otherwise."""
    out = ParquetOut(directory, name, options)
    try:
        yield out
    except BaseException:
        out.abort()
        raise
    out.commit()
