"""Reports of Spark-driven operations: one row per shard and job, combined on the driver.

Every worker task returns one small report row per shard it processed (rows in and
out, seconds, whether a recorded output was replayed, and for population the
per-shard :class:`population.Report` as a dict); the driver collects them with the
job and combines them into a :class:`SparkReport`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import types as T

__all__ = ["REPORT_SCHEMA", "JobReport", "ShardReport", "SparkReport"]

REPORT_SCHEMA = T.StructType([
    T.StructField("shard", T.IntegerType(), False),
    T.StructField("side", T.StringType(), False),
    T.StructField("rows_in", T.LongType(), False),
    T.StructField("rows_out", T.LongType(), False),
    T.StructField("seconds", T.DoubleType(), False),
    T.StructField("replayed", T.BooleanType(), False),
    T.StructField("detail", T.StringType(), False),
])
"""The Spark schema of a worker's report rows (``detail`` is JSON)."""


@dataclass(frozen=True)
class ShardReport:
    """What one task did to one shard in one job."""

    shard: int
    side: str
    rows_in: int
    rows_out: int
    seconds: float
    replayed: bool = False
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Any) -> ShardReport:
        """Build from a collected :data:`REPORT_SCHEMA` row."""
        return cls(
            shard=int(row["shard"]), side=str(row["side"]), rows_in=int(row["rows_in"]),
            rows_out=int(row["rows_out"]), seconds=float(row["seconds"]),
            replayed=bool(row["replayed"]), detail=json.loads(row["detail"]),
        )


@dataclass(frozen=True)
class JobReport:
    """One Spark job (one side's rows routed to the shards), as seen from the driver."""

    side: str
    seconds: float
    shards: tuple[ShardReport, ...]

    @property
    def rows_in(self) -> int:
        """Input rows applied over all shards."""
        return sum(s.rows_in for s in self.shards)

    @property
    def rows_out(self) -> int:
        """Output rows produced over all shards."""
        return sum(s.rows_out for s in self.shards)


@dataclass(frozen=True)
class SparkReport:
    """One ``populate``/``apply``/micro-batch: its jobs in order and every shard's report."""

    join: str
    operation: str
    kind: str
    shards: int
    output_path: str
    seconds: float
    jobs: tuple[JobReport, ...]
    strategy: str | None = None
    small_side: str | None = None

    @property
    def rows_in(self) -> int:
        """Input rows over all jobs and shards."""
        return sum(j.rows_in for j in self.jobs)

    @property
    def rows_out(self) -> int:
        """Output rows over all jobs and shards."""
        return sum(j.rows_out for j in self.jobs)

    @property
    def rows_per_second(self) -> float:
        """Input rows per wall-clock second of the whole operation (driver's clock)."""
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0

    @property
    def replayed_shards(self) -> int:
        """Shards that returned a recorded output instead of applying again."""
        return sum(s.replayed for j in self.jobs for s in j.shards)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict, derived totals included."""
        return {
            "join": self.join, "operation": self.operation, "kind": self.kind,
            "shards": self.shards, "output_path": self.output_path,
            "seconds": round(self.seconds, 4), "strategy": self.strategy,
            "small_side": self.small_side, "rows_in": self.rows_in, "rows_out": self.rows_out,
            "rows_per_second": round(self.rows_per_second, 1),
            "replayed_shards": self.replayed_shards,
            "jobs": [
                {
                    "side": j.side, "seconds": round(j.seconds, 4), "rows_in": j.rows_in,
                    "rows_out": j.rows_out,
                    "shards": [
                        {"shard": s.shard, "rows_in": s.rows_in, "rows_out": s.rows_out,
                         "seconds": round(s.seconds, 4), "replayed": s.replayed,
                         "detail": s.detail}
                        for s in sorted(j.shards, key=lambda s: s.shard)
                    ],
                }
                for j in self.jobs
            ],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Serialise to JSON."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"{self.kind} {self.operation} of join {self.join} over {self.shards} shards: "
            f"{self.rows_in:,} rows in, {self.rows_out:,} rows out, {self.seconds:.2f} s "
            f"({self.rows_per_second:,.0f} rows/s)"
            + (f", strategy {self.strategy}" if self.strategy else "")
            + (f", small side {self.small_side}" if self.small_side else "")
        ]
        for j in self.jobs:
            lines.append(
                f"  {j.side:<5} job {j.seconds:7.2f} s {j.rows_in:>12,} rows in over "
                f"{len(j.shards)} shard(s), {j.rows_out:,} rows out"
            )
        return "\n".join(lines)
