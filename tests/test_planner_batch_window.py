"""A window's recompute path re-evaluates the touched partitions as the incremental one does.

Both paths sort every partition a change touches and compute its window functions; the
recompute path only reads the partitions by one scan instead of by key.  So its estimate
carries the incremental per-row work plus the scan, and a large batch into a window over
a small index is not sent to a recompute that would cost the same work and a scan more
(measured on TPC-DS q47 at SF1: 803 ms against 500 ms, estimated at 191 ms when the
window's per-row work was costed like a join's).  A join in the same push keeps its own
(cheaper) per-row cost on the recompute path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

import joinstate
from joinstate.options import StoreOptions
from planner.batch import decide_operators
from planner.rules.recompute import OPERATOR_BATCH_US, OPERATOR_WINDOW_BATCH_US

if TYPE_CHECKING:
    from pathlib import Path

SALES = pa.schema([("id", pa.int64()), ("cust", pa.int64()), ("amount", pa.int64())])
CUST = pa.schema([("c_id", pa.int64()), ("region", pa.string())])


def test_window_recompute_costs_the_incremental_work_plus_the_scan(tmp_path: Path) -> None:
    sales = joinstate.source("sales", schema=SALES)
    cust = joinstate.source("cust", schema=CUST, unique_key=["c_id"])
    joined = sales.join(cust, on=("cust", "c_id"))
    ranked = joined.window("region", [("amount", "descending")], rk=("rank",))
    graph = joinstate.Graph().output("ranked", ranked)
    with joinstate.StateStore(tmp_path / "db", StoreOptions(probe="point")) as store:
        p = joinstate.Pipeline(store, "w", graph)
        p.push("cust", pa.table({"c_id": np.arange(50), "region": ["r"] * 50}))
        rng = np.random.default_rng(4)
        p.push("sales", pa.table({"id": np.arange(200), "cust": rng.integers(0, 50, 200),
                                  "amount": rng.integers(0, 99, 200)}))
        n = 5_000  # a batch 25x the window's stored rows
        big = pa.table({"id": np.arange(1000, 1000 + n), "cust": rng.integers(0, 50, n),
                        "amount": rng.integers(0, 99, n)})
        decided = {str(d.figures["operator"]): d for d in decide_operators(p, "sales", big)}
        window = next(d for label, d in decided.items() if label.startswith("window"))
        assert window.figures["recompute_us_per_batch_row"] == OPERATOR_WINDOW_BATCH_US
        assert window.figures["recompute_ms"] > window.figures["incremental_ms"]
        assert window.choice == "incremental", window.reason
        join = next(d for label, d in decided.items() if label.startswith("join"))
        assert join.figures["recompute_us_per_batch_row"] == OPERATOR_BATCH_US
