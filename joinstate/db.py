"""The database under a state store: one RocksDB directory, its column families, counters.

:class:`Database` owns the RocksDB handle and everything that touches it directly:
opening safely, column families, atomic writes, ``__meta__`` records and counters, and
the mapping of RocksDB errors to named ones.  The modules that build on it (transactions,
layouts, indexes, joins) need only this; :class:`joinstate.StateStore` adds the joins.

Column families are created on first use, one at a time, or, inside
:meth:`Database.families_together`, all in one step at the end of the block or at the
first write to one of them: RocksDB rewrites its OPTIONS file (every family's options)
for each family it creates and each ``set_options``, so a new store's families and the
options its population gives them before loading (auto-compaction off) are set at
creation, not by one call each.

Lifecycle contract: a store owns its RocksDB handle and every column-family object it
hands out.  ``close()`` drops all of them before closing the DB, because rocksdict keeps
the directory LOCK while any column-family object or iterator is alive; nothing here
relies on garbage collection to release RocksDB.

Threads: a store may be shared by threads.  Every write (a push: prepare, write, probe
cache update) and every multi-step read (``state()``, ``stats()``, ``verify()``) holds
the store's re-entrant :attr:`lock`, so pushes are serialized.  rocksdict holds the GIL
during writes anyway, so serializing costs no parallelism; processes (one per shard,
as Spark runs them) are how work runs in parallel.

Opening never destroys anything: a new store is created only in a missing or empty
directory; a directory holding RocksDB files without ``CURRENT``, another RocksDB
database, or anything else raises :class:`~joinstate.errors.NotAStateStoreError`
before a byte is written, and one directory has one writer at a time
(:mod:`joinstate.directory`).  Changes RocksDB cannot make atomic (SST ingestion into
several families, dropping families) are finished at the next open if a crash
interrupted them (:mod:`joinstate.intents`).  Every RocksDB error is raised as a named
:class:`~joinstate.errors.JoinStateError` (:mod:`joinstate._rocks`).

The ``__meta__`` column family holds the catalog (one JSON spec per join), the layout
version, phases, commit records and per-column-family counters, all updated in the
same WriteBatch as the data they describe (:mod:`joinstate.names` lists every key).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import rocksdict as rd

from joinstate import _rocks
from joinstate.activity import activity_counters
from joinstate.directory import check_directory, claim, release
from joinstate.errors import (
    NotAStateStoreError,
    SchemaMismatchError,
    StateClosedError,
    StateCorruptedError,
    StateReadOnlyError,
)
from joinstate.intents import (
    drop_durably,
    finish_interrupted,
    ingest_durably,
    write_then_ingest,
)
from joinstate.names import (
    INGEST_INTENT_PREFIX,
    LAYOUT_VERSION_KEY,
    META_CF,
    counter_key,
    file_safe,
    is_keyed_cf,
    join_spec_key,
    join_spec_prefix,
)
from joinstate.options import IndexOptions, StoreOptions

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator, Mapping, Sequence
    from types import TracebackType

    from joinstate.intents import Record

__all__ = ["LAYOUT_VERSION", "Database"]

log = logging.getLogger(__name__)

LAYOUT_VERSION = 2
"""Version of the on-disk layout (column-family naming, keys, values, commit records)."""

_ZERO_WHEN_EMPTY = frozenset({
    "rocksdb.num-files-at-level0", "rocksdb.total-sst-files-size",
    "rocksdb.estimate-pending-compaction-bytes", "rocksdb.compaction-pending",
    "rocksdb.num-running-compactions", "rocksdb.num-running-flushes",
    "rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables",
    "rocksdb.estimate-num-keys", "rocksdb.cur-size-all-mem-tables",
})
"""Integer properties of a family not created yet: it holds no data (its memtable arena,
a few KiB once created, counts as 0 until then)."""
_DERIVED = "derived"
_ENTRIES = re.compile(r"# entries=(\d+)")


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class _Deferred:
    """The view of a family whose creation is deferred (:meth:`Database.families_together`).

    A caller that only makes sure a family exists (``store.cf(name)``) creates nothing.
    Reads (``get``, ``iter``) find nothing, as they would in the family once created:
    nothing can be written to it before it exists.  Any other use (a write, a flush,
    properties) creates the pending families and goes to the real one.
    """

    __slots__ = ("_db", "_name")

    def __init__(self, db: Database, name: str) -> None:
        self._db = db
        self._name = name

    def _real(self) -> Any:
        self._db.create_pending()
        return self._db.cf(self._name)

    def get(self, key: Any, default: Any = None, read_opt: Any = None) -> Any:
        """None for every key (a list of keys: a list of None), like rocksdict's get."""
        if self._name not in self._db._pending:  # noqa: SLF001 - created meanwhile
            real = self._real()
            return real.get(key, default) if read_opt is None else real.get(key, default, read_opt)
        if isinstance(key, list):
            return [default] * len(key)
        return default

    def iter(self, read_opt: Any = None) -> Any:
        """An iterator over no entries (or the real family's, once created)."""
        if self._name not in self._db._pending:  # noqa: SLF001 - created meanwhile
            return self._real().iter(read_opt) if read_opt is not None else self._real().iter()
        return _EmptyIter()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._real(), attr)


class _EmptyIter:
    """A rocksdict ``RdictIter`` over a family that holds nothing."""

    def valid(self) -> bool:
        return False

    def status(self) -> None:
        return None

    def seek(self, key: Any) -> None:
        return None

    def seek_for_prev(self, key: Any) -> None:
        return None

    def seek_to_first(self) -> None:
        return None

    def seek_to_last(self) -> None:
        return None

    def next(self) -> None:
        return None

    def prev(self) -> None:
        return None

    def key(self) -> Any:
        msg = "the iterator is not valid: the family holds nothing"
        raise ValueError(msg)

    def value(self) -> Any:
        msg = "the iterator is not valid: the family holds nothing"
        raise ValueError(msg)


class Database:
    """One RocksDB directory, opened safely; see the module docstring.

    Use as a context manager, or call :meth:`close` explicitly.  ``read_only=True`` opens
    a directory another process is writing (no LOCK; the writer's committed writes as of
    the open are visible) for inspection.
    """

    def __init__(
        self, path: str | Path, options: StoreOptions | None = None, *, read_only: bool = False
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.options = options if options is not None else StoreOptions()
        if not isinstance(self.options, StoreOptions):
            raise SchemaMismatchError(
                f"options must be a joinstate.StoreOptions, got {type(self.options).__name__}"
            )
        self.lock = threading.RLock()
        self._cache = rd.Cache(self.options.block_cache_size) if self.options.block_cache_size \
            else None
        self._write_options = self.options.write_options()
        self._cfs: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}
        self._counters: dict[bytes, int] = {}
        # Families known to exist in the open database, families whose creation is
        # deferred (see families_together), and options a family was given after its
        # creation (recreate_empty, set_cf_options) that a re-open must keep.
        self._families: set[str] = set()
        self._pending: set[str] = set()
        self._together = 0
        self._extra: dict[str, IndexOptions] = {}
        self._live: dict[str, dict[str, str]] = {}
        self._db: Any = None
        self._held: str | None = None
        if not read_only:
            self._held = claim(self.path, "open the state store", self)
        try:
            self._open(read_only)
        except BaseException:
            self.close()
            raise

    def _open(self, read_only: bool) -> None:
        try:
            create = check_directory(self.path, read_only)
        except OSError as exc:
            raise _rocks.translate(exc, self.path, "open the state store") from exc
        self._db_options = self.options.db_options(create=create)
        existing: list[str] = []
        if not create:
            with _rocks.rocks_errors(self.path, "list column families"):
                existing = list(rd.Rdict.list_cf(str(self.path), rd.Options(raw_mode=True)))
            if META_CF not in existing:
                raise NotAStateStoreError(
                    f"{self.path} is a RocksDB database but not a joinstate state store (no "
                    f"{META_CF!r} column family); nothing was changed; choose another path"
                )
            if not read_only:
                self._check_counts(existing)
        else:
            with _rocks.rocks_errors(self.path, "create the state store directory"):
                self.path.mkdir(parents=True, exist_ok=True)
        column_families = {
            name: self.cf_options(name) for name in existing if name != "default"
        }
        column_families.setdefault(META_CF, self.cf_options(META_CF))
        # Read-only opens take no LOCK and replay the writer's WAL: a consistent view of
        # a store another process is writing (as of the open), for inspection.
        access = rd.AccessType.read_only(False) if read_only else rd.AccessType.read_write()
        with _rocks.rocks_errors(self.path, "open the state store"):
            self._db = rd.Rdict(
                str(self.path), self._db_options, column_families=column_families,
                access_type=access,
            )
        self._families = set(column_families)
        self._check_layout_version(create)
        if not read_only:
            finish_interrupted(self)

    def _check_counts(self, existing: Sequence[str]) -> None:
        """Refuse a store whose files no longer hold what its metadata records.

        A damaged (e.g. truncated) MANIFEST makes RocksDB open the database with only the
        files it still lists, and delete the others as obsolete: rows would vanish
        silently.  So before the read-write open, a read-only open (which deletes
        nothing) checks what is cheap to check: the layout version every store writes
        at creation is there, and no family holds fewer physical entries (files plus
        memtables, from table properties: no data block is read) than its ``entries``
        counter records — every live key has at least one.
        """
        if not any(self.path.glob("*.sst")):
            return
        cfs = {n: self.cf_options(n) for n in existing if n != "default"}
        with _rocks.rocks_errors(self.path, "open the state store"):
            db = rd.Rdict(str(self.path), self.options.db_options(create=False),
                          column_families=cfs, access_type=rd.AccessType.read_only(False))
        try:
            with _rocks.rocks_errors(self.path, "check the state store's files"):
                meta = db.get_column_family(META_CF)
                if meta.get(LAYOUT_VERSION_KEY) is None:
                    raise StateCorruptedError(
                        f"{self.path}: the state store's metadata lost its layout version: "
                        "files are missing from the database (a damaged MANIFEST?). Nothing "
                        "was changed; restore the directory from a copy or repopulate"
                    )
                pending: set[str] = set()
                for key in meta.keys(from_key=INGEST_INTENT_PREFIX):
                    if not key.startswith(INGEST_INTENT_PREFIX):
                        break
                    pending.update(json.loads(meta[key])["files"])
                for name in existing:
                    if not (is_keyed_cf(name) or name.endswith(".nulls")) or name in pending:
                        continue
                    raw = meta.get(counter_key(name, "entries"))
                    want = 0 if raw is None else int.from_bytes(raw, "big", signed=True)
                    if want <= 0:
                        continue
                    cf = db.get_column_family(name)
                    props = cf.property_value("rocksdb.aggregated-table-properties") or ""
                    m = _ENTRIES.search(props)
                    have = int(m.group(1)) if m else 0
                    for p in ("rocksdb.num-entries-active-mem-table",
                              "rocksdb.num-entries-imm-mem-tables"):
                        have += int(cf.property_int_value(p) or 0)
                    del cf
                    if have < want:
                        raise StateCorruptedError(
                            f"{self.path}: column family {name!r} holds {have} entries in its "
                            f"files but its counter records {want}: files are missing from "
                            "the database (a damaged MANIFEST?). Nothing was changed; restore "
                            "the directory from a copy or repopulate"
                        )
                del meta
        finally:
            db.close()
            del db

    # ---- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._db is None

    def close(self) -> None:
        """Close the store (data is durable through the WAL or an explicit flush).

        Safe to call twice, and after any error: a failure while closing (a disk that
        filled up) is logged, not raised — every committed batch is already in the
        WAL, and reopening resumes from the last one.  Joins bound to this store become
        unusable.
        """
        with self.lock:
            if self._db is None:
                if self._held is not None:  # an open that failed
                    release(self._held, self)
                    self._held = None
                return
            if self._pending:
                try:
                    self.create_pending()
                except Exception as exc:  # closing must not raise (see above)
                    log.warning("creating column families while closing %s: %s", self.path,
                                exc)
                    self._pending.clear()
            if self._db is None:  # the re-open of create_pending failed
                self.close()
                return
            self._detach()
            self._cfs.clear()
            self._handles.clear()
            db, self._db = self._db, None
            try:
                db.close()
            except Exception as exc:  # rocksdict raises bare Exceptions
                log.warning("closing %s: %s", self.path,
                            _rocks.translate(exc, self.path, "close the state store"))
            finally:
                if self._held is not None:
                    release(self._held, self)
                    self._held = None

    def _detach(self) -> None:
        """Hook for subclasses: drop what is bound to the open database."""

    def _require_open(self) -> Any:
        if self._db is None:
            raise StateClosedError(f"state store {self.path} is closed")
        return self._db

    def require_writable(self, what: str) -> None:
        """Raise :class:`StateReadOnlyError` (naming ``what``) on a read-only store."""
        self._require_open()
        if self.read_only:
            raise StateReadOnlyError(
                f"cannot {what}: state store {self.path} was opened read-only; open it "
                "without read_only=True (one writer at a time) to change it"
            )

    # ---- column families --------------------------------------------------------------

    def cf_options(self, name: str, extra: IndexOptions | None = None) -> rd.Options:
        """The rocksdict Options of column family ``name`` (also what SstFileWriter needs)."""
        return self.options.cf_options(name, self._cache, extra,
                                       prefix_extractor=is_keyed_cf(name))

    def cf(self, name: str) -> Any:
        """The rocksdict view bound to column family ``name`` (created on first use).

        Inside :meth:`families_together` a missing family is not created here: its
        creation joins the others of the block (the view returned creates them all at
        its first use).
        """
        cf = self._cfs.get(name)
        if cf is None:
            if name in self._pending:
                return _Deferred(self, name)
            db = self._require_open()
            try:
                cf = db.get_column_family(name)
            except Exception:  # rocksdict: "column family not found"
                self.require_writable(f"create column family {name!r}")
                if self._together:
                    self._pending.add(name)
                    return _Deferred(self, name)
                with _rocks.rocks_errors(self.path, f"create column family {name!r}"):
                    cf = db.create_column_family(name, self.cf_options(name,
                                                                       self._extra.get(name)))
            self._cfs[name] = cf
            self._families.add(name)
        return cf

    @contextlib.contextmanager
    def families_together(self) -> Iterator[None]:
        """Create the column families first used inside the block in one step.

        RocksDB rewrites its OPTIONS file (every family's options) at each family it
        creates, and again at each ``set_options``: creating a pipeline's families one
        at a time costs ~10 ms each, and population then switches auto-compaction off
        on the families it loads.  Inside the block a missing family is only noted;
        options set on it (:meth:`set_cf_options`, :meth:`recreate_empty`) become its
        creation options, at no cost, and reads of it find nothing (nothing can be in
        it).  All of them are created by one re-open of the database listing them (one
        OPTIONS write), at the first write to any of them, any other use of one (a
        flush, a listing of the store's families, a checkpoint), or at the end of the
        block.  Meant for a new store (a population's): the re-open replays the WAL.

        Nothing is written to a family before it exists, so a crash leaves at most
        families that were never created, which the next open creates empty, exactly
        as if they had been created empty before the crash.
        """
        self.require_writable("create column families")
        self._together += 1
        try:
            yield
        except BaseException:
            self._together -= 1
            if not self._together and self._pending and self._db is not None:
                try:
                    self.create_pending()
                except Exception as exc:  # the block's own error is the one to raise
                    log.warning("creating column families in %s: %s", self.path, exc)
            raise
        self._together -= 1
        if not self._together:
            self.create_pending()

    def create_pending(self, needed: Collection[str] | None = None) -> None:
        """Create every family whose creation :meth:`families_together` deferred.

        ``needed``: only if one of these families is among them (a write about to use
        its handle); None: in any case.

        rocksdict creates families one at a time; a database opened with missing
        families listed creates them all and writes the OPTIONS file once.  So the
        database is closed and opened again with them listed: every committed write
        survives (RocksDB replays the WAL, or flushes what was written without it at the
        close), and every family keeps the options it was given.  No column-family view
        or iterator may be alive outside the store meanwhile: the store hands out views
        for immediate use only.
        """
        with self.lock:
            if not self._pending or (needed is not None and self._pending.isdisjoint(needed)):
                return
            db = self._require_open()
            pending = sorted(self._pending)
            names = (self._families | self._pending) - {"default"}
            families = {n: self.cf_options(n, self._extra.get(n)) for n in names}
            self._cfs.clear()
            self._handles.clear()
            self._db = None
            self._pending.clear()
            with _rocks.rocks_errors(self.path, f"create column families {pending}"):
                db.close()
                del db
                self._db = rd.Rdict(str(self.path), self._db_options,
                                    column_families=families,
                                    access_type=rd.AccessType.read_write())
            self._families = set(names)
            for name, options in self._live.items():
                with _rocks.rocks_errors(self.path, f"set options {options} on {name!r}"):
                    self.cf(name).set_options(dict(options))

    def handle(self, name: str) -> Any:
        """The column-family handle for WriteBatch puts (a put without one goes to default)."""
        h = self._handles.get(name)
        if h is None:
            if name in self._pending:
                self.create_pending()
            self.cf(name)
            h = self._handles[name] = self._require_open().get_column_family_handle(name)
        return h

    def recreate_empty(self, name: str, extra: IndexOptions) -> None:
        """Re-create the empty column family ``name`` with ``extra`` options applied.

        RocksDB cannot switch a column family's memtable factory at run time, so a
        population driver that picks a memtable per side (hash skip list for the small
        side) does it here, before the first write.  Refuses a non-empty family.  A
        family not created yet (:meth:`families_together`) is simply created so.
        """
        self.require_writable(f"re-create column family {name!r}")
        with self.lock:
            if name in self._pending:
                self._extra[name] = extra.over(self._extra.get(name))
                return
            db = self._require_open()
            # Total-order scan: with a prefix extractor and a hash memtable, a plain
            # seek_to_first does not see unflushed rows (they would look absent).
            if _rocks.iter_keys(self.cf(name), self.path, f"read {name}"):
                raise SchemaMismatchError(
                    f"column family {name!r} in {self.path} already holds data; its memtable "
                    "can only be chosen before the first write"
                )
            self._cfs.pop(name, None)
            self._handles.pop(name, None)
            self._live.pop(name, None)
            merged = extra.over(self._extra.get(name))
            with _rocks.rocks_errors(self.path, f"re-create column family {name!r}"):
                db.drop_column_family(name)
                self._cfs[name] = db.create_column_family(name, self.cf_options(name, merged))
            self._extra[name] = merged

    def drop_column_families(self, names: Sequence[str]) -> None:
        """Drop column families (and all their data); absent ones are skipped."""
        self.require_writable("drop column families")
        with self.lock:
            db = self._require_open()
            present = set(self.column_families())
            for name in names:
                self._cfs.pop(name, None)
                self._handles.pop(name, None)
                self._extra.pop(name, None)
                self._live.pop(name, None)
                self._pending.discard(name)
                self._families.discard(name)
                if name in present:
                    with _rocks.rocks_errors(self.path, f"drop column family {name!r}"):
                        db.drop_column_family(name)

    def forget_counters(self, cfs: Sequence[str]) -> None:
        """Drop cached counters of families whose counters were deleted."""
        prefixes = tuple(counter_key(cf, "") for cf in cfs)
        for key in [k for k in self._counters if k.startswith(prefixes)]:
            del self._counters[key]

    def column_families(self) -> list[str]:
        """Names of every column family in the store."""
        self._require_open()
        self.create_pending()
        with _rocks.rocks_errors(self.path, "list column families"):
            return list(rd.Rdict.list_cf(str(self.path), rd.Options(raw_mode=True)))

    def set_cf_options(self, cf: str, options: Mapping[str, str]) -> None:
        """Change mutable options of family ``cf`` at run time (e.g. auto-compaction)."""
        self.require_writable(f"set options of {cf!r}")
        wanted = dict(options)
        as_created = IndexOptions.from_runtime(wanted)
        with self.lock:
            if cf in self._pending and as_created is not None:
                # Not created yet: these become its creation options (no OPTIONS write).
                self._extra[cf] = as_created.over(self._extra.get(cf))
                return
            with _rocks.rocks_errors(self.path, f"set options {wanted} on {cf!r}"):
                self.cf(cf).set_options(wanted)
            if as_created is not None:
                self._extra[cf] = as_created.over(self._extra.get(cf))
            else:
                self._live.setdefault(cf, {}).update(wanted)

    def compact(self, cf: str) -> None:
        """Flush family ``cf`` and compact its whole key range (blocks until done)."""
        self.require_writable(f"compact {cf!r}")
        with _rocks.rocks_errors(self.path, f"compact {cf!r}"):
            h = self.cf(cf)
            h.flush(True)
            h.compact_range(None, None)

    def flush(self, cf: str | None = None) -> None:
        """Flush one family's memtables, or every family's (when the WAL is off)."""
        if self.read_only:
            return  # nothing of ours to flush
        names = [cf] if cf is not None else list(self._cfs)
        with _rocks.rocks_errors(self.path, "flush memtables"):
            for name in names:
                self.cf(name).flush(True)

    def ingest(self, cf: str, paths: Sequence[str]) -> None:
        """Ingest sorted SST files into family ``cf`` (the files are moved, not copied)."""
        self.require_writable(f"ingest files into {cf!r}")
        opts = rd.IngestExternalFileOptions()
        opts.set_move_files(True)
        with _rocks.rocks_errors(self.path, f"ingest {len(paths)} file(s) into {cf!r}"):
            self.cf(cf).ingest_external_file(list(paths), opts)

    # ---- writes -----------------------------------------------------------------------

    def write(self, wb: rd.WriteBatch, *, durable: bool = False) -> None:
        """Apply a WriteBatch atomically with the store's write options.

        ``durable``: through the WAL even while :meth:`wal_disabled` is in force (for
        records that must survive a crash of the process).
        """
        self.require_writable("write")
        options = self._write_options
        if durable and options.disable_wal:
            options = rd.WriteOptions()
        with _rocks.rocks_errors(self.path, "write a batch"):
            self._require_open().write(wb, options)

    def ingest_durably(self, files: Mapping[str, Sequence[str]], records: Sequence[Record]
                       ) -> None:
        """Ingest SST files into several families and write ``records``, crash-safely.

        The data and the records (counters, a commit record) become durable together:
        see :mod:`joinstate.intents`.
        """
        ingest_durably(self, files, records)

    def write_then_ingest(self, wb: rd.WriteBatch, files: Mapping[str, Sequence[str]]
                          ) -> None:
        """Write ``wb``, then ingest ``files`` into their families, crash-safely.

        See :func:`joinstate.intents.write_then_ingest`.
        """
        write_then_ingest(self, wb, files)

    def drop_durably(self, cfs: Sequence[str], records: Sequence[Record]) -> None:
        """Drop column families and write ``records`` (a catalog entry deleted), crash-safely.

        A crash in between is finished at the next open, before anything can use the
        families (:mod:`joinstate.intents`): the catalog and counters never describe
        families that are gone, nor do families outlive their catalog entry.
        """
        drop_durably(self, cfs, records)

    def meta_put(self, key: bytes, value: bytes) -> None:
        """Write one ``__meta__`` entry (catalog, phase, layout version)."""
        self.require_writable(f"write metadata {key!r}")
        with _rocks.rocks_errors(self.path, "write metadata"):
            self.cf(META_CF).put(key, value, self._write_options)

    def meta_get(self, key: bytes) -> bytes | None:
        """One ``__meta__`` entry, or None."""
        got = _rocks.multi_get(self.cf(META_CF), [key], self.path, "read metadata")
        return got[0]

    def meta_keys(self, prefix: bytes) -> list[bytes]:
        """Every ``__meta__`` key starting with ``prefix``."""
        return [k for k in _rocks.iter_keys(self.cf(META_CF), self.path, "read metadata")
                if k.startswith(prefix)]

    @contextlib.contextmanager
    def wal_disabled(self) -> Iterator[None]:
        """Write without the WAL inside the block, then flush every memtable.

        For bulk loads that are restarted from scratch on failure anyway: the WAL costs a
        write per batch and buys nothing there.  The flush on a clean exit makes the data
        durable; the previous setting comes back either way.
        """
        before = self._write_options.disable_wal
        self._write_options.disable_wal = True
        try:
            yield
            if not self.closed:
                self.flush()
        finally:
            self._write_options.disable_wal = before

    @property
    def wal_enabled(self) -> bool:
        """Whether writes currently go through the WAL."""
        return not self._write_options.disable_wal

    # ---- counters and metadata --------------------------------------------------------

    def _check_layout_version(self, create: bool) -> None:
        raw = self.meta_get(LAYOUT_VERSION_KEY)
        if raw is None and create and not self.read_only:
            self.meta_put(LAYOUT_VERSION_KEY, str(LAYOUT_VERSION).encode())
            return
        if raw is None:
            raise NotAStateStoreError(
                f"{self.path} holds no joinstate layout version: not a state store, or one "
                "whose creation was interrupted; choose another path"
            )
        if int(raw) != LAYOUT_VERSION:
            raise StateCorruptedError(
                f"{self.path} has state layout version {int(raw)}, this joinstate reads "
                f"{LAYOUT_VERSION}; repopulate the state or use a matching joinstate"
            )

    def counter(self, cf: str, name: str) -> int:
        """A per-column-family counter from ``__meta__`` (0 if never written)."""
        key = counter_key(cf, name)
        v = self._counters.get(key)
        if v is None:
            raw = self.meta_get(key)
            v = 0 if raw is None else int.from_bytes(raw, "big", signed=True)
            self._counters[key] = v
        return v

    def publish_counters(self, values: Mapping[bytes, int]) -> None:
        """Make counters written by a committed transaction visible to readers."""
        self._counters.update(values)

    def catalog_get(self, join: str) -> dict[str, Any] | None:
        """The stored spec of join ``join``, or None if the store has no such join."""
        raw = self.meta_get(join_spec_key(join))
        return None if raw is None else json.loads(raw)

    def catalog_put(self, join: str, spec: dict[str, Any]) -> None:
        """Store the spec of join ``join`` in the catalog."""
        self.meta_put(join_spec_key(join), json.dumps(spec, sort_keys=True).encode())

    def joins(self) -> list[str]:
        """Names of the joins in the catalog."""
        prefix = join_spec_prefix()
        return [k[len(prefix):].decode() for k in self.meta_keys(prefix)]

    # ---- derived state kept beside the database ---------------------------------------

    def save_arrays(self, name: str, stamp: Sequence[int], **arrays: np.ndarray) -> None:
        """Keep in-memory derived state (numpy arrays) beside the database, for a reopen.

        ``stamp`` names the state it was derived from (counters); :meth:`load_arrays`
        returns the arrays only for the same stamp.  Never needed for correctness: a
        missing or stale file only means rebuilding.  Written atomically.
        """
        if self.read_only:
            return
        folder = self.path / _DERIVED
        folder.mkdir(exist_ok=True)
        target = folder / f"{file_safe(name)}.npz"
        tmp = folder / f".{file_safe(name)}.tmp.npz"
        payload: dict[str, Any] = {"stamp": np.asarray(stamp, dtype=np.int64), **arrays}
        np.savez(tmp, **payload)
        os.replace(tmp, target)

    def drop_derived(self, cfs: Sequence[str]) -> None:
        """Delete the derived files kept for column families ``cfs`` (they were dropped).

        A family created again under the same name must not find them: a file's stamp
        (counters) could match the new family's by chance.  Derived files are named
        ``<kind>-<family>``; a file of another family whose name ends the same way may go
        too, which costs only its rebuild.
        """
        for f in self.derived_files(cfs):
            f.unlink(missing_ok=True)

    def derived_files(self, cfs: Sequence[str]) -> list[Path]:
        """The derived files kept beside the store for column families ``cfs``."""
        folder = self.path / _DERIVED
        if not cfs or not folder.is_dir():
            return []
        ends = tuple(f"-{file_safe(cf)}.npz" for cf in cfs)
        return sorted(f for f in folder.iterdir() if f.name.endswith(ends))

    def load_arrays(self, name: str, stamp: Sequence[int]) -> dict[str, np.ndarray] | None:
        """The arrays saved under ``name`` for exactly ``stamp``, else None."""
        target = self.path / _DERIVED / f"{file_safe(name)}.npz"
        if not target.exists():
            return None
        try:
            # Opened here so that the handle is closed even when np.load refuses the file
            # (a truncated archive); a damaged file is a rebuild, never a failed open.
            with open(target, "rb") as fh, np.load(fh) as data:
                if list(data["stamp"]) != list(stamp):
                    return None
                return {k: data[k] for k in data.files if k != "stamp"}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
            log.warning("ignoring unreadable %s: %s", target, exc)
            return None

    def discard_derived(self) -> None:
        """Delete every file of derived state kept beside the database.

        After the stored state was changed behind the in-memory structures' back (an
        undo applied, :mod:`joinstate.transaction`), a saved file could carry the stamp
        of a state the store reaches again with other contents; dropping them all only
        costs a rebuild.
        """
        shutil.rmtree(self.path / _DERIVED, ignore_errors=True)

    # ---- undo capture (see joinstate.transaction) --------------------------------------

    undo_capture: tuple[bytes, bytes] | None = None
    """``(key prefix, note)`` while :meth:`capturing_undo` is in force, else None."""

    @contextlib.contextmanager
    def capturing_undo(self, prefix: bytes, note: bytes = b"") -> Iterator[None]:
        """Every transaction committed inside the block also records its undo.

        The record goes under ``prefix`` + an 8-byte sequence in ``__meta__``, in the
        transaction's own WriteBatch (:class:`joinstate.transaction.Transaction`);
        ``note`` is kept in it for the caller (e.g. a digest of the operation).  For
        drivers whose transactions are created by a join or pipeline on their behalf.
        """
        before = self.undo_capture
        self.undo_capture = (prefix, note)
        try:
            yield
        finally:
            self.undo_capture = before

    def meta_items(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every ``__meta__`` key starting with ``prefix`` and its value, in key order.

        One bounded iterator (unlike :meth:`meta_keys`, it does not walk the family).
        """
        ro = rd.ReadOptions()
        ro.set_total_order_seek(True)
        upper = _prefix_end(prefix)
        if upper is not None:
            ro.set_iterate_upper_bound(upper)
        out: list[tuple[bytes, bytes]] = []
        with _rocks.rocks_errors(self.path, "read metadata"):
            it = self.cf(META_CF).iter(ro)
            try:
                it.seek(prefix)
                while it.valid():
                    key = it.key()
                    if not key.startswith(prefix):
                        break
                    out.append((key, it.value()))
                    it.next()
                it.status()
            finally:
                del it
        return out

    def latest_sequence(self) -> int:
        """RocksDB's sequence number of the last write (grows with every write)."""
        with _rocks.rocks_errors(self.path, "read the sequence number"):
            return int(self._require_open().latest_sequence_number())

    # ---- RocksDB facts ----------------------------------------------------------------

    def property_int(self, cf: str, name: str) -> int | None:
        """An integer RocksDB property of a column family, or None if unavailable.

        A family not created yet (:meth:`families_together`) holds nothing: its file,
        entry and compaction counts are 0 without creating it.
        """
        if cf in self._pending and name in _ZERO_WHEN_EMPTY:
            return 0
        try:
            v = self.cf(cf).property_int_value(name)
        except Exception:  # rocksdict raises bare Exceptions for unknown properties
            return None
        return None if v is None else int(v)

    def statistics(self) -> str | None:
        """RocksDB's DB-wide statistics dump (None if statistics are off)."""
        if not self.options.statistics:
            return None
        stats = self._db_options.get_statistics()
        return None if stats is None else str(stats)

    def activity(self) -> dict[str, int]:
        """Cumulative DB-wide RocksDB activity (compaction/flush/WAL bytes, stalls)."""
        return activity_counters(self.statistics())
