"""``StoreOptions`` / ``IndexOptions``: validation, immutability, and their effect on a store.

Options are the one translation point into rocksdict, so a bad value must be caught
before RocksDB sees it, with *every* bad field named in one
:class:`~joinstate.OptionsError` (a user fixing a config file should not have to iterate
one field at a time).  Options are frozen so a store's configuration cannot drift after
it was opened.  Per-index overrides (``"<join>.<side>"`` or an exact column-family
name) must reach the right column family, and the exotic memtables they select
(``hash_skip_list``, ``hash_link_list``, ``vector``) must give exactly the same join
results as the default skip list: that is checked against a plain-Python join oracle
over a random change stream, with the probe cache off so that probes hit RocksDB.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import rocksdict as rd

import joinstate
from joinstate.names import index_cf
from joinstate.testing import zset

if TYPE_CHECKING:
    from pathlib import Path

W = joinstate.WEIGHT
MIB = 1 << 20
Row = tuple[Any, ...]

# --------------------------------------------------------------------------- validation

BAD_STORE_FIELDS: list[tuple[str, Any]] = [
    ("write_buffer_size", MIB - 1), ("write_buffer_size", 4097 * MIB),
    ("write_buffer_size", "64MB"), ("write_buffer_size", True), ("write_buffer_size", 64.0),
    ("block_cache_size", -1), ("block_cache_size", (1 << 40) + 1),
    ("bloom_bits_per_key", -1), ("bloom_bits_per_key", 65),
    ("compression", "gzip"), ("compression", None),
    ("wal", 1), ("wal", "yes"),
    ("memtable", "btree"), ("memtable", "HASH_SKIP_LIST"),
    ("disable_auto_compactions", 0),
    ("max_background_jobs", 0), ("max_background_jobs", 65),
    ("statistics", None),
    ("probe_cache_max_rows", -1),
    ("index_overrides", ["j.left"]),
]


@pytest.mark.parametrize(("field", "value"), BAD_STORE_FIELDS, ids=lambda x: repr(x))
def test_store_options_bad_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        joinstate.StoreOptions(**dict[str, Any]({field: value}))
    assert isinstance(info.value, joinstate.OptionsError)
    assert isinstance(info.value, ValueError)
    assert field in str(info.value)


def test_store_options_lists_every_bad_field() -> None:
    bad: dict[str, Any] = {"write_buffer_size": 1, "compression": "gzip", "max_background_jobs": 0,
           "wal": "no", "bloom_bits_per_key": 100, "memtable": "tree",
           "probe_cache_max_rows": -5, "block_cache_size": -1, "statistics": 2,
           "disable_auto_compactions": "false"}
    with pytest.raises(joinstate.OptionsError) as info:
        joinstate.StoreOptions(**bad)
    msg = str(info.value)
    for field in bad:
        assert field in msg, field
    # Two bad fields, both named; good fields are not blamed.
    with pytest.raises(joinstate.OptionsError) as info:
        joinstate.StoreOptions(write_buffer_size=3, compression="brotli",  # type: ignore[arg-type]
                               wal=False)
    msg = str(info.value)
    assert "write_buffer_size" in msg and "compression" in msg and "brotli" in msg
    assert "wal" not in msg


def test_index_overrides_values_must_be_index_options() -> None:
    with pytest.raises(joinstate.OptionsError) as info:
        joinstate.StoreOptions(index_overrides={"j.left": joinstate.IndexOptions(),
                                                "j.right": {"memtable": "vector"}})  # type: ignore[dict-item]
    assert "'j.right'" in str(info.value)
    assert "'j.left'" not in str(info.value)


BAD_INDEX_FIELDS: list[tuple[str, Any]] = [
    ("memtable", "btree"), ("write_buffer_size", 1), ("write_buffer_size", False),
    ("bloom_bits_per_key", 65), ("bloom_bits_per_key", 1.5), ("hash_bucket_count", 0),
    ("hash_bucket_count", (1 << 30) + 1), ("hash_bucket_count", "8"),
    ("disable_auto_compactions", "true"),
]


@pytest.mark.parametrize(("field", "value"), BAD_INDEX_FIELDS, ids=lambda x: repr(x))
def test_index_options_bad_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(joinstate.JoinStateError) as info:
        joinstate.IndexOptions(**dict[str, Any]({field: value}))
    assert isinstance(info.value, joinstate.OptionsError)
    assert field in str(info.value)


def test_index_options_lists_every_bad_field() -> None:
    bad: dict[str, Any] = {"memtable": "x", "write_buffer_size": 10, "bloom_bits_per_key": -1,
           "hash_bucket_count": 0, "disable_auto_compactions": 1}
    with pytest.raises(joinstate.OptionsError) as info:
        joinstate.IndexOptions(**bad)
    for field in bad:
        assert field in str(info.value), field


def test_boundary_values_are_accepted() -> None:
    for wbs in (MIB, 4096 * MIB):
        assert joinstate.StoreOptions(write_buffer_size=wbs).write_buffer_size == wbs
        assert joinstate.IndexOptions(write_buffer_size=wbs).write_buffer_size == wbs
    joinstate.StoreOptions(bloom_bits_per_key=0, block_cache_size=0, probe_cache_max_rows=0,
                           max_background_jobs=1)
    joinstate.StoreOptions(bloom_bits_per_key=64, max_background_jobs=64,
                           block_cache_size=1 << 40)
    joinstate.IndexOptions(hash_bucket_count=1, bloom_bits_per_key=0)
    joinstate.IndexOptions(hash_bucket_count=1 << 30, bloom_bits_per_key=64)
    for memtable in ("skiplist", "hash_skip_list", "hash_link_list", "vector"):
        joinstate.StoreOptions(memtable=memtable)
        joinstate.IndexOptions(memtable=memtable)


def test_replace_validates_again() -> None:
    base = joinstate.StoreOptions()
    assert base.replace(wal=False).wal is False
    assert base.wal is True
    with pytest.raises(joinstate.OptionsError, match="memtable"):
        base.replace(memtable="bad")


# --------------------------------------------------------------------------- frozen


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(joinstate.StoreOptions)])
def test_store_options_are_frozen(field: str) -> None:
    options = joinstate.StoreOptions()
    before = getattr(options, field)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, field, before)
    assert getattr(options, field) == before


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(joinstate.IndexOptions)])
def test_index_options_are_frozen(field: str) -> None:
    options = joinstate.IndexOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, field, None)


def test_index_overrides_mapping_is_frozen_and_copied() -> None:
    mine = {"j.left": joinstate.IndexOptions(memtable="vector")}
    options = joinstate.StoreOptions(index_overrides=mine)
    mine["j.right"] = joinstate.IndexOptions(memtable="hash_skip_list")
    del mine["j.left"]
    assert set(options.index_overrides) == {"j.left"}
    with pytest.raises(TypeError):
        options.index_overrides["j.right"] = joinstate.IndexOptions()  # type: ignore[index]
    assert options.resolved(CF("j.right")).memtable == "skiplist"
    assert options.resolved(CF("j.left")).memtable == "vector"


def CF(source: str) -> str:
    """The column family of ``source``'s index on ``k`` (every join here keys on ``k``)."""
    return index_cf(source, ["k"])


# --------------------------------------------------------------------------- resolution


def test_overrides_resolve_per_join_side_with_precedence() -> None:
    options = joinstate.StoreOptions(
        memtable="skiplist", write_buffer_size=64 * MIB, bloom_bits_per_key=10,
        index_overrides={
            "sales.right": joinstate.IndexOptions(memtable="hash_skip_list",
                                                  write_buffer_size=8 * MIB),
            CF("sales.right"): joinstate.IndexOptions(memtable="hash_link_list"),
            "sales.left": joinstate.IndexOptions(disable_auto_compactions=True),
            "dates.left": joinstate.IndexOptions(memtable="vector", bloom_bits_per_key=0),
        },
    )
    right = options.resolved(CF("sales.right"))
    assert right.memtable == "hash_link_list"  # the exact name wins over <join>.<side>
    assert right.write_buffer_size == 8 * MIB  # ... and the rest still layers
    assert right.bloom_bits_per_key == 10
    left = options.resolved(CF("sales.left"))
    assert left.memtable == "skiplist" and left.disable_auto_compactions is True
    assert left.write_buffer_size == 64 * MIB
    dates = options.resolved(CF("dates.left"))
    assert dates.memtable == "vector" and dates.bloom_bits_per_key == 0
    assert options.resolved(CF("dates.right")) == options.resolved(CF("other.left"))
    extra = options.resolved(CF("sales.right"), joinstate.IndexOptions(memtable="vector"))
    assert extra.memtable == "vector" and extra.write_buffer_size == 8 * MIB
    # A side's override is not its .nulls / .deg family's.
    assert options.resolved(CF("sales.right") + ".nulls").memtable == "skiplist"


@pytest.mark.parametrize("memtable", ["skiplist", "hash_skip_list", "hash_link_list", "vector"])
def test_cf_options_build_for_every_family(tmp_path: Path, memtable: str) -> None:
    overrides = {f"j.{side}": joinstate.IndexOptions(memtable=memtable)  # type: ignore[arg-type]
                 for side in ("left", "right", "left.deg", "right.nulls")}
    options = joinstate.StoreOptions(index_overrides=overrides, memtable=memtable)  # type: ignore[arg-type]
    cache = rd.Cache(MIB)
    left, right = CF("j.left"), CF("j.right")
    for name in ("__meta__", left, left + ".nulls", left + ".deg", right + ".nulls"):
        assert isinstance(options.cf_options(name, cache), rd.Options)
        assert isinstance(options.cf_options(name, None, prefix_extractor=False), rd.Options)
    side = joinstate.Side(pa.schema([("k", pa.int64())]), key=["k"])
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("j", left=side, right=side, how="full")
        for label in ("left", "right"):
            for cf in join.index(label).column_families:
                assert isinstance(store.cf_options(cf), rd.Options)
                assert isinstance(
                    store.cf_options(cf, joinstate.IndexOptions(memtable="vector")), rd.Options
                )
        out = join.push("left", pa.table({"k": [1, None]}))
        assert sorted(out.column("k").to_pylist(), key=str) == [1, None]


# --------------------------------------------------------------------------- store behaviour


LEFT_SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
RIGHT_SCHEMA = pa.schema([("k", pa.int32()), ("w", pa.string())])


def oracle(how: str, left: Counter[Row], right: Counter[Row]) -> Counter[Row]:
    """SQL bag semantics of ``left <how> right`` on k (NULL never matches)."""
    by_key: dict[Any, list[tuple[Row, int]]] = {}
    left, right = +left, +right  # drop rows whose weight went back to zero
    for r, w in right.items():
        if r[0] is not None:
            by_key.setdefault(r[0], []).append((r, w))
    out: Counter[Row] = Counter()
    matched_right: set[Any] = set()
    for lrow, lw in left.items():
        matches = by_key.get(lrow[0], []) if lrow[0] is not None else []
        if matches:
            matched_right.add(lrow[0])
        for rrow, rw in matches:
            out[lrow + rrow] += lw * rw
        if not matches and how in ("left", "full"):
            out[(*lrow, None, None)] += lw
    if how in ("right", "full"):
        for rrow, rw in right.items():
            if rrow[0] is None or rrow[0] not in matched_right:
                out[(None, None, *rrow)] += rw
    return out


def nonzero(c: Counter[Row]) -> dict[Row, int]:
    return {r: w for r, w in c.items() if w}


class SideModel:
    """Legal random batches for one side in a given layout, and the side's true content."""

    def __init__(self, layout: str, schema: pa.Schema, rng: random.Random, tag: str) -> None:
        self.layout, self.schema, self.rng, self.tag = layout, schema, rng, tag
        self.rows: Counter[Row] = Counter()
        self.fresh = 0

    def batch(self, n: int) -> tuple[pa.Table, list[tuple[Row, int]]]:
        entries: list[tuple[Row, int]] = []
        present = sorted((r for r, w in self.rows.items() if w > 0), key=repr)
        used_keys = {r[0] for r in present}
        for _ in range(n):
            if present and self.rng.random() < 0.3:
                r = present.pop(self.rng.randrange(len(present)))
                entries.append((r, -1))
                continue
            k = None if self.rng.random() < 0.1 else self.rng.randrange(60)
            self.fresh += 1
            if self.layout == "key":
                if k is not None and k in used_keys:
                    continue
                used_keys.add(k)
                r = (k, f"{self.tag}{self.fresh}")
            elif self.layout == "unique":
                r = (k, f"{self.tag}{self.fresh}")
            else:
                r = (k, f"{self.tag}{self.rng.randrange(4)}")  # rows repeat
            entries.append((r, self.rng.randint(1, 2) if self.layout == "bag" else 1))
        for r, w in entries:
            self.rows[r] += w
        cols = {f.name: pa.array([r[i] for r, _ in entries], f.type)
                for i, f in enumerate(self.schema)}
        cols[W] = pa.array([w for _, w in entries], pa.int64())
        return pa.table(cols), entries


JOINS = {
    # name: (how, left layout, right layout)
    "j": ("full", "bag", "unique"),
    "k": ("inner", "key", "bag"),
    "m": ("left", "unique", "key"),
}
OVERRIDES = {
    "j.left": joinstate.IndexOptions(memtable="hash_skip_list", hash_bucket_count=4096),
    "j.right": joinstate.IndexOptions(memtable="hash_link_list", hash_bucket_count=4096),
    "j.left.deg": joinstate.IndexOptions(memtable="vector"),
    CF("j.right") + ".deg": joinstate.IndexOptions(memtable="hash_skip_list"),
    "k.left": joinstate.IndexOptions(memtable="vector", write_buffer_size=2 * MIB),
    "k.right": joinstate.IndexOptions(memtable="hash_skip_list", bloom_bits_per_key=0),
    "m.left": joinstate.IndexOptions(memtable="hash_link_list"),
    "m.right": joinstate.IndexOptions(memtable="vector"),
    "m.right.deg": joinstate.IndexOptions(memtable="hash_link_list"),
}


def make_side(layout: str, schema: pa.Schema) -> joinstate.Side:
    unique = {"bag": None, "key": ["k"], "unique": [schema.names[1]]}[layout]
    return joinstate.Side(schema, key=["k"], unique_key=unique)


@pytest.mark.parametrize("name", list(JOINS))
def test_memtable_overrides_give_correct_joins(tmp_path: Path, name: str) -> None:
    how, llayout, rlayout = JOINS[name]
    options = joinstate.StoreOptions(index_overrides=OVERRIDES, probe_cache_max_rows=0,
                                     write_buffer_size=4 * MIB)
    rng = random.Random(f"options/{name}")
    models = {"left": SideModel(llayout, LEFT_SCHEMA, rng, "l"),
              "right": SideModel(rlayout, RIGHT_SCHEMA, rng, "r")}
    left, right = make_side(llayout, LEFT_SCHEMA), make_side(rlayout, RIGHT_SCHEMA)
    total: Counter[Row] = Counter()

    def push(join: joinstate.Join, side: str, n: int) -> None:
        table, _ = models[side].batch(n)
        total.update(zset(join.push(side, table)))  # type: ignore[arg-type]
        want = oracle(how, models["left"].rows, models["right"].rows)
        assert nonzero(total) == nonzero(want)

    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join(name, left=left, right=right, how=how)  # type: ignore[arg-type]
        for label in ("left", "right"):
            idx = join.index(label)
            short = f"{name}.{label}"
            assert options.resolved(idx.column_family).memtable == OVERRIDES[short].memtable
        # Big batches first, then small ones: small probes of a big side go to RocksDB
        # (multi-get or prefix iteration) rather than a scan into the probe cache.
        push(join, "left", 400)
        push(join, "right", 300)
        for i in range(12):
            push(join, "left" if i % 2 else "right", rng.randint(1, 4))
        for side in ("left", "right"):
            assert nonzero(zset(join.state(side))) == nonzero(models[side].rows)
        store.flush()
        push(join, "left", 3)
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join(name, left=left, right=right, how=how)  # type: ignore[arg-type]
        for i in range(6):
            push(join, "right" if i % 2 else "left", rng.randint(1, 30))
        for side in ("left", "right"):
            assert nonzero(zset(join.state(side))) == nonzero(models[side].rows)  # type: ignore[arg-type]
        stats = join.stats()
        for side in ("left", "right"):
            assert stats[side]["rows"] == sum(models[side].rows.values())


@pytest.mark.parametrize("compression", ["none", "snappy", "lz4", "zstd"])
def test_compression_and_store_wide_memtable(tmp_path: Path, compression: str) -> None:
    memtable = {"none": "vector", "snappy": "hash_skip_list", "lz4": "hash_link_list",
                "zstd": "skiplist"}[compression]
    options = joinstate.StoreOptions(compression=compression, memtable=memtable,  # type: ignore[arg-type]
                                     block_cache_size=0, bloom_bits_per_key=0)
    side = joinstate.Side(LEFT_SCHEMA, key=["k"])
    rows = {(i % 7, "x" * (i % 50)): 1 for i in range(200)}
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("c", left=side, right=side)
        join.push("left", pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}))
        store.flush()
    with joinstate.StateStore(tmp_path, options) as store:
        join = store.join("c", left=side, right=side)
        assert nonzero(zset(join.state("left"))) == rows
        out = join.push("right", pa.table({"k": [3], "v": ["probe"]}))
        assert nonzero(zset(out)) == {(*r, 3, "probe"): 1 for r in rows if r[0] == 3}
