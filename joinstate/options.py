"""Store and per-index options: frozen, validated, and translated into rocksdict in one place.

Why one translation point: rocksdict has sharp edges (hash-based memtables need
``allow_concurrent_memtable_write=False`` at DB level, ``SstFileWriter`` needs raw-mode
options or it writes keys for another comparator, ``WriteOptions.disable_wal`` is a
property, not a method).  Keeping every call that builds rocksdict
options in :meth:`StoreOptions.db_options` / :meth:`StoreOptions.cf_options` means each
pitfall is handled once, and an option can never be silently dropped on the way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import rocksdict as rd

from joinstate._probe import COST_GET_US, COST_SCAN_US
from joinstate.errors import OptionsError
from joinstate.names import option_aliases

__all__ = ["COST_GET_US", "COST_SCAN_US", "Compression", "IndexOptions", "Memtable",
           "ProbeMode", "StoreOptions"]
# COST_GET_US / COST_SCAN_US: the cost model ``probe="auto"`` decides by (µs per point get,
# per scanned row), public for planners that choose a probe mode per store.

Memtable = Literal["skiplist", "hash_skip_list", "hash_link_list", "vector"]
ProbeMode = Literal["auto", "point", "scan"]
"""How a push reads the other side: ``auto`` by the probe policy (ski rental), ``point``
always by multi-get / bounded prefix iteration, ``scan`` always by a full scan into the
probe cache (kept within ``probe_cache_max_rows``)."""
Compression = Literal["none", "snappy", "lz4", "zstd"]

_MEMTABLES: tuple[str, ...] = ("skiplist", "hash_skip_list", "hash_link_list", "vector")
_COMPRESSIONS: tuple[str, ...] = ("none", "snappy", "lz4", "zstd")
_PROBES: tuple[str, ...] = ("auto", "point", "scan")
_MIB = 1 << 20


def _problems_for_size(name: str, value: int | None, low: int, high: int) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [f"{name}={value!r} must be an int"]
    if not low <= value <= high:
        return [f"{name}={value} must be between {low} and {high}"]
    return []


@dataclass(frozen=True)
class IndexOptions:
    """Overrides for one index (one column family).  ``None`` keeps the store default.

    Memtable choice matters: a hash skip list suits a small, read-heavy side (measured:
    2x the point gets of a skip list); the default skip list suits a big, write-heavy one.
    """

    memtable: Memtable | None = None
    write_buffer_size: int | None = None
    disable_auto_compactions: bool | None = None
    bloom_bits_per_key: int | None = None
    hash_bucket_count: int = 1_000_000

    @classmethod
    def from_runtime(cls, options: Mapping[str, str]) -> IndexOptions | None:
        """Run-time options (``set_options`` strings) as overrides; None if one has no field.

        A family not created yet takes them as creation options instead of a call.
        """
        fields: dict[str, Any] = {}
        for key, value in options.items():
            if key == "disable_auto_compactions" and value in ("true", "false"):
                fields[key] = value == "true"
            elif key == "write_buffer_size" and value.isdigit():
                fields[key] = int(value)
            else:
                return None
        return cls(**fields)

    def over(self, base: IndexOptions | None) -> IndexOptions:
        """``base`` with the options this one sets (not None) replacing its own."""
        if base is None:
            return self
        return dataclasses.replace(base, **{
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None})

    def __post_init__(self) -> None:
        problems = self.problems("IndexOptions")
        if problems:
            raise OptionsError("invalid IndexOptions: " + "; ".join(problems))

    def problems(self, where: str) -> list[str]:
        """Every invalid field, each named (``where`` prefixes the names)."""
        out: list[str] = []
        if self.memtable is not None and self.memtable not in _MEMTABLES:
            out.append(f"{where}.memtable={self.memtable!r} must be one of {_MEMTABLES}")
        out += _problems_for_size(
            f"{where}.write_buffer_size", self.write_buffer_size, 1 * _MIB, 4096 * _MIB
        )
        out += _problems_for_size(f"{where}.bloom_bits_per_key", self.bloom_bits_per_key, 0, 64)
        out += _problems_for_size(f"{where}.hash_bucket_count", self.hash_bucket_count, 1, 1 << 30)
        if self.disable_auto_compactions is not None and not isinstance(
            self.disable_auto_compactions, bool
        ):
            out.append(f"{where}.disable_auto_compactions must be a bool")
        return out


@dataclass(frozen=True)
class StoreOptions:
    """Options of one state store (one RocksDB directory).

    Defaults: a 64 MiB memtable (RocksDB's default), bloom filters at 10 bits/key so
    point probes stay cheap even with many L0 files (measured: point hits only 1.7x
    slower on ~50 L0 files with bloom, 12-16x without), no compression (the CPU is the
    scarce resource on small machines), WAL on.
    """

    write_buffer_size: int = 64 * _MIB
    block_cache_size: int = 256 * _MIB
    bloom_bits_per_key: int = 10
    compression: Compression = "none"
    wal: bool = True
    memtable: Memtable = "skiplist"
    disable_auto_compactions: bool = False
    max_background_jobs: int = 2
    statistics: bool = True
    probe_cache_max_rows: int = 2_000_000
    probe: ProbeMode = "auto"
    unique_filter_max_rows: int = 50_000_000
    index_overrides: Mapping[str, IndexOptions] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems: list[str] = []
        problems += _problems_for_size(
            "write_buffer_size", self.write_buffer_size, 1 * _MIB, 4096 * _MIB
        )
        problems += _problems_for_size("block_cache_size", self.block_cache_size, 0, 1 << 40)
        problems += _problems_for_size("bloom_bits_per_key", self.bloom_bits_per_key, 0, 64)
        problems += _problems_for_size("max_background_jobs", self.max_background_jobs, 1, 64)
        problems += _problems_for_size(
            "probe_cache_max_rows", self.probe_cache_max_rows, 0, 1 << 40
        )
        problems += _problems_for_size(
            "unique_filter_max_rows", self.unique_filter_max_rows, 0, 1 << 40
        )
        if self.compression not in _COMPRESSIONS:
            problems.append(f"compression={self.compression!r} must be one of {_COMPRESSIONS}")
        if self.probe not in _PROBES:
            problems.append(f"probe={self.probe!r} must be one of {_PROBES}")
        if self.memtable not in _MEMTABLES:
            problems.append(f"memtable={self.memtable!r} must be one of {_MEMTABLES}")
        for flag in ("wal", "disable_auto_compactions", "statistics"):
            if not isinstance(getattr(self, flag), bool):
                problems.append(f"{flag}={getattr(self, flag)!r} must be a bool")
        if not isinstance(self.index_overrides, Mapping):
            problems.append("index_overrides must be a mapping of index name -> IndexOptions")
        else:
            for name, ov in self.index_overrides.items():
                if not isinstance(ov, IndexOptions):
                    problems.append(f"index_overrides[{name!r}] must be an IndexOptions")
        if problems:
            raise OptionsError("invalid StoreOptions: " + "; ".join(problems))
        # Freeze the mapping too, so a frozen dataclass really is immutable.
        object.__setattr__(self, "index_overrides", MappingProxyType(dict(self.index_overrides)))

    def replace(self, **changes: Any) -> StoreOptions:
        """Return a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    # ---- the one translation point into rocksdict -------------------------------------

    def resolved(self, index: str, extra: IndexOptions | None = None) -> IndexOptions:
        """Effective options of ``index``: store defaults, then overrides, then ``extra``.

        ``index_overrides`` keys may name a column family exactly or the source it
        indexes (``sales.right`` for the right side of join ``sales``).
        """
        merged: dict[str, Any] = {
            "memtable": self.memtable,
            "write_buffer_size": self.write_buffer_size,
            "disable_auto_compactions": self.disable_auto_compactions,
            "bloom_bits_per_key": self.bloom_bits_per_key,
        }
        layers = [self.index_overrides.get(a) for a in reversed(option_aliases(index))]
        for layer in (*layers, extra):
            if layer is None:
                continue
            for f in dataclasses.fields(layer):
                value = getattr(layer, f.name)
                if value is not None:
                    merged[f.name] = value
        return IndexOptions(**merged)

    def db_options(self, create: bool = False) -> rd.Options:
        """DB-wide rocksdict options (raw mode; the settings no column family can change).

        ``create``: allow creating a new database (only ever for an empty directory: a
        directory whose ``CURRENT`` file went missing must not be silently replaced by
        an empty database).  Paranoid checks make RocksDB verify what it reads at open.
        """
        o = rd.Options(raw_mode=True)
        o.create_if_missing(create)
        o.create_missing_column_families(True)
        o.set_paranoid_checks(True)
        # A torn last WAL record (a crash mid-write) is dropped, as it must be; anything
        # else that fails its checksum is an error.  RocksDB's default recovery would stop
        # replaying at the first bad record and open with the rest of the log missing.
        o.set_wal_recovery_mode(rd.DBRecoveryMode.tolerate_corrupted_tail_records())
        # Required by hash_skip_list / hash_link_list / vector memtables (RocksDB refuses
        # them otherwise); a store serializes its writers, so nothing is lost by it.
        o.set_allow_concurrent_memtable_write(False)
        o.set_max_background_jobs(self.max_background_jobs)
        if self.statistics:
            o.enable_statistics()
        return o

    def cf_options(
        self, index: str, cache: rd.Cache | None, extra: IndexOptions | None = None, *,
        prefix_extractor: bool = True,
    ) -> rd.Options:
        """Options of one column family, with overrides for ``index`` applied."""
        eff = self.resolved(index, extra)
        o = rd.Options(raw_mode=True)
        o.set_max_background_jobs(self.max_background_jobs)
        assert eff.write_buffer_size is not None
        o.set_write_buffer_size(eff.write_buffer_size)
        o.set_disable_auto_compactions(bool(eff.disable_auto_compactions))
        o.set_compression_type(_compression(self.compression))
        table = rd.BlockBasedOptions()
        if eff.bloom_bits_per_key:
            table.set_bloom_filter(eff.bloom_bits_per_key, False)
        if cache is not None:
            table.set_block_cache(cache)
        o.set_block_based_table_factory(table)
        memtable = eff.memtable or "skiplist"
        if prefix_extractor:
            # Every index key starts with the 8-byte hash of the join key.
            o.set_prefix_extractor(rd.SliceTransform.create_fixed_prefix(8))
            o.set_memtable_prefix_bloom_ratio(0.1)
        elif memtable in ("hash_skip_list", "hash_link_list"):
            memtable = "skiplist"  # hash memtables need a prefix extractor
        if memtable == "hash_skip_list":
            o.set_memtable_factory(rd.MemtableFactory.hash_skip_list(eff.hash_bucket_count, 4, 4))
        elif memtable == "hash_link_list":
            o.set_memtable_factory(rd.MemtableFactory.hash_link_list(eff.hash_bucket_count))
        elif memtable == "vector":
            o.set_memtable_factory(rd.MemtableFactory.vector())
        return o

    def write_options(self) -> rd.WriteOptions:
        """Write options; ``disable_wal`` is a property in rocksdict, not a method."""
        wo = rd.WriteOptions()
        wo.disable_wal = not self.wal
        return wo


def _compression(name: str) -> Any:
    kinds = {
        "none": rd.DBCompressionType.none,
        "snappy": rd.DBCompressionType.snappy,
        "lz4": rd.DBCompressionType.lz4,
        "zstd": rd.DBCompressionType.zstd,
    }
    return kinds[name]()
