"""The per-operator choice when the indexes an operator reads are held in probe caches.

A pipeline operator's recompute path scans each index it reads, except one held in
memory as a probe cache, which it probes there: over cached indexes both paths read the
same way and cost the same. The planner keeps such an operator incremental and says why,
instead of estimating a scan that would not happen (and booking the run to a path that
did not scan); an operator reading an index that is not cached is still decided by the
estimated costs, and a scan counts only the rows of the indexes not cached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

import joinstate
import population
from joinstate.options import StoreOptions
from planner.batch import decide_operators

if TYPE_CHECKING:
    from pathlib import Path

SALES = pa.schema([("id", pa.int64()), ("cust", pa.int64()), ("amount", pa.int64())])
CUST = pa.schema([("c_id", pa.int64()), ("region", pa.string())])
N = 5_000


def _pipeline(store: joinstate.StateStore) -> joinstate.Pipeline:
    sales = joinstate.source("sales", schema=SALES)
    cust = joinstate.source("cust", schema=CUST, unique_key=["c_id"])
    graph = joinstate.Graph().output("j", sales.join(cust, on=("cust", "c_id")))
    p = joinstate.Pipeline(store, "cached", graph)
    rng = np.random.default_rng(2)
    p.push("cust", pa.table({"c_id": np.arange(N), "region": ["a"] * N}))
    p.push("sales", pa.table({"id": np.arange(N), "cust": rng.integers(0, N, N),
                              "amount": rng.integers(0, 9, N)}))
    # one customer moves: the sales index is probed (with probe="scan": cached)
    p.push("cust", pa.table({"c_id": [N - 1, N - 1], "region": ["a", "b"],
                             "_weight": [-1, 1]}))
    return p


def _half_the_customers_move() -> pa.Table:
    h = N // 2
    ids = np.arange(h)
    return pa.table({"c_id": np.concatenate([ids, ids]), "region": ["a"] * h + ["x"] * h,
                     "_weight": np.concatenate([-np.ones(h, np.int64), np.ones(h, np.int64)])})


def test_operator_over_cached_indexes_stays_incremental(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "db", StoreOptions(probe="scan")) as store:
        p = _pipeline(store)
        (infos,) = p.recompute_candidates("cust").values()
        assert all(i.cached for i in infos)
        (d,) = decide_operators(p, "cust", _half_the_customers_move())
        assert d.choice == "incremental"
        assert "held in memory" in d.reason and d.figures["scanned_rows"] == 0
        rep = population.apply_batch(p, "cust", _half_the_customers_move().slice(0, 2))
        assert "held in memory" in rep.explain()


def test_operator_over_an_index_not_cached_is_decided_by_cost(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "db", StoreOptions(probe="point")) as store:
        p = _pipeline(store)
        (infos,) = p.recompute_candidates("cust").values()
        assert not any(i.cached for i in infos)
        (d,) = decide_operators(p, "cust", _half_the_customers_move())
        assert d.choice == "recompute", d.reason
        assert d.figures["scanned_rows"] == N
