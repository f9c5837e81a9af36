"""A small two-table view run stage by stage without Spark, for the store keeper's tests.

``View`` plans ``SQL`` over two shards (orders hashed, customers copied or hashed, as the
planner decides) and runs an operation the way one Spark job does: every stage's
:class:`spark_io.dag.StageTask` per shard, records routed to the next stage by shard,
in this process (or, for a stage task, in the worker that keeps its store).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa

from joinstate.schema import WEIGHT
from planner.distribute import plan_distribution
from planner.sql import Source, define
from planner.stats import given
from spark_io._worker import UndoPlan
from spark_io.dag import ChangeRef, OperationSpec, StageTask
from spark_io.manifest import ShardStorage
from spark_io.operation import change_digest, change_sums
from spark_io.stagerun import REPORT, PlanRef, to_ipc

SQL = """
    SELECT c.region, count(*) AS n, sum(o.amount) AS total
    FROM orders o JOIN customers c ON o.customer_id = c.id
    GROUP BY c.region
"""
ORDERS = pa.schema([pa.field("oid", pa.int64(), False), pa.field("customer_id", pa.int64()),
                    pa.field("amount", pa.int64())])
CUSTOMERS = pa.schema([pa.field("id", pa.int64(), False), pa.field("region", pa.string())])
NAME = "per_region"
OWNER = f"pipeline~{NAME}"


class View:
    """The view's graph, plan and stores under ``root``; operations run stage by stage."""

    def __init__(self, root: Path, shards: int = 2, checkpoint_uri: str | None = None,
                 local_dir: str | None = None) -> None:
        self.root = root
        self.shards = shards
        self.graph, _ = define(SQL, {"orders": Source(ORDERS, "oid"),
                                     "customers": Source(CUSTOMERS, "id")}, name=NAME)
        stats = {"orders": given("orders", 1000, snapshot=True, unique_key=("oid",)),
                 "customers": given("customers", 100, snapshot=True, unique_key=("id",))}
        self.plan = plan_distribution(self.graph, stats, shards=shards, name=NAME)
        self.ref = PlanRef.of(self.plan)
        self.storage = ShardStorage(str(root / "state"), checkpoint_uri, local_dir)
        self.outputs = root / "out"

    def commit(self, reports: list[dict[str, Any]]) -> None:
        """Record the checkpoints ``reports`` name as committed (the driver's manifest)."""
        ids = {r["checkpoint"]["store"]: r["checkpoint"]["id"] for r in reports
               if isinstance(r.get("checkpoint"), dict) and r["checkpoint"].get("id")}
        self.storage = dataclasses.replace(
            self.storage, checkpoints={**self.storage.checkpoints, **ids})

    def task(self, stage: int, spec: OperationSpec, change: ChangeRef,
             delegate: bool = True) -> StageTask:
        return StageTask(self.ref, stage, self.storage, None, spec, change, delegate)

    def run(self, spec: OperationSpec, change: ChangeRef, delegate: bool = True
            ) -> list[dict[str, Any]]:
        """Every stage on every shard, in order; the tasks' reports.

        ``delegate=False``: every task runs here (taking its store over if need be).
        """
        records: dict[int, list[Any]] = {s: [(s, ("seed",))] for s in range(self.shards)}
        reports: list[dict[str, Any]] = []
        for k in range(len(self.plan.stages)):
            nxt: dict[int, list[Any]] = {s: [] for s in range(self.shards)}
            for shard in range(self.shards):
                task = self.task(k, spec, change, delegate)
                for dest, payload in task(shard, records[shard]):
                    if payload[0] == REPORT:
                        reports.append(payload[1])
                    else:
                        nxt[dest].append((dest, payload))
            records = nxt
        return reports

    def populate(self, orders: pa.Table, customers: pa.Table) -> list[dict[str, Any]]:
        tables = {"orders": _weighted(orders), "customers": _weighted(customers)}
        spec = OperationSpec(NAME, "populate-0", "populate", str(self.outputs / "populate-0"),
                             owes=True)
        return self.run(spec, ChangeRef(tables={s: to_ipc(t) for s, t in tables.items()},
                                        rows={s: t.num_rows for s, t in tables.items()}))

    def spec(self, op: str, source: str, delta: pa.Table,
             rollback: tuple[str, ...] = ()) -> tuple[OperationSpec, ChangeRef]:
        """An apply of ``delta`` (with ``_weight``) to ``source`` as operation ``op``."""
        schema = self.graph.source_schema(source)
        digest, _ = change_digest(source, [change_sums(schema, [delta], source)])
        undo = UndoPlan(OWNER, op, bytes.fromhex(digest), rollback)
        spec = OperationSpec(NAME, op, "apply", str(self.outputs / op),
                             commit_base=f"spark-apply:{op}", undo=undo)
        return spec, ChangeRef(tables={source: to_ipc(delta)}, rows={source: delta.num_rows})

    def apply(self, op: str, source: str, delta: pa.Table,
              rollback: tuple[str, ...] = (), delegate: bool = True) -> list[dict[str, Any]]:
        return self.run(*self.spec(op, source, delta, rollback), delegate=delegate)

    def answer(self) -> dict[tuple[Any, ...], int]:
        """The view's answer: every operation's output changes, integrated."""
        import pyarrow.parquet as pq

        total: dict[tuple[Any, ...], int] = {}
        for f in sorted(self.outputs.glob(f"*/{NAME}/*.parquet")):
            for row in pq.read_table(f).to_pylist():
                w = row.pop(WEIGHT)
                key = tuple(row.values())
                total[key] = total.get(key, 0) + w
        return {k: w for k, w in total.items() if w}

    def store_paths(self) -> list[Path]:
        """Every (stage, shard) store directory that exists."""
        base = Path(self.storage.local_path("x")).parent if self.storage.local_dir \
            else self.root / "state"
        return sorted(p for p in base.glob("stage*/shard-*") if p.is_dir())


def expected(orders_rows: pa.Table, customers_rows: pa.Table) -> dict[tuple[Any, ...], int]:
    """The view's answer over ``orders_rows`` and ``customers_rows`` (no ``_weight``)."""
    region = dict(zip(customers_rows.column("id").to_pylist(),
                      customers_rows.column("region").to_pylist(), strict=True))
    groups: dict[str, list[int]] = {}
    for cid, amount in zip(orders_rows.column("customer_id").to_pylist(),
                           orders_rows.column("amount").to_pylist(), strict=True):
        if cid in region:
            groups.setdefault(region[cid], []).append(amount)
    return {(r, len(a), sum(a)): 1 for r, a in groups.items()}


def _weighted(table: pa.Table, w: int = 1) -> pa.Table:
    return table.append_column(pa.field(WEIGHT, pa.int64(), False),
                               pa.array([w] * table.num_rows, pa.int64()))


def orders(first: int, n: int, w: int = 1, customers: int = 10) -> pa.Table:
    """Orders ``first`` .. ``first + n - 1`` with ``_weight`` ``w``."""
    ids = list(range(first, first + n))
    return _weighted(pa.table({"oid": ids, "customer_id": [i % customers for i in ids],
                               "amount": [10 * i for i in ids]}, ORDERS), w)


def customers(n: int = 10) -> pa.Table:
    return pa.table({"id": list(range(n)), "region": [f"r{i % 3}" for i in range(n)]},
                    CUSTOMERS)


def source_orders(first: int, n: int) -> pa.Table:
    return orders(first, n).drop_columns([WEIGHT])
