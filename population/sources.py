"""Population inputs: tables, record batches, readers, Parquet files, or any iterable of them.

A source knows its row count when the input says so (a table, a list of batches, a
Parquet footer) and whether it is a *whole snapshot* (all rows available up front, which
is what makes sorted bulk loading attractive).  When neither side's size is known, the
driver finds the small side by counting: it reads both sources in lockstep, buffering,
until one runs out; the buffers hold at most about twice the small side.

A read that fails (a damaged Parquet page, a truncated file, an I/O error) raises
:class:`~population.PopulationError` naming the side, and for Parquet the file and the
row group that cannot be decoded: Arrow's own message ("Corrupt snappy compressed data")
names neither.  :func:`parquet_batches` and :func:`parquet_rows` read a
``pyarrow.dataset`` of Parquet files the same way, for callers that hold one (the
``joinstate populate`` command).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from planner.rules.small_side import small_side_of
from population.errors import PopulationError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow.dataset as pads

    from joinstate import SideName

__all__ = ["Source", "count_small", "parquet_batches", "parquet_rows"]

DEFAULT_BATCH_ROWS = 65_536


class Source:
    """One side's input as a stream of non-empty record batches (or tables).

    ``rows`` is the total if known up front, ``snapshot`` whether every row was available
    at the start.  :meth:`next` returns ``None`` once the source is exhausted.
    """

    def __init__(self, side: str, data: Any, batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        if batch_rows < 1:
            raise PopulationError(f"batch_rows={batch_rows} must be >= 1")
        self.side = side
        self.rows: int | None = None
        self.snapshot = False
        self.buffer: deque[pa.RecordBatch | pa.Table] = deque()
        self.exhausted = False
        self.rows_read = 0
        self._it: Iterator[Any]
        if isinstance(data, pa.Table):
            self.rows, self.snapshot = data.num_rows, True
            self._it = iter(data.to_batches(max_chunksize=batch_rows))
        elif isinstance(data, pa.RecordBatch):
            self.rows, self.snapshot = data.num_rows, True
            self._it = iter(pa.Table.from_batches([data]).to_batches(max_chunksize=batch_rows))
        elif isinstance(data, pa.RecordBatchReader):
            self._it = iter(data)
        elif isinstance(data, str | Path):
            import pyarrow.parquet as pq

            try:
                pf = pq.ParquetFile(str(data))
            except (OSError, pa.ArrowException) as exc:
                raise PopulationError(
                    f"{side}: cannot read Parquet file {str(data)!r}: {exc}"
                ) from exc
            self.rows, self.snapshot = pf.metadata.num_rows, True
            self._it = _named(pf.iter_batches(batch_size=batch_rows), side, str(data))
        elif isinstance(data, list | tuple):
            self._check_items(data)
            self.rows, self.snapshot = sum(b.num_rows for b in data), True
            self._it = iter(data)
        elif isinstance(data, Iterable):
            self._it = iter(data)
        else:
            raise PopulationError(
                f"{side}= must be a pyarrow Table, RecordBatch, RecordBatchReader, a Parquet "
                f"path, or an iterable of record batches; got {type(data).__name__}"
            )

    def _check_items(self, items: Iterable[Any]) -> None:
        for b in items:
            if not isinstance(b, pa.RecordBatch | pa.Table):
                raise PopulationError(
                    f"{self.side}: batches must be pyarrow RecordBatch or Table, got "
                    f"{type(b).__name__}"
                )

    def _pull(self) -> pa.RecordBatch | pa.Table | None:
        while True:
            try:
                b = next(self._it)
            except StopIteration:
                self.exhausted = True
                return None
            except (OSError, pa.ArrowException) as exc:
                raise PopulationError(
                    f"{self.side}: reading the input failed after {self.rows_read:,} rows: "
                    f"{exc}"
                ) from exc
            if not isinstance(b, pa.RecordBatch | pa.Table):
                raise PopulationError(
                    f"{self.side}: batches must be pyarrow RecordBatch or Table, got "
                    f"{type(b).__name__}"
                )
            if b.num_rows:
                self.rows_read += b.num_rows
                return b

    def next(self) -> pa.RecordBatch | pa.Table | None:
        """Return the next non-empty batch, or None when the source is exhausted."""
        if self.buffer:
            return self.buffer.popleft()
        if self.exhausted:
            return None
        return self._pull()

    def prefetch(self) -> bool:
        """Read one more batch into the buffer; False if the source is exhausted."""
        if self.exhausted:
            return False
        b = self._pull()
        if b is None:
            return False
        self.buffer.append(b)
        return True


def count_small(sources: Mapping[str, Source]) -> tuple[SideName, dict[str, int | None]]:
    """Find the small side by reading both sources in lockstep until one runs out.

    Always advances the side that has read fewer rows, so the first side to run out is
    the smaller one and the other has buffered at most about as many rows.  Returns the
    small side and the sizes (exact for the small side, a lower bound dropped to None
    for the other unless it also ran out).
    """
    left, right = sources["left"], sources["right"]
    while True:
        if left.exhausted or right.exhausted:
            break
        s = left if left.rows_read <= right.rows_read else right
        s.prefetch()
    small: SideName
    if left.exhausted and right.exhausted:
        small = small_side_of({"left": left.rows_read, "right": right.rows_read})
    else:
        small = "left" if left.exhausted else "right"
    sizes: dict[str, int | None] = {
        name: (src.rows_read if src.exhausted else None) for name, src in sources.items()
    }
    return small, sizes


# ---- Parquet, with the file and row group named when a read fails ---------------------


def parquet_batches(dataset: pads.Dataset, batch_rows: int, what: str
                    ) -> Iterator[pa.RecordBatch]:
    """Every non-empty batch of a Parquet ``dataset``, file by file, in the dataset's order.

    The batches are those ``dataset.to_batches(batch_size=batch_rows)`` gives (at most
    ``batch_rows`` rows, never across a row group; hive partition columns included), so
    a population interrupted while reading one way resumes reading the other.  A read
    that fails raises :class:`PopulationError` starting with ``what`` and naming the
    file and the row group that cannot be decoded.
    """
    for fragment in dataset.get_fragments():
        delivered = 0
        try:
            for batch in fragment.to_batches(schema=dataset.schema, batch_size=batch_rows):
                delivered += batch.num_rows
                if batch.num_rows:
                    yield batch
        except (OSError, pa.ArrowException) as exc:
            raise PopulationError(_unreadable(what, fragment, dataset.schema, delivered, exc)
                                  ) from exc


def parquet_rows(dataset: pads.Dataset, what: str) -> int:
    """The rows of a Parquet ``dataset`` from its footers; a footer that cannot be read is named."""
    total = 0
    for fragment in dataset.get_fragments():
        try:
            total += fragment.count_rows()
        except (OSError, pa.ArrowException) as exc:
            raise PopulationError(_unreadable(what, fragment, dataset.schema, 0, exc)) from exc
    return total


def _named(batches: Iterator[pa.RecordBatch], side: str, path: str
           ) -> Iterator[pa.RecordBatch]:
    """``batches`` of the Parquet file ``path``; a failed read names the file and row group."""
    delivered = 0
    try:
        for batch in batches:
            delivered += batch.num_rows
            yield batch
    except (OSError, pa.ArrowException) as exc:
        import pyarrow.dataset as ds

        try:
            data = ds.dataset(path, format="parquet")
            fragment: Any = next(iter(data.get_fragments()))
            schema = data.schema
        except (OSError, pa.ArrowException, StopIteration):
            raise PopulationError(f"{side}: cannot read Parquet file {path!r}: {exc}") from exc
        raise PopulationError(_unreadable(side, fragment, schema, delivered, exc)) from exc


def _unreadable(what: str, fragment: Any, schema: pa.Schema, delivered: int,
                exc: BaseException) -> str:
    """The message for a Parquet file of which ``delivered`` rows were read, then ``exc``.

    The row group at fault is found by decoding the file's row groups again, from the one
    holding the first row not delivered, until one fails: Arrow reads ahead, so the
    group being decoded when the error surfaced need not be the next one delivered.
    Only the error path pays for this.
    """
    path = getattr(fragment, "path", "?")
    try:
        groups = fragment.split_by_row_group()
        sizes = [g.row_groups[0].num_rows for g in groups]
    except (OSError, pa.ArrowException):
        where = " (its footer cannot be read)"
    else:
        start, seen = 0, 0
        for i, n in enumerate(sizes):
            if seen + n > delivered:
                start = i
                break
            seen += n
        bad = None
        for i in range(start, len(groups)):
            try:
                groups[i].to_table(schema=schema)
            except (OSError, pa.ArrowException):
                bad = i
                break
        where = (f" (row group {bad} of {len(groups)}, counting from 0)" if bad is not None
                 else f" (after {delivered:,} of its rows)")
    said = " ".join(str(exc).split()).rstrip(".")
    return (f"{what}: cannot read {path}{where}: {said}; the file is damaged or not "
            "Parquet: restore it, or take it out of the input")
