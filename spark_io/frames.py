"""What the driver learns about a DataFrame without running a Spark job.

Three questions decide how rows reach the shards (:mod:`spark_io.job`):

* **Is it known to be empty?** :func:`known_empty`: Spark's optimizer folds a plan it can
  prove empty (``limit(0)``, a filter on a literal false, an empty local relation) into
  an empty ``LocalRelation``, and a micro-batch of a source without data is an RDD of
  no partitions.  Such a change set needs no job at all.
* **Is it cheap to look at the first rows?** :func:`cheap_to_probe`: a plan of scans,
  projections, filters and unions only (no shuffle) stops reading as soon as a limit
  is met, so collecting ``limit(n + 1)`` rows costs a fraction of a full pass; a plan
  the optimizer estimates small is cheap in any case.
* **Is it a plain scan of Parquet files that pyarrow reads exactly as Spark would?**
  :func:`parquet_files`: then a task can read the files itself (no JVM scan, no
  transfer of the rows into Python, no shuffle), and the row count is in the files'
  footers, so counting needs no job either.

All three read the optimized logical plan over Py4J (classic Spark only; on Spark
Connect there is no JVM plan and every answer is the conservative one) and the
Parquet footers; none of them runs a Spark job.  :func:`count_rows` counts what the
footers cannot, in one job for both sides.
"""

from __future__ import annotations

import logging
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joinstate import SchemaMismatchError
from spark_io.types import arrow_schema

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pyspark.sql import DataFrame

__all__ = [
    "INT96_UNIT",
    "ParquetFiles",
    "cheap_to_probe",
    "count_rows",
    "known_empty",
    "parquet_files",
]

log = logging.getLogger(__name__)

_PARQUET = "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"
_PLAIN_INDEX = "org.apache.spark.sql.execution.datasources.InMemoryFileIndex"
_NARROW = frozenset({"Project", "Filter", "Union", "LogicalRDD", "LocalRelation",
                     "LogicalRelation", "Range", "SubqueryAlias"})
"""Logical plan nodes that need no shuffle: a limit over them stops reading early."""

PROBE_MAX_BYTES = 64 << 20
"""A plan with a shuffle is still probed when the optimizer estimates it this small."""

_SAFE_OPTIONS = frozenset({"path", "paths", "mergeschema", "recursivefilelookup",
                           "pathglobfilter", "modifiedbefore", "modifiedafter",
                           "basepath"})
"""Parquet read options that choose files or check schemas but change no value."""

_LEGACY_KEYS = (b"org.apache.spark.legacyDateTime", b"org.apache.spark.legacyINT96")

INT96_UNIT = "us"
"""pyarrow reads INT96 timestamps (Spark's default for writing them) in this unit, as
Spark does; the readers relabel them as UTC instants (:mod:`spark_io._direct`)."""


@dataclass(frozen=True)
class ParquetFiles:
    """A snapshot as the Parquet files it scans: local paths, in order, and what to read.

    ``columns`` are the snapshot's columns (the side's, and ``_weight`` if it has one);
    ``rows`` is the total from the files' footers.  Pickled into tasks, which read the
    files with pyarrow (:mod:`spark_io._direct`).
    """

    paths: tuple[str, ...]
    columns: tuple[str, ...]
    rows: int


def _plan(df: DataFrame, optimized: bool = True) -> Any | None:
    """The JVM logical plan of ``df``, or None (Spark Connect, no JVM).

    The optimized plan proves emptiness and estimates sizes; the analyzed one (already
    computed when the DataFrame was made, so free) says what is read and how.
    """
    try:
        qe = df._jdf.queryExecution()  # noqa: SLF001 (the Py4J handle of the plan)
        return qe.optimizedPlan() if optimized else qe.analyzed()
    except Exception:  # no JVM plan: every question gets the safe answer
        return None


def _name(node: Any) -> str:
    return str(node.getClass().getSimpleName())


def _children(node: Any) -> list[Any]:
    seq = node.children()
    return [seq.apply(i) for i in range(seq.size())]


def known_empty(df: DataFrame) -> bool:
    """Whether ``df`` is empty by its plan alone.

    Under projections and filters: an empty ``LocalRelation`` (what the optimizer makes
    of a plan it proves empty), or an RDD with no partitions (a ``foreachBatch``
    micro-batch is an RDD; one of a source that had no data has no partitions).
    """
    node = _plan(df)
    try:
        while node is not None and _name(node) in ("Project", "Filter", "SubqueryAlias"):
            node = _children(node)[0]
        if node is None:
            return False
        if _name(node) == "LocalRelation":
            return bool(node.data().isEmpty())
        return _name(node) == "LogicalRDD" and int(node.rdd().getNumPartitions()) == 0
    except Exception:  # a plan shape this Spark does not have
        return False


def cheap_to_probe(df: DataFrame) -> bool:
    """Whether collecting ``df.limit(n)`` costs little next to a full pass over ``df``.

    True for plans without a shuffle (scans, projections, filters, unions), and for any
    plan the optimizer estimates at most :data:`PROBE_MAX_BYTES`.
    """
    plan = _plan(df)
    if plan is None:
        return False
    todo = [plan]
    narrow = True
    while todo and narrow:
        node = todo.pop()
        narrow = _name(node) in _NARROW
        todo.extend(_children(node))
    if narrow:
        return True
    try:
        return int(plan.stats().sizeInBytes()) <= PROBE_MAX_BYTES
    except Exception:  # no estimate
        return False


def _local_path(uri: str) -> str | None:
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("file", "") or parsed.netloc not in ("", "localhost"):
        return None
    return urllib.request.url2pathname(urllib.parse.unquote(parsed.path))


def _relation(plan: Any) -> tuple[Any | None, str]:
    """The ``HadoopFsRelation`` under projections of plain columns, or why there is none."""
    node = plan
    while _name(node) in ("Project", "SubqueryAlias"):
        if _name(node) == "Project":
            items = node.projectList()
            if any(_name(items.apply(i)) != "AttributeReference" for i in range(items.size())):
                return None, "it computes a column (not a plain selection of columns)"
        node = _children(node)[0]
    if _name(node) != "LogicalRelation":
        return None, f"its plan is a {_name(node)}, not a file scan"
    rel = node.relation()
    if _name(rel) != "HadoopFsRelation":
        return None, f"it reads a {_name(rel)}, not files"
    fmt = str(rel.fileFormat().getClass().getName())
    if fmt != _PARQUET:
        return None, f"its files are read by {fmt}, not Spark's plain Parquet reader"
    index = str(rel.location().getClass().getName())
    if index != _PLAIN_INDEX:
        return None, f"its files are listed by {index} (a table format), not from paths"
    if rel.partitionSchema().length():
        return None, "it has partition columns (values that live in directory names)"
    keys = {str(k).lower() for k in str(rel.options().keys().mkString("\u0001")).split("\u0001")
            if k}
    odd = sorted(keys - _SAFE_OPTIONS)
    if odd:
        return None, f"it is read with options {odd} that may change values"
    return rel, ""


def _conforms(file_type: pa.DataType, want: pa.DataType, int96: bool) -> bool:
    """Whether pyarrow's ``file_type`` holds exactly the values Spark delivers as ``want``.

    ``int96``: the column is stored as Parquet INT96, which Spark reads as UTC instants
    and pyarrow (told to, see :data:`INT96_UNIT`) as microseconds without a time zone.
    """
    if file_type.equals(want):
        return True
    if pa.types.is_timestamp(file_type) and pa.types.is_timestamp(want):
        # Milliseconds widen exactly to microseconds; a time-zone label changes no value.
        same_kind = (file_type.tz is None) == (want.tz is None) or (
            int96 and file_type.tz is None and want.tz is not None)
        return file_type.unit in ("ms", "us") and want.unit == "us" and same_kind
    pairs = ((pa.types.is_string, pa.types.is_large_string),
             (pa.types.is_binary, pa.types.is_large_binary))
    for a, b in pairs:
        if (a(file_type) or b(file_type)) and (a(want) or b(want)):
            return True
    return (pa.types.is_signed_integer(file_type) and pa.types.is_signed_integer(want)
            and file_type.bit_width <= want.bit_width)


def _file_problem(path: str, want: pa.Schema, dated: bool, int96_ok: bool
                  ) -> tuple[int, str]:
    """(rows, "") for a file pyarrow reads as Spark would, else (0, why not)."""
    try:
        pf = pq.ParquetFile(path, coerce_int96_timestamp_unit=INT96_UNIT)
    except (OSError, pa.ArrowException) as exc:
        return 0, f"pyarrow cannot open {path}: {exc}"
    with pf:
        have = pf.schema_arrow
        physical = {pf.schema.column(i).path: pf.schema.column(i).physical_type
                    for i in range(len(pf.schema))}
        for field in want:
            i = have.get_field_index(field.name)
            if i < 0:
                return 0, f"{path} has no column {field.name!r} (exactly so named)"
            int96 = physical.get(field.name) == "INT96"
            if int96 and not int96_ok:
                return 0, (f"column {field.name!r} of {path} is an INT96 timestamp and "
                           "spark.sql.parquet.int96TimestampConversion shifts it")
            if not _conforms(have.field(i).type, field.type, int96):
                return 0, (f"column {field.name!r} of {path} reads as {have.field(i).type} "
                           f"in pyarrow, as {field.type} in Spark")
        meta = pf.metadata.metadata or {}
        if dated and (any(k in meta for k in _LEGACY_KEYS)
                      or meta.get(b"org.apache.spark.version", b"3").startswith((b"1.", b"2."))):
            return 0, f"{path} was written with Spark's legacy calendar (dates are rebased)"
        return int(pf.metadata.num_rows), ""


def parquet_files(df: DataFrame, columns: Sequence[str], label: str
                  ) -> tuple[ParquetFiles | None, str]:
    """``df.select(*columns)`` as the files it scans, if pyarrow reads them as Spark would.

    That is: the analyzed plan is at most a selection of plain columns over Spark's
    own Parquet reader of listed paths (no filter, no computed column, no partition
    columns, no table format), every file is on a local or shared file system (a
    ``file:`` URI), and in every file each column exists under its exact name with a
    type pyarrow reads as the same values (equal types; a timestamp with another
    time-zone label, in milliseconds, or stored as INT96; a narrower signed integer;
    string and large string), not written with Spark's legacy calendar.  Reads only
    footers.  Returns the files, or None and the reason (for the log and for
    ``read="files"`` errors); ``label`` names the side.
    """
    plan = _plan(df, optimized=False)
    if plan is None:
        return None, f"{label}: no JVM plan to inspect (Spark Connect?)"
    try:
        rel, why = _relation(plan)
    except Exception as exc:  # a plan shape this Spark does not have
        return None, f"{label}: its plan could not be inspected ({exc})"
    if rel is None:
        return None, f"{label}: {why}"
    fields = {f.name: f for f in df.schema.fields}
    missing = [c for c in columns if c not in fields]
    if missing:
        return None, f"{label}: it has no column {missing[0]!r}"
    try:
        want = arrow_schema(T.StructType([fields[c] for c in columns]))
    except SchemaMismatchError as exc:
        return None, f"{label}: {exc}"
    paths: list[str] = []
    for uri in sorted(str(u) for u in rel.location().inputFiles()):
        path = _local_path(uri)
        if path is None:
            return None, f"{label}: {uri} is not on a local or shared file system"
        paths.append(path)
    dated = any(pa.types.is_date(f.type) or pa.types.is_timestamp(f.type) for f in want)
    int96_ok = str(df.sparkSession.conf.get(
        "spark.sql.parquet.int96TimestampConversion", "false")).lower() != "true"
    rows = 0
    for path in paths:
        n, why = _file_problem(path, want, dated, int96_ok)
        if why:
            return None, f"{label}: {why}"
        rows += n
    return ParquetFiles(paths=tuple(paths), columns=tuple(want.names), rows=rows), ""


def count_rows(frames: Mapping[str, DataFrame]) -> dict[str, int]:
    """Row counts of ``frames`` in one Spark job (a tagged union, counted per tag)."""
    names: Sequence[str] = list(frames)
    if not names:
        return {}
    if len(names) == 1:
        return {names[0]: frames[names[0]].count()}
    tag = "__joinstate_side"
    tagged = [frames[n].select(F.lit(i).alias(tag)) for i, n in enumerate(names)]
    union = tagged[0]
    for t in tagged[1:]:
        union = union.unionAll(t)
    row = union.agg(*[F.count(F.when(F.col(tag) == i, 1)).alias(f"n{i}")
                      for i in range(len(names))]).collect()[0]
    return {n: int(row[f"n{i}"]) for i, n in enumerate(names)}
