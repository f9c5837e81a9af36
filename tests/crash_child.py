"""Child process of ``tests/test_crash.py``: populate a join, kill -9 itself at a chosen point.

Usage: ``python tests/crash_child.py '<json>'`` with keys ``path``, ``strategy``,
``order``, ``how``, ``customers``, ``sales``, ``deletes``, ``batch_rows``,
``bulk_run_rows``, ``out`` (directory for delivered outputs) and ``kill``: ``[point,
n]``.  Every output delta the sink receives is written to ``out`` as
``<side>-<index>.arrow`` *before* the sink returns, so the parent knows exactly what was
delivered before the crash.  The kill is a SIGKILL of this process at the ``n``-th
(1-based) arrival at ``point``; the points are wrappers installed here only (monkey
patches of this process, nothing in the library):

* ``sink`` / ``sink-before``: in the output sink, after / before the delivery is recorded
  (``sink:<side>:<index>`` / ``sink-before:<side>:<index>``: for that batch's output);
* ``commit`` / ``commit-before``: after / before a ``Transaction.commit`` (every batch,
  done marker, phase and marker clearing goes through one);
* ``ingest`` / ``ingest-after``: entering / leaving ``SstIngester.ingest`` (SST files
  written, sorted, then handed to ``ingest_durably``);
* ``durable``: entering ``StateStore.ingest_durably`` (SST files staged, nothing durable);
* ``intent``: after the intent record is durable, before any family ingests;
* ``cf-ingest``: after one family's files were ingested (before the records);
* ``go-live``: entering ``Join.go_live`` (the one write that sets the phase and clears
  the progress markers).

The child exits 0 if the point was never reached ``n`` times (the parent fails then),
printing how often each point was reached as JSON (a run with ``["none", 0]`` is the
uninterrupted reference and the menu of kill points).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

import joinstate
import joinstate.intents
import population
from population import synthetic as syn
from population.bulk import SstIngester

JOIN = "cs"


def data(customers: int, sales: int, deletes: int) -> tuple[pa.Table, pa.Table]:
    """The two inputs (seeded): customers x sales, then ``deletes`` customers retracted."""
    left = syn.customers(customers, seed=3)
    right = syn.sales(sales, customers, seed=4)
    if deletes:
        w = pa.array([1] * customers + [-1] * deletes, pa.int64())
        left = pa.concat_tables([left, left.slice(0, deletes)]).append_column("_weight", w)
    return left, right


def sides() -> tuple[joinstate.Side, joinstate.Side]:
    return (joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                           unique_key=["c_customer_sk"]),
            joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"]))


def strategy(name: str, bulk_run_rows: int) -> Any:
    if name == "bulk":
        return population.Strategy.bulk_load().replace(bulk_run_rows=bulk_run_rows)
    return name


class Killer:
    """Counts arrivals at the chosen point; SIGKILLs this process at the n-th."""

    def __init__(self, point: str, n: int) -> None:
        self.point, self.n = point, n
        self.seen: dict[str, int] = {}

    def at(self, point: str) -> None:
        self.seen[point] = self.seen.get(point, 0) + 1
        if point == self.point and self.seen[point] == self.n:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(self, owner: Any, name: str, before: str | None, after: str | None) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            if before:
                self.at(before)
            result = inner(*args, **kw)
            if after:
                self.at(after)
            return result

        setattr(owner, name, wrapper)


def main(spec: dict[str, Any]) -> int:
    killer = Killer(*spec["kill"])
    killer.wrap(joinstate.Transaction, "commit", "commit-before", "commit")
    killer.wrap(SstIngester, "ingest", "ingest", "ingest-after")
    killer.wrap(joinstate.StateStore, "ingest_durably", "durable", None)
    killer.wrap(joinstate.intents, "_complete_ingest", "intent", None)
    killer.wrap(joinstate.StateStore, "ingest", None, "cf-ingest")
    killer.wrap(joinstate.Join, "go_live", "go-live", None)
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)

    def sink(table: pa.Table, batch: population.OutputBatch) -> None:
        killer.at("sink-before")
        killer.at(f"sink-before:{batch.side}:{batch.index}")
        with pa.OSFile(str(out / f"{batch.side}-{batch.index:06d}.arrow"), "wb") as f, \
                pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        killer.at("sink")
        killer.at(f"sink:{batch.side}:{batch.index}")

    left, right = data(spec["customers"], spec["sales"], spec["deletes"])
    with joinstate.StateStore(spec["path"]) as store:
        ls, rs = sides()
        join = store.join(JOIN, left=ls, right=rs, how=spec["how"])
        population.populate(
            join, left, right, strategy=strategy(spec["strategy"], spec["bulk_run_rows"]),
            order=spec["order"], sink=sink, progress=False, batch_rows=spec["batch_rows"],
        )
    print(json.dumps(killer.seen))  # how often each point was reached (the parent's menu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
