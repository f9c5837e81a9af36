"""The contract suite's Spark path: the real :class:`spark_io.SparkPipeline`, one small case
of each kind (a full outer join with NULL keys and duplicates; a random pipeline).

The load is ``populate`` (one Spark job), every change step one ``apply`` (several
sources in one step: one operation), a reopen step re-attaches a new SparkPipeline to
the state directory; reject steps are not run here (tests/spark covers Spark's refusals).
Outputs are DataFrames over Parquet, read back as rows: the columns are checked by name
(Spark's types are its own), the integrated rows against the same oracle as every other
path (``contract_harness``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from contract_cases import join_cases, pipeline_cases
from contract_harness import run_case
from contract_paths import ExecPath, Outs, delta_of, snapshot_of

import spark_io
from spark_io.types import spark_schema

if TYPE_CHECKING:
    from pathlib import Path

    from contract_cases import Case, Step
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


class SparkRunner:
    """A SparkPipeline (2 shards) over the case's graph, state under ``root``."""

    def __init__(self, spark: SparkSession, case: Case, root: Path) -> None:
        import pipeline_oracle as po

        self.spark = spark
        self.case = case
        self.graph = po.build_graph(case.outputs)
        self.state_dir = root / "state"
        self.sp = self._attach()

    def _attach(self) -> spark_io.SparkPipeline:
        return spark_io.SparkPipeline(self.spark, self.graph, self.state_dir, shards=2,
                                      name="contract")

    def _frame(self, source: str, table: pa.Table) -> DataFrame:
        schema = spark_schema(table.schema)
        return self.spark.createDataFrame([tuple(r.values()) for r in table.to_pylist()],
                                          schema)

    def _outs(self, frames: dict[str, DataFrame]) -> list[Outs]:
        out = {}
        for name, df in frames.items():
            names = [*self.case.outputs[name].schema.names, "_weight"]
            rows = [tuple(r) for r in df.select(*names).collect()]
            cols = list(zip(*rows, strict=True)) if rows else [() for _ in names]
            out[name] = pa.table({n: pa.array(list(c), type=pa.int64() if n == "_weight"
                                              else None)
                                  for n, c in zip(names, cols, strict=True)})
        return [out]

    def load(self, step: Step) -> list[Outs]:
        frames = {s: self._frame(s, t) for s, t in snapshot_of(self.case, step).items()}
        return self._outs(self.sp.populate(frames))

    def apply(self, step: Step) -> list[Outs]:
        frames = {s: self._frame(s, delta_of(self.case, s, e)) for s, e in step.changes.items()}
        return self._outs(self.sp.apply(frames))

    def reopen(self) -> None:
        self.sp = self._attach()

    def state(self) -> dict[str, pa.Table] | None:
        return None

    def close(self) -> None:
        pass


def _path(spark: SparkSession) -> ExecPath:
    def start(case: Case, root: Path) -> Any:
        return SparkRunner(spark, case, root)
    return ExecPath("spark", frozenset({"join", "pipeline"}), start, atomic=False,
                    exact_types=False)


def _short(case: Case, changes: int) -> Case:
    """The case with its first ``changes`` change steps (a Spark job costs seconds)."""
    kept, n = [], 0
    for step in case.steps:
        if step.kind == "change":
            n += 1
            if n > changes:
                break
        kept.append(step)
    case.steps = kept
    return case


@pytest.mark.parametrize("case", [
    # A JVM of its own and ~20 s: the default run checks Spark against DuckDB in
    # tests/spark (TPC-DS queries, the README's view), this case with -m slow.
    pytest.param(next(c for c in join_cases((0,)) if c.id == "no_unique-full-0"),
                 marks=pytest.mark.slow),
    pytest.param(next(c for c in pipeline_cases((3,))), marks=pytest.mark.slow),
], ids=lambda c: c.id)
def test_spark_pipeline_matches_oracle(spark: SparkSession, tmp_path: Path, case: Any) -> None:
    c = _short(case.make(), 4)
    run_case(c, _path(spark), tmp_path)
