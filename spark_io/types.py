"""Spark SQL types and Arrow types, mapped both ways without a running Spark session.

The mapping is the one Spark uses on the Arrow path (``mapInArrow``), pinned here so
that the schema a side is declared with, the Arrow batches a worker receives and the
Parquet a worker writes agree:

=====================  ===========================  =========================================
Spark                  Arrow                        note
=====================  ===========================  =========================================
Byte/Short/Int/Long    int8/int16/int32/int64       join keys of different widths still match
Float/Double           float32/float64
Boolean                bool
String                 string                       large_string accepted on input
Binary                 binary                       large_binary accepted on input
Date                   date32
Timestamp              timestamp[us, tz=UTC]        any time-zone label accepted on input
TimestampNTZ           timestamp[us]
Decimal(p, s)          decimal128(p, s)
=====================  ===========================  =========================================

Anything else (arrays, maps, structs, intervals) is rejected with the column's name.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from joinstate import SchemaMismatchError

__all__ = ["arrow_schema", "arrow_type", "conform_batch", "spark_schema", "spark_type"]

_SIMPLE: tuple[tuple[type[T.DataType], pa.DataType], ...] = (
    (T.ByteType, pa.int8()),
    (T.ShortType, pa.int16()),
    (T.IntegerType, pa.int32()),
    (T.LongType, pa.int64()),
    (T.FloatType, pa.float32()),
    (T.DoubleType, pa.float64()),
    (T.BooleanType, pa.bool_()),
    (T.StringType, pa.string()),
    (T.BinaryType, pa.binary()),
    (T.DateType, pa.date32()),
    (T.TimestampNTZType, pa.timestamp("us")),
    (T.TimestampType, pa.timestamp("us", tz="UTC")),
)
_SUPPORTED = "byte, short, int, long, float, double, boolean, string, binary, date, " \
    "timestamp, timestamp_ntz, decimal"


def arrow_type(dt: T.DataType, column: str = "?") -> pa.DataType:
    """The Arrow type of a Spark column type; raises naming ``column`` if unsupported."""
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    for spark_cls, arrow in _SIMPLE:
        if type(dt) is spark_cls:
            return arrow
    raise SchemaMismatchError(
        f"column {column!r} has Spark type {dt.simpleString()}, which joinstate cannot "
        f"store; supported: {_SUPPORTED}"
    )


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """An Arrow schema with the same names, types (see the table above) and nullability."""
    return pa.schema([
        pa.field(f.name, arrow_type(f.dataType, f.name), nullable=f.nullable)
        for f in schema.fields
    ])


def spark_type(t: pa.DataType, column: str = "?") -> T.DataType:
    """The Spark type of an Arrow type (the inverse of :func:`arrow_type`, widened)."""
    if pa.types.is_decimal128(t):
        return T.DecimalType(t.precision, t.scale)
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pa.types.is_large_string(t):
        return T.StringType()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return T.BinaryType()
    if pa.types.is_date64(t):
        return T.DateType()
    for spark_cls, arrow in _SIMPLE:
        if t.equals(arrow):
            return spark_cls()
    raise SchemaMismatchError(
        f"column {column!r} has Arrow type {t}, which has no Spark SQL equivalent here; "
        f"supported: {_SUPPORTED}"
    )


def spark_schema(schema: pa.Schema) -> T.StructType:
    """A Spark schema for an Arrow schema (used for the join's output)."""
    return T.StructType([
        T.StructField(f.name, spark_type(f.type, f.name), nullable=f.nullable)
        for f in schema
    ])


def _relabel(arr: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    src = arr.type
    if src.equals(target):
        return arr
    same_instant = (
        pa.types.is_timestamp(src) and pa.types.is_timestamp(target)
        and src.unit == target.unit and (src.tz is None) == (target.tz is None)
    )
    var_width = (
        (pa.types.is_string(src) or pa.types.is_large_string(src))
        and (pa.types.is_string(target) or pa.types.is_large_string(target))
    ) or (
        (pa.types.is_binary(src) or pa.types.is_large_binary(src))
        and (pa.types.is_binary(target) or pa.types.is_large_binary(target))
    )
    if same_instant or var_width:
        return pc.cast(arr, target)
    return arr


def conform_batch(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.Table:
    """``batch``'s columns named by ``schema``, with representation-only differences removed.

    Spark labels timestamps with the session time zone and may send large string types;
    both are relabelled to ``schema``'s types (the values do not change).  Every other
    difference is left for :func:`joinstate.schema.conform_delta` to cast or reject, so
    the rules for what may be cast live in one place.
    """
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    names = [n for n in schema.names if n in table.column_names]
    cols = [_relabel(table.column(n), schema.field(n).type) for n in names]
    extra = [n for n in table.column_names if n not in schema.names]
    cols += [table.column(n) for n in extra]
    return pa.Table.from_arrays(cols, names=names + extra)
