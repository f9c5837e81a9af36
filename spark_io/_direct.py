"""Direct population: one task per shard reads the snapshot's Parquet files itself.

When both snapshot DataFrames are plain scans of Parquet files
(:func:`spark_io.frames.parquet_files`), :meth:`spark_io.SparkJoin.populate` runs one
Spark job of one task per shard instead of a scan, a Python router, a shuffle, a sort
and a second Python stage per side.  Each task (:class:`DirectPopulateTask`):

1. opens its shard (:meth:`spark_io._worker._ShardTask.open`: one writer, checkpoints);
2. reads every file of each side with pyarrow, only the side's columns, computes each
   row's shard with :meth:`spark_io.routing.ShardRouter.shard_of` (the one routing
   function, so rows land where ``apply`` will send their keys later) and keeps its own
   rows, re-cut into batches of ``batch_rows`` rows;
3. runs the ``population`` driver on both sides, small side first, and goes live;
4. writes one Parquet file per input batch's output, as the shuffle path does.

The rows never pass through the JVM, and the order is the files' order, which is the
same on every attempt: the batches a resumed task skips are the ones the failed attempt
loaded (the population driver checks their digest), so no sort is needed.  The cost is
that every task decodes every file; :data:`spark_io.job.DIRECT_MAX_SHARDS` bounds it.

Task retries and ``populate(resume=True)`` resume as in :mod:`spark_io._worker`: a
shard already live is reported as a replay (its output files are complete), a
half-loaded one drops the output files of the batches its state does not hold and
continues from its progress markers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

import population
from population.sources import DEFAULT_BATCH_ROWS
from spark_io._profile import TaskUsage, task_profile
from spark_io._worker import (
    _BatchFiles,
    _Counted,
    _report,
    _ShardTask,
    _task_attempt,
    interrupted_population,
    reports_errors,
    side_rows,
)
from spark_io.errors import PopulationStateError
from spark_io.frames import INT96_UNIT
from spark_io.outputs import OutputDir
from spark_io.routing import ShardRouter
from spark_io.types import conform_batch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from joinstate import Join, SideName
    from spark_io.frames import ParquetFiles

__all__ = ["DirectPopulateTask", "shard_tables"]

_SIDES: tuple[SideName, SideName] = ("left", "right")


def shard_tables(files: ParquetFiles, router: ShardRouter, shard: int,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.Table]:
    """The rows of ``files`` that belong to ``shard``, in file order, ``batch_rows`` a table.

    Every table but the last holds at least ``batch_rows`` rows; the cut depends only
    on the files, the shard count and ``batch_rows``, so a second reading yields the
    same tables.
    """
    pending: list[pa.Table] = []
    held = 0
    for path in files.paths:
        with pq.ParquetFile(path, coerce_int96_timestamp_unit=INT96_UNIT) as pf:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=list(files.columns)):
                table = conform_batch(_as_instants(batch, router.schema), router.schema)
                if router.shards > 1:
                    mine = router.shard_of(table) == shard
                    if not mine.all():
                        table = table.filter(pa.array(mine))
                if not table.num_rows:
                    continue
                pending.append(table)
                held += table.num_rows
                if held >= batch_rows:
                    yield pa.concat_tables(pending).combine_chunks()
                    pending, held = [], 0
    if held:
        yield pa.concat_tables(pending).combine_chunks()


def _as_instants(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Timestamps in the side's unit and zone (milliseconds, INT96 read without a zone).

    The driver accepted only files whose timestamps convert exactly
    (:func:`spark_io.frames.parquet_files`), so this cast changes no instant.
    """
    for i, field in enumerate(batch.schema):
        j = schema.get_field_index(field.name)
        if j < 0 or not pa.types.is_timestamp(field.type):
            continue
        want = schema.field(j).type
        if pa.types.is_timestamp(want) and (
                field.type.unit != want.unit or (field.type.tz is None) != (want.tz is None)):
            batch = batch.set_column(i, field.name, batch.column(i).cast(want))
    return batch


@dataclass(frozen=True)
class DirectPopulateTask(_ShardTask):
    """Populate whole shards from Parquet files (input: shard numbers, one per partition).

    ``strategy`` is the preset the driver's plan chose; ``small`` the side loaded first;
    ``sizes`` the per-shard row estimates the plan used; ``resume`` continues
    interrupted populations (a retried attempt always does).
    """

    files: dict[str, ParquetFiles] | None = None
    output_dir: str = ""
    strategy: str = "asymmetric"
    small: SideName = "left"
    sizes: dict[str, int] | None = None
    resume: bool = False
    batch_rows: int = DEFAULT_BATCH_ROWS

    @reports_errors
    def __call__(self, shards: Iterator[Any]) -> Iterator[pa.RecordBatch]:
        attempt = _task_attempt()
        resume = self.resume or attempt > 0
        for shard in (int(s) for s in shards):
            t0, usage = time.perf_counter(), TaskUsage()
            detail: dict[str, Any] = {}
            with task_profile("populate-files", shard, attempt), \
                    self.open(shard) as (join, opened):
                if join.phase == "live":
                    # Populated by an earlier attempt or run: its output files are complete.
                    rows_in, rows_out, replayed = 0, 0, True
                else:
                    rows_in, rows_out, detail = self._populate(join, shard, resume)
                    replayed = False
            yield _report(shard, "both", rows_in, rows_out, time.perf_counter() - t0,
                          replayed=replayed,
                          detail={**detail, "read": "files", "checkpoint": opened.report(),
                                  **usage.report()})

    def _populate(self, join: Join, shard: int, resume: bool
                  ) -> tuple[int, int, dict[str, Any]]:
        assert self.files is not None
        first = self._resume_points(join, shard, resume)
        out = _BatchFiles(OutputDir(self.output_dir), shard)
        for side in _SIDES:
            out.remove_from(side, first.get(side, 0))
        inputs = {
            side: _Counted(shard_tables(self.files[side], ShardRouter(self.manifest, side),
                                        shard, self.batch_rows))
            for side in _SIDES
        }
        strategy = population.preset(self.strategy).replace(small_side=self.small)
        report = population.populate(
            join, iter(inputs["left"]), iter(inputs["right"]), strategy=strategy,
            order="small-first", sink=out.write, progress=False, sizes=self.sizes,
            go_live=True, resume=resume, batch_rows=self.batch_rows,
        )
        rows_in = sum(c.rows for c in inputs.values())
        per_side = {s: inputs[s].rows for s in _SIDES}
        return rows_in, out.rows, {"driver": "population", "rows_read": per_side,
                                   **report.to_dict()}

    def _resume_points(self, join: Join, shard: int, resume: bool) -> dict[str, int]:
        """Per side, the first batch whose output this attempt delivers (again)."""
        where = f"shard {shard} of join {join.name!r} in {self.state_dir}"
        found = interrupted_population(join, where, resume)
        if not found and any(side_rows(join, s) for s in _SIDES):
            raise PopulationStateError(
                f"{where}: the shard holds rows but no population ran on it (apply() "
                "before populate()?); population loads empty sides: use a new state_dir "
                "to repopulate"
            )
        return {s: m.batches for s, m in found.items()}
