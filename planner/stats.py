"""Statistics of one source, gathered cheaply: what the planner's rules read.

Row counts and bytes come from what the input already knows (an Arrow table's length
and buffers, a Parquet footer's row groups) without reading data.  Distinct join keys
are estimated from a fixed-size uniform sample (``DEFAULT_SAMPLE_ROWS`` rows, seeded, so
a plan is reproducible) with the Haas-Naughton-Seshadri-Stokes "Duj1" estimator

    D = d / (1 - (1 - q) * f1 / n)

where ``n`` rows were sampled out of ``N`` (``q = n / N``), ``d`` distinct keys were seen
and ``f1`` of them exactly once.  It is exact when the sample is the whole input (q = 1),
gives ``N`` for a key that never repeats in the sample (a unique key), and ``d`` when
every sampled key repeats (a low-cardinality key); estimators that scale ``f1`` by
``sqrt(N/n)`` (GEE) would report ``sqrt(N n)`` distinct values for a unique key.

Key uniqueness is taken from the declaration (``unique_key`` within the key columns:
every key value appears once) or, failing that, observed on the sample (``source``
says which: ``declared``, ``exact``, ``sample`` or ``unknown``).  A sample without a
repeated key does not prove uniqueness; the rules only use it to *advise* declaring one.

The measured costs of earlier runs are in :mod:`planner.history`.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from planner.errors import PlannerError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "DEFAULT_SAMPLE_ROWS",
    "KeyStats",
    "SourceStats",
    "duj1",
    "from_parquet",
    "from_table",
    "gather",
    "given",
    "parquet_sample",
]

DEFAULT_SAMPLE_ROWS = 10_000
"""Rows sampled per source: enough to see a repeat of any key that holds 1 row in 5,000
(a pair of copies is seen with probability ~ n^2 / N^2 per pair, over N/2 pairs), and a
few milliseconds of work on any input."""

MAX_SAMPLED_ROW_GROUPS = 8
"""Parquet row groups read (key columns only) to draw the sample from."""

Origin = Literal["table", "parquet", "given", "counted", "stream", "unknown"]
KeySource = Literal["declared", "exact", "sample", "unknown"]


@dataclass(frozen=True)
class KeyStats:
    """What is known about one key (one or more columns) of a source.

    ``distinct``: distinct non-NULL key values (estimated unless ``source`` is
    ``exact``); ``unique``: every non-NULL key value appears in one row;
    ``null_fraction``: share of rows with a NULL in some key column (they never match).
    """

    columns: tuple[str, ...]
    distinct: int | None = None
    unique: bool | None = None
    source: KeySource = "unknown"
    null_fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"columns": list(self.columns), "distinct": self.distinct,
                "unique": self.unique, "source": self.source,
                "null_fraction": self.null_fraction}


@dataclass(frozen=True)
class SourceStats:
    """Statistics of one source (a join side, a pipeline source).

    ``rows`` is the row count if known (``None``: unknown), ``rows_at_least`` a lower
    bound known otherwise (rows read so far while counting), ``bytes`` the size of the
    data as stored by its origin (Arrow buffers, or Parquet's uncompressed row groups),
    ``snapshot`` whether every row is available up front (a table, files: what makes
    sorted bulk loading possible).  ``sample`` keeps the sampled rows (key columns) for
    rules that evaluate something on them; it is not part of equality or ``to_dict``.
    """

    name: str
    rows: int | None = None
    rows_at_least: int = 0
    bytes: int | None = None
    snapshot: bool = False
    unique_key: tuple[str, ...] | None = None
    keys: tuple[KeyStats, ...] = ()
    sample_rows: int = 0
    origin: Origin = "unknown"
    sample: pa.Table | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if self.rows is not None and (isinstance(self.rows, bool)
                                      or not isinstance(self.rows, int) or self.rows < 0):
            problems.append(f"rows={self.rows!r} must be an int >= 0 or None")
        if not isinstance(self.rows_at_least, int) or self.rows_at_least < 0:
            problems.append(f"rows_at_least={self.rows_at_least!r} must be an int >= 0")
        if self.bytes is not None and (not isinstance(self.bytes, int) or self.bytes < 0):
            problems.append(f"bytes={self.bytes!r} must be an int >= 0 or None")
        if problems:
            raise PlannerError(f"SourceStats {self.name!r}: " + "; ".join(problems))

    @property
    def lower_bound(self) -> int:
        """The least number of rows the source can hold."""
        return self.rows if self.rows is not None else self.rows_at_least

    @property
    def bytes_per_row(self) -> float | None:
        """Bytes per row, if both are known."""
        if self.bytes is None or not self.rows:
            return None
        return self.bytes / self.rows

    def key(self, columns: Sequence[str]) -> KeyStats:
        """What is known about the key ``columns`` (declared uniqueness at least)."""
        cols = tuple(columns)
        for k in self.keys:
            if k.columns == cols:
                return k
        if self.unique_key is not None and set(self.unique_key) <= set(cols):
            return KeyStats(cols, self.rows, True, "declared")
        return KeyStats(cols)

    def replace(self, **changes: Any) -> SourceStats:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (without the sample)."""
        return {"name": self.name, "rows": self.rows, "rows_at_least": self.rows_at_least,
                "bytes": self.bytes, "snapshot": self.snapshot,
                "unique_key": None if self.unique_key is None else list(self.unique_key),
                "keys": [k.to_dict() for k in self.keys], "sample_rows": self.sample_rows,
                "origin": self.origin}


def duj1(frequencies: np.ndarray, total_rows: int) -> int:
    """Distinct values in ``total_rows`` rows from a sample's per-value frequencies.

    ``frequencies`` holds, for each distinct value seen in a uniform sample, how many
    sampled rows had it (the module docstring has the formula).  The result lies in
    ``[d, total_rows]``.

    >>> duj1(np.array([1, 1, 1, 1]), 400)      # nothing repeats: as many values as rows
    400
    >>> duj1(np.array([50, 50]), 10_000)       # two values, each seen often
    2
    >>> duj1(np.array([2, 1, 1]), 4)           # the sample is everything: exact
    3
    """
    f = np.asarray(frequencies, dtype=np.int64)
    n = int(f.sum())
    d = len(f)
    if n == 0 or total_rows <= 0:
        return 0
    n_total = max(total_rows, n)
    q = n / n_total
    f1 = int((f == 1).sum())
    denom = 1.0 - (1.0 - q) * f1 / n
    est = d / denom if denom > 0 else float(n_total)
    return int(min(max(round(est), d), n_total))


def _key_stats(sample: pa.Table, columns: tuple[str, ...], total_rows: int, *,
               exact: bool, unique_key: tuple[str, ...] | None,
               range_bound: int | None = None, clustered: float | None = None) -> KeyStats:
    """Distinct count and uniqueness of ``columns`` from ``sample`` (vectorised)."""
    declared = unique_key is not None and set(unique_key) <= set(columns)
    n = sample.num_rows
    if n == 0:
        return KeyStats(columns, 0 if exact else None, True if declared else None,
                        "declared" if declared else ("exact" if exact else "unknown"),
                        0.0 if exact else None)
    valid = None
    for c in columns:
        v = pc.is_valid(sample.column(c))
        valid = v if valid is None else pc.and_(valid, v)
    keys = sample.select(list(columns))
    assert valid is not None
    n_valid = int(pc.sum(valid).as_py() or 0)
    if n_valid < n:
        keys = keys.filter(valid)
    null_fraction = 1.0 - n_valid / n
    if n_valid == 0:
        freq = np.zeros(0, dtype=np.int64)
    elif len(columns) == 1:
        freq = pc.value_counts(keys.column(0)).field("counts").to_numpy()
    else:
        grouped = keys.group_by(list(columns)).aggregate([([], "count_all")])
        freq = grouped.column("count_all").to_numpy()
    nonnull_total = round(total_rows * (1.0 - null_fraction))
    if exact:
        distinct = len(freq)
    elif clustered is not None:
        # Rows of one key sit together (sorted row groups): distinct keys grow with the
        # rows read, not with a uniform sample's repeats.
        distinct = min(nonnull_total, max(len(freq), round(len(freq) * clustered)))
    else:
        distinct = duj1(freq, nonnull_total)
    if range_bound is not None:
        distinct = min(distinct, range_bound)
    repeats = bool(len(freq) and freq.max() > 1)
    if declared:
        unique: bool | None = True
        source: KeySource = "declared"
    else:
        unique = not repeats
        source = "exact" if exact else "sample"
    return KeyStats(columns, int(distinct), unique, source, round(null_fraction, 6))


def _norm_keys(keys: Iterable[Sequence[str] | str]) -> list[tuple[str, ...]]:
    out = []
    for k in keys:
        cols = (k,) if isinstance(k, str) else tuple(k)
        if not cols:
            msg = "keys=: each key must name at least one column"
            raise PlannerError(msg)
        out.append(cols)
    return out


def _norm_unique(unique_key: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if unique_key is None:
        return None
    return (unique_key,) if isinstance(unique_key, str) else tuple(unique_key)


def _check_columns(name: str, schema: pa.Schema, keys: list[tuple[str, ...]]) -> None:
    for cols in keys:
        missing = [c for c in cols if c not in schema.names]
        if missing:
            raise PlannerError(f"source {name!r}: key column(s) {missing} are not in its "
                               f"columns {schema.names}; pass keys= that name its columns")


def from_table(table: pa.Table | pa.RecordBatch, name: str = "", *,
               keys: Iterable[Sequence[str] | str] = (),
               unique_key: Sequence[str] | str | None = None,
               sample_rows: int = DEFAULT_SAMPLE_ROWS, seed: int = 0) -> SourceStats:
    """Statistics of an in-memory Arrow table (rows and bytes exact, keys sampled).

    >>> t = pa.table({"k": [1, 2, 2, 3], "v": ["a", "b", "c", "d"]})
    >>> s = from_table(t, "t", keys=["k"])
    >>> s.rows, s.key(["k"]).distinct, s.key(["k"]).unique, s.key(["k"]).source
    (4, 3, False, 'exact')
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        msg = f"from_table() takes a pyarrow Table or RecordBatch, got {type(table).__name__}"
        raise PlannerError(msg)
    key_list = _norm_keys(keys)
    _check_columns(name, table.schema, key_list)
    uk = _norm_unique(unique_key)
    n = table.num_rows
    cols = sorted({c for k in key_list for c in k}, key=table.schema.names.index)
    exact = n <= sample_rows
    if exact or not cols:
        sample = table.select(cols) if cols else None
    else:
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(n, size=sample_rows, replace=False))
        sample = table.select(cols).take(pa.array(idx))
    stats = tuple(
        _key_stats(sample, k, n, exact=exact, unique_key=uk)
        for k in key_list if sample is not None
    )
    return SourceStats(name, n, n, table.nbytes, True, uk, stats,
                       sample.num_rows if sample is not None else 0, "table", sample)


def _parquet_files(path: str | Path | Sequence[str | Path]) -> list[str]:
    """The Parquet files of a path (a file or a directory) or a list of paths."""
    import pyarrow.dataset as ds

    paths = [path] if isinstance(path, str | Path) else list(path)
    files: list[str] = []
    for p in paths:
        if Path(p).is_dir():
            try:
                files += sorted(ds.dataset(str(p), format="parquet").files)
            except (OSError, pa.ArrowException) as exc:
                raise PlannerError(f"cannot list Parquet files under {str(p)!r}: {exc}") from exc
        else:
            files.append(str(p))
    if not files:
        raise PlannerError(f"no Parquet files at {path!r}; pass a file, a directory of "
                           "Parquet files, or a list of files")
    return files


def _int_range(stats: list[Any]) -> tuple[int, int] | None:
    """(min, max) over row-group statistics of an integer column, if all have them."""
    lo: int | None = None
    hi: int | None = None
    for s in stats:
        if s is None or not s.has_min_max or not isinstance(s.min, int) \
                or isinstance(s.min, bool):
            return None
        lo = s.min if lo is None else min(lo, s.min)
        hi = s.max if hi is None else max(hi, s.max)
    return None if lo is None or hi is None else (lo, hi)


def from_parquet(path: str | Path | Sequence[str | Path], name: str = "", *,
                 keys: Iterable[Sequence[str] | str] = (),
                 unique_key: Sequence[str] | str | None = None,
                 sample_rows: int = DEFAULT_SAMPLE_ROWS, seed: int = 0) -> SourceStats:
    """Statistics of Parquet data: rows and bytes from the footers, keys from a sample.

    Only footers are read for rows and bytes (``total_byte_size`` of every row group:
    the uncompressed size).  For keys, the key columns of up to
    ``MAX_SAMPLED_ROW_GROUPS`` random row groups are read and ``sample_rows`` rows drawn
    from them.  Integer keys with min/max statistics bound the distinct count by their
    range; if the sampled row groups' key ranges do not overlap (the data is sorted or
    clustered by the key), distinct keys are scaled with the rows read instead of being
    estimated from repeats, which a clustered sample would hide.
    """
    import pyarrow.parquet as pq

    files = _parquet_files(path)
    key_list = _norm_keys(keys)
    uk = _norm_unique(unique_key)
    groups: list[tuple[str, int, int]] = []  # (file, row group, rows)
    total = 0
    nbytes = 0
    col_stats: dict[str, list[Any]] = {}
    schema: pa.Schema | None = None
    for f in files:
        try:
            pf = pq.ParquetFile(f)
        except (OSError, pa.ArrowException) as exc:
            raise PlannerError(f"source {name!r}: cannot read Parquet file {f!r}: {exc}") \
                from exc
        md = pf.metadata
        if schema is None:
            schema = pf.schema_arrow
            _check_columns(name, schema, key_list)
        names = [md.schema.column(i).path for i in range(md.num_columns)]
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            groups.append((f, g, rg.num_rows))
            total += rg.num_rows
            nbytes += rg.total_byte_size
            for k in key_list:
                for c in k:
                    if c in names:
                        col_stats.setdefault(c, []).append(rg.column(names.index(c)).statistics)
    assert schema is not None
    cols = sorted({c for k in key_list for c in k}, key=schema.names.index)
    if not cols:
        return SourceStats(name, total, total, nbytes, True, uk, (), 0, "parquet")
    rng = np.random.default_rng(seed)
    picked, rows_read, sample = _draw(groups, schema, cols, rng, sample_rows)
    exact = rows_read.num_rows == total <= sample_rows
    stats = []
    for k in key_list:
        bound = None
        clustered = None
        if len(k) == 1:
            rngs = col_stats.get(k[0], [])
            whole = _int_range(rngs)
            if whole is not None:
                bound = whole[1] - whole[0] + 1
            picked_ranges = [_int_range([rngs[i]]) for i in picked] if rngs else []
            if (not exact and len(picked) > 1 and all(r is not None for r in picked_ranges)
                    and rows_read.num_rows):
                spans = sorted(r for r in picked_ranges if r is not None)
                if all(a[1] < b[0] for a, b in itertools.pairwise(spans)):
                    clustered = total / rows_read.num_rows
        stats.append(_key_stats(sample, k, total, exact=exact, unique_key=uk,
                                range_bound=bound, clustered=clustered))
    return SourceStats(name, total, total, nbytes, True, uk, tuple(stats), sample.num_rows,
                       "parquet", sample)


def _draw(groups: Sequence[tuple[str, int, int]], schema: pa.Schema, cols: Sequence[str],
          rng: np.random.Generator, sample_rows: int
          ) -> tuple[list[int], pa.Table, pa.Table]:
    """Random row groups (``cols`` of them) and ``sample_rows`` rows drawn from them.

    Returns the picked groups' positions, the rows read and the sample.
    """
    import pyarrow.parquet as pq

    picked: list[int] = []
    read = 0
    for i in rng.permutation(len(groups)):
        if len(picked) >= MAX_SAMPLED_ROW_GROUPS or read >= sample_rows:
            break
        picked.append(int(i))
        read += groups[i][2]
    picked.sort()
    parts = [pq.ParquetFile(groups[i][0]).read_row_group(groups[i][1], columns=list(cols))
             for i in picked]
    rows_read = (pa.concat_tables(parts) if parts
                 else schema.empty_table().select(list(cols)))
    if rows_read.num_rows > sample_rows:
        idx = np.sort(rng.choice(rows_read.num_rows, size=sample_rows, replace=False))
        return picked, rows_read, rows_read.take(pa.array(idx))
    return picked, rows_read, rows_read


def parquet_sample(path: str | Path | Sequence[str | Path], name: str = "", *,
                   sample_rows: int = DEFAULT_SAMPLE_ROWS, seed: int = 0) -> pa.Table:
    """Up to ``sample_rows`` rows of Parquet data, every column, drawn from random row groups.

    What the SQL compiler estimates a filter's selectivity on (give it as the ``sample``
    of a :class:`SourceStats`); reads at most ``MAX_SAMPLED_ROW_GROUPS`` row groups.
    """
    import pyarrow.parquet as pq

    groups: list[tuple[str, int, int]] = []
    schema: pa.Schema | None = None
    for f in _parquet_files(path):
        try:
            pf = pq.ParquetFile(f)
        except (OSError, pa.ArrowException) as exc:
            raise PlannerError(f"source {name!r}: cannot read Parquet file {f!r}: {exc}") \
                from exc
        schema = schema or pf.schema_arrow
        groups += [(f, g, pf.metadata.row_group(g).num_rows)
                   for g in range(pf.metadata.num_row_groups)]
    assert schema is not None
    return _draw(groups, schema, schema.names, np.random.default_rng(seed), sample_rows)[2]


def given(name: str, rows: int | None, *, rows_at_least: int = 0, bytes: int | None = None,
          snapshot: bool = False, unique_key: Sequence[str] | str | None = None,
          origin: Origin = "given") -> SourceStats:
    """Statistics a caller states (row counts from elsewhere, or none: ``rows=None``)."""
    return SourceStats(name, rows, rows if rows is not None else rows_at_least, bytes,
                       snapshot, _norm_unique(unique_key), (), 0, origin)


def gather(data: Any, name: str = "", *, keys: Iterable[Sequence[str] | str] = (),
           unique_key: Sequence[str] | str | None = None,
           sample_rows: int = DEFAULT_SAMPLE_ROWS, seed: int = 0) -> SourceStats:
    """Statistics of any population input, without consuming it.

    A Table or RecordBatch, a Parquet path (file or directory) or a list of them, a list
    of batches; anything else (a reader, an iterator) is a stream whose size is unknown
    until read.
    """
    if isinstance(data, pa.Table | pa.RecordBatch):
        return from_table(data, name, keys=keys, unique_key=unique_key,
                          sample_rows=sample_rows, seed=seed)
    if isinstance(data, str | Path):
        return from_parquet(data, name, keys=keys, unique_key=unique_key,
                            sample_rows=sample_rows, seed=seed)
    if isinstance(data, list | tuple) and data and all(
            isinstance(b, pa.RecordBatch | pa.Table) for b in data):
        tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b
                  for b in data]
        try:
            whole = pa.concat_tables(tables)  # zero-copy: the batches become chunks
        except pa.ArrowInvalid:  # batches of differing schemas: count rows only
            rows = sum(t.num_rows for t in tables)
            return given(name, rows, snapshot=True, unique_key=unique_key, origin="table")
        return from_table(whole, name, keys=keys, unique_key=unique_key,
                          sample_rows=sample_rows, seed=seed)
    if isinstance(data, list | tuple) and data and all(isinstance(b, str | Path) for b in data):
        return from_parquet(list(data), name, keys=keys, unique_key=unique_key,
                            sample_rows=sample_rows, seed=seed)
    if isinstance(data, list | tuple) and not data:
        return SourceStats(name, 0, 0, 0, True, _norm_unique(unique_key), (), 0, "table")
    return SourceStats(name, None, 0, None, False, _norm_unique(unique_key), (), 0, "stream")
