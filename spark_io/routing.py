"""Routing: every row to shard ``xxh3(canonical join key) % shards``, shard i to partition i.

Rows reach their shard's task one of two ways.  A small change set (at most
:data:`COLLECT_MAX_ROWS` rows, found by :func:`collect_small` without a full pass) is
collected to the driver as Arrow and cut by shard there (:func:`split`): one piece per
shard that has rows, handed to one task each, so there is no Python routing stage and
no shuffle.  Anything larger is routed by Spark in two steps, both planned on the
driver and run on executors:

1. :class:`ShardRouter` (a ``mapInArrow`` function) adds a ``_shard`` column with
   :meth:`joinstate.keys.KeyCodec.shard_of`, the one implementation that
   :meth:`joinstate.Join.shard_of` also calls: the join's common key plan makes an
   ``IntegerType`` key on one side and a ``LongType`` key on the other encode to the
   same canonical bytes, so equal keys land on the same shard.  Rows whose key has a
   NULL never match; they are spread over the shards by a hash of their values
   (:mod:`spark_io.rowhash`), so that they do not all load one shard (joins created
   before that, by their manifest's partitioner, keep sending them to shard 0).  No
   state store is opened for this.
2. :func:`route` shuffles with ``repartition(shards, <partition key>)``.  Spark's hash
   partitioning sends a row to ``pmod(murmur3(partition key, seed 42), shards)``, which
   is not the identity, so the partition key of shard ``s`` is a number chosen with
   that murmur3 value (:func:`partition_keys`): partition ``i`` then holds exactly
   shard ``i``.  Correctness does not depend on this (a worker handles whatever shards
   its partition holds, one at a time); one shard per task is what spreads the work.

A shard's rows all reach one partition of one shuffle (or one piece of a collected
change set), hence one task per operation: that is the single-writer rule (a second
writer would fail on RocksDB's LOCK).

No Spark expression computes the shard: Spark's ``xxhash64`` is XXH64 over Spark's own
encoding of a value, not xxh3 over joinstate's canonical key bytes (which make an
``IntegerType`` key and a ``LongType`` key of one value the same), so the shard of a
row is only ever computed by :meth:`joinstate.keys.KeyCodec.shard_of`.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joinstate.keys import KeyCodec, key_plan
from spark_io.frames import cheap_to_probe, known_empty
from spark_io.manifest import JOIN_PARTITIONER
from spark_io.rowhash import row_hash64
from spark_io.types import arrow_schema, conform_batch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import Column, DataFrame

    from joinstate import SideName
    from spark_io.manifest import Manifest

__all__ = [
    "COLLECT_MAX_ROWS",
    "SHARD",
    "ShardRouter",
    "collect_small",
    "murmur3_long",
    "partition_keys",
    "route",
    "split",
]

SHARD = "_shard"
_M32 = 0xFFFFFFFF

COLLECT_MAX_ROWS = 100_000
"""Change sets up to this many rows are collected and cut by shard on the driver.

At ~100 bytes a row that is ~10 MB through the driver, collected in a few hundred
milliseconds; beyond it the shuffle spreads the routing over the executors.
"""


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h1: int, k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _M32
    k1 = _rotl32(k1, 15)
    k1 = (k1 * 0x1B873593) & _M32
    h1 ^= k1
    h1 = _rotl32(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def murmur3_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a LongType value (``Murmur3_x86_32.hashLong``), signed."""
    v = value & 0xFFFFFFFFFFFFFFFF
    h = _mix(_mix(seed & _M32, v & _M32), v >> 32)
    h ^= 8
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=64)
def partition_keys(shards: int) -> tuple[int, ...]:
    """For each shard ``s``, the smallest ``v >= 0`` with ``pmod(hash(v), shards) == s``."""
    keys: list[int | None] = [None] * shards
    missing = shards
    v = 0
    while missing:
        p = murmur3_long(v) % shards
        if keys[p] is None:
            keys[p] = v
            missing -= 1
        v += 1
    return tuple(k for k in keys if k is not None)


def partition_key_column(shards: int) -> Column:
    """A LongType column whose Spark hash partition (out of ``shards``) is ``_shard``."""
    lookup = F.array(*[F.lit(k).cast("long") for k in partition_keys(shards)])
    return F.element_at(lookup, F.col(SHARD) + F.lit(1)).cast("long")


class ShardRouter:
    """``mapInArrow`` function: append the ``_shard`` column to every batch of one side.

    Runs on executors; stateless, so a retried or re-evaluated task routes the same way.
    """

    def __init__(self, manifest: Manifest, side: SideName) -> None:
        self.side = side
        self.shards = manifest.shards
        s = manifest.side(side)
        self.schema = s.schema
        self.key = list(s.key)
        plan = key_plan(manifest.left.schema, manifest.left.key,
                        manifest.right.schema, manifest.right.key)
        self.codec = KeyCodec(self.key, plan, side)
        self.spread_nulls = manifest.partitioner == JOIN_PARTITIONER and self.shards > 1
        # A NULL-key row's shard: from its unique key if the side has one (an update of
        # the row keeps its shard), else from all its columns.
        self.row_columns = list(s.unique_key or self.schema.names)

    def shard_of(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """Shard of every row.

        A row with a non-NULL key goes where ``Join.shard_of`` sends it (the shard of its
        key).  A row whose key has a NULL goes to shard 0 in joins created before
        :data:`spark_io.manifest.JOIN_PARTITIONER`, else to the shard of
        :func:`spark_io.rowhash.row_hash64` of its values (taken in the side's types,
        so a change to the row meets it).
        """
        table = conform_batch(batch, self.schema)
        shards = self.codec.shard_of(table.select(self.key), self.shards).astype(np.int32)
        if self.spread_nulls:
            null = _null_keys(table, self.key)
            if null is not None:
                rows = _as_side_types(table.filter(pa.array(null)).select(self.row_columns),
                                      self.schema)
                spread = row_hash64(rows) % np.uint64(self.shards)
                shards[null] = spread.astype(np.int32)
        return shards

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Yield each batch with its ``_shard`` column appended."""
        for batch in batches:
            shard = pa.array(self.shard_of(batch), pa.int32())
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, shard], names=[*batch.schema.names, SHARD]
            )


def _null_keys(table: pa.Table, key: list[str]) -> np.ndarray | None:
    """Rows whose key has a NULL (as ``KeyCodec.encode`` says), or None if there are none."""
    null: np.ndarray | None = None
    for name in key:
        col = table.column(name)
        if not col.null_count:
            continue
        mask = np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)
        null = mask if null is None else null | mask
    return null


def _as_side_types(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns cast to the side's types, as the core will store them.

    A column that cannot be cast is left as it is: the core refuses that change anyway.
    """
    cols = []
    for name in table.column_names:
        col = table.column(name)
        want = schema.field(name).type
        if not col.type.equals(want):
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
                col = pc.cast(col, want, safe=True)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def route(df: DataFrame, manifest: Manifest, side: SideName) -> DataFrame:
    """``df`` with a ``_shard`` column, partition ``i`` holding exactly shard ``i``."""
    # Fail on the driver, naming the column, before any task starts.
    arrow_schema(df.schema)
    schema = T.StructType([*df.schema.fields, T.StructField(SHARD, T.IntegerType(), False)])
    routed = df.mapInArrow(ShardRouter(manifest, side), schema)
    return routed.repartition(manifest.shards, partition_key_column(manifest.shards))


def collect_small(df: DataFrame, max_rows: int | None = None) -> pa.Table | None:
    """``df``'s rows as one Arrow table if it has at most ``max_rows`` rows, else None.

    ``max_rows`` defaults to :data:`COLLECT_MAX_ROWS` (read at each call).

    A plan the optimizer proved empty gives an empty table without any job; otherwise,
    if looking at the first rows is cheap (:func:`spark_io.frames.cheap_to_probe`),
    one job collects at most ``max_rows + 1`` rows.  None means "route it with Spark"
    (too many rows, or a plan whose first rows cost a full pass): a caller that then
    routes ``df`` evaluates it once more, and uses only that evaluation.
    """
    if known_empty(df):
        return arrow_schema(df.schema).empty_table()
    limit = COLLECT_MAX_ROWS if max_rows is None else max_rows
    if limit < 1 or not cheap_to_probe(df):
        return None
    table = df.limit(limit + 1).toArrow()
    return table if table.num_rows <= limit else None


def split(table: pa.Table, manifest: Manifest, side: SideName) -> list[pa.RecordBatch]:
    """``table`` cut by shard: one batch per shard that has rows, with its ``_shard`` column.

    Ordered by shard; each batch keeps its rows in their order.  Runs on the driver with
    the same :class:`ShardRouter` the executors use.
    """
    if not table.num_rows:
        return []
    shards = ShardRouter(manifest, side).shard_of(table)
    table = table.combine_chunks()
    out = []
    for s in np.unique(shards).tolist():
        mine = shards == s
        piece = table if mine.all() else table.filter(pa.array(mine))
        column = pa.array(np.full(piece.num_rows, s, dtype=np.int32), pa.int32())
        # One batch per shard: each becomes one partition, so one task writes the shard.
        batches = piece.append_column(SHARD, column).combine_chunks().to_batches()
        out.append(batches[0] if len(batches) == 1 else pa.concat_batches(batches))
    return out
