"""The state store: one RocksDB directory (a shard) holding the indexes of many joins.

Lifecycle contract: a store owns its RocksDB handle and every column-family object it
hands out.  ``close()`` drops all of them before closing the DB, because rocksdict keeps
the directory LOCK while any column-family object or iterator is alive (ROCKSDICT.md
pitfall 4); nothing here relies on garbage collection to release RocksDB.  A store is
not thread-safe: one writer per shard is the model (Spark gives each shard one task).

The ``__meta__`` column family holds the catalog (one JSON spec per join), the layout
version, and per-index counters (rows, entries, batch sequence, distinct keys), all
updated in the same WriteBatch as the data they describe.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import rocksdict as rd

from joinstate.activity import ACTIVITY_COUNTERS, statistics_counters
from joinstate.errors import (
    JoinStateError,
    SchemaMismatchError,
    StateClosedError,
    StateCorruptedError,
    StateLockedError,
    StateReadOnlyError,
)
from joinstate.options import IndexOptions, StoreOptions

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

    from joinstate.join import How, Join
    from joinstate.side import Side

__all__ = ["LAYOUT_VERSION", "StateStore"]

LAYOUT_VERSION = 1
META_CF = "__meta__"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}$")
_I64BE = struct.Struct(">q")


def _is_rocksdb_dir(path: Path) -> bool:
    return (path / "CURRENT").exists()


class StateStore:
    """A RocksDB directory with the state of one or more joins.

    Use as a context manager, or call :meth:`close` explicitly.
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
        self._cache = rd.Cache(self.options.block_cache_size) if self.options.block_cache_size \
            else None
        self._db_options = self.options.db_options()
        self._write_options = self.options.write_options()
        self._cfs: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}
        self._meta_cache: dict[bytes, int] = {}
        self._joins: dict[str, Join] = {}
        self._db: Any = None
        if read_only and not _is_rocksdb_dir(self.path):
            raise StateCorruptedError(
                f"no state store at {self.path} to open read-only; create it with a writer first"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        existing: list[str] = []
        if _is_rocksdb_dir(self.path):
            try:
                existing = list(rd.Rdict.list_cf(str(self.path), rd.Options(raw_mode=True)))
            except Exception as exc:
                raise StateCorruptedError(
                    f"cannot list column families of {self.path}: {exc}"
                ) from exc
        column_families = {
            name: self.cf_options(name) for name in existing if name != "default"
        }
        column_families.setdefault(META_CF, self.cf_options(META_CF))
        try:
            # Read-only opens take no LOCK and replay the writer's WAL: a consistent view
            # of a store another process is writing (as of the open), for inspection.
            access = rd.AccessType.read_only(False) if read_only else rd.AccessType.read_write()
            self._db = rd.Rdict(
                str(self.path), self._db_options, column_families=column_families,
                access_type=access,
            )
        except Exception as exc:
            msg = str(exc)
            if "lock" in msg.lower():
                raise StateLockedError(
                    f"state store {self.path} is already open (by this or another process): "
                    f"{msg}; close the other store first"
                ) from exc
            raise StateCorruptedError(f"cannot open state store {self.path}: {msg}") from exc
        self._check_layout_version()

    # ---- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> StateStore:
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
        """Flush nothing extra (the WAL or an explicit flush made data durable) and close.

        Safe to call twice.  Joins bound to this store become unusable.
        """
        if self._db is None:
            return
        for j in self._joins.values():
            j._detach()
        self._joins.clear()
        self._cfs.clear()
        self._handles.clear()
        db, self._db = self._db, None
        db.close()

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
        index = name.startswith("j.") and not name.endswith(".nulls")
        return self.options.cf_options(name, self._cache, extra, prefix_extractor=index)

    def cf(self, name: str) -> Any:
        """The rocksdict view bound to column family ``name`` (created on first use)."""
        cf = self._cfs.get(name)
        if cf is None:
            db = self._require_open()
            try:
                cf = db.get_column_family(name)
            except Exception:
                self.require_writable(f"create column family {name!r}")
                cf = db.create_column_family(name, self.cf_options(name))
            self._cfs[name] = cf
        return cf

    def handle(self, name: str) -> Any:
        """The column-family handle for WriteBatch puts (always pass it: pitfall 1)."""
        h = self._handles.get(name)
        if h is None:
            self.cf(name)
            h = self._handles[name] = self._require_open().get_column_family_handle(name)
        return h

    def recreate_empty(self, name: str, extra: IndexOptions) -> None:
        """Re-create the empty column family ``name`` with ``extra`` options applied.

        RocksDB cannot switch a column family's memtable factory at run time, so a
        population driver that picks a memtable per side (hash skip list for the small
        side) does it here, before the first write.  Refuses a non-empty family.
        """
        self.require_writable(f"re-create column family {name!r}")
        db = self._require_open()
        if not self._is_empty(name):
            raise SchemaMismatchError(
                f"column family {name!r} in {self.path} already holds data; its memtable can "
                "only be chosen before the first write"
            )
        self._cfs.pop(name, None)
        self._handles.pop(name, None)
        db.drop_column_family(name)
        self._cfs[name] = db.create_column_family(name, self.cf_options(name, extra))

    def _is_empty(self, name: str) -> bool:
        # Total-order seek: with a prefix extractor and a hash memtable, a plain
        # seek_to_first does not see unflushed rows (they would look absent).
        ro = rd.ReadOptions()
        ro.set_total_order_seek(True)
        it = self.cf(name).iter(ro)
        try:
            it.seek_to_first()
            return not it.valid()
        finally:
            del it

    def column_families(self) -> list[str]:
        """Names of every column family in the store."""
        self._require_open()
        return [c for c in rd.Rdict.list_cf(str(self.path), rd.Options(raw_mode=True))]

    def write(self, wb: rd.WriteBatch) -> None:
        """Apply a WriteBatch atomically with the store's write options."""
        self.require_writable("write")
        self._require_open().write(wb, self._write_options)

    def meta_put(self, key: bytes, value: bytes) -> None:
        """Write one ``__meta__`` entry (catalog, phase, layout version)."""
        self.require_writable(f"write metadata {key!r}")
        self.cf(META_CF).put(key, value, self._write_options)

    @contextlib.contextmanager
    def wal_disabled(self) -> Iterator[None]:
        """Write without the WAL inside the block, then flush every memtable.

        For bulk loads that are restarted from scratch on failure anyway: the WAL costs a
        write per batch and buys nothing there.  The flush on a clean exit makes the data
        durable (after a failure the load is redone, so flushing would only cost time);
        the previous setting comes back either way.
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

    def activity(self) -> dict[str, int]:
        """Cumulative DB-wide RocksDB activity (compaction/flush/WAL bytes, stalls)."""
        counters = statistics_counters(self.statistics())
        return {name: counters.get(stat, 0) for name, stat in ACTIVITY_COUNTERS.items()}

    def flush(self) -> None:
        """Flush every memtable (used when the WAL is off, to make data durable)."""
        if self.read_only:
            return  # nothing of ours to flush
        for name in list(self._cfs):
            self._cfs[name].flush(True)

    # ---- metadata ---------------------------------------------------------------------

    def _check_layout_version(self) -> None:
        raw = self.cf(META_CF).get(b"layout_version")
        if raw is None and self.read_only:
            raise StateCorruptedError(f"{self.path} holds no joinstate state (no layout version)")
        if raw is None:
            self.meta_put(b"layout_version", str(LAYOUT_VERSION).encode())
        elif int(raw) != LAYOUT_VERSION:
            raise StateCorruptedError(
                f"{self.path} has state layout version {int(raw)}, this joinstate reads "
                f"{LAYOUT_VERSION}; repopulate the state or use a matching joinstate"
            )

    @staticmethod
    def _stat_key(cf: str, name: str) -> bytes:
        return b"stat\x00" + cf.encode() + b"\x00" + name.encode()

    def meta_int(self, cf: str, name: str) -> int:
        """A per-index counter from ``__meta__`` (0 if never written)."""
        key = self._stat_key(cf, name)
        v = self._meta_cache.get(key)
        if v is None:
            raw = self.cf(META_CF).get(key)
            v = 0 if raw is None else _I64BE.unpack(raw)[0]
            self._meta_cache[key] = v
        return v

    def stage_meta_ints(self, wb: rd.WriteBatch, deltas: dict[str, dict[str, int]]) -> dict[
        bytes, int
    ]:
        """Add counter updates to ``wb``; returns the new values to publish after the write."""
        h = self.handle(META_CF)
        new: dict[bytes, int] = {}
        for cf, stats in deltas.items():
            for name, d in stats.items():
                if d == 0:
                    continue
                key = self._stat_key(cf, name)
                value = self.meta_int(cf, name) + d
                new[key] = value
                wb.put(key, _I64BE.pack(value), h)
        return new

    def publish_meta(self, values: dict[bytes, int]) -> None:
        """Make counters written by a successful WriteBatch visible to readers."""
        self._meta_cache.update(values)

    def catalog_get(self, join: str) -> dict[str, Any] | None:
        """The stored spec of join ``join``, or None if the store has no such join."""
        raw = self.cf(META_CF).get(b"join\x00" + join.encode())
        return None if raw is None else json.loads(raw)

    def catalog_put(self, join: str, spec: dict[str, Any]) -> None:
        """Store the spec of join ``join`` in the catalog."""
        self.meta_put(b"join\x00" + join.encode(), json.dumps(spec, sort_keys=True).encode())

    def joins(self) -> list[str]:
        """Names of the joins in the catalog."""
        prefix = b"join\x00"
        ro = rd.ReadOptions()
        return [
            k[len(prefix):].decode()
            for k in self.cf(META_CF).keys(from_key=prefix, read_opt=ro)
            if k.startswith(prefix)
        ]

    # ---- joins ------------------------------------------------------------------------

    def join(
        self, name: str, left: Side, right: Side,
        how: How | Literal["inner"] = "inner",
        suffixes: tuple[str, str] = ("", "_right"),
    ) -> Join:
        """Create the join ``name``, or re-attach to it if the store already has it.

        Re-attaching requires the same spec (schemas, keys, unique keys, how, suffixes);
        anything else raises :class:`~joinstate.errors.JoinSpecMismatchError`.
        """
        from joinstate.join import Join

        self._require_open()
        if not isinstance(name, str) or not _NAME.match(name):
            raise SchemaMismatchError(
                f"join name {name!r} must be 1-128 characters of letters, digits, '_' or '-'"
            )
        existing = self._joins.get(name)
        j = Join(self, name, left, right, how, suffixes)
        if existing is not None:
            if existing.spec != j.spec:
                j._raise_spec_mismatch(existing.spec)
            return existing
        self._joins[name] = j
        return j

    def property_int(self, cf: str, name: str) -> int | None:
        """An integer RocksDB property of a column family, or None if unavailable."""
        try:
            v = self.cf(cf).property_int_value(name)
        except (JoinStateError, Exception):  # rocksdict raises plain Exceptions here
            return None
        return None if v is None else int(v)

    def statistics(self) -> str | None:
        """RocksDB's DB-wide statistics dump (None if statistics are off)."""
        if not self.options.statistics:
            return None
        stats = self._db_options.get_statistics()
        return None if stats is None else str(stats)
