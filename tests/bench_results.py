"""A synthetic results dict of ``joinstate bench tpcds``, shaped as bench.tpcds_cli.run's.

Numbers are chosen by hand (round, distinct) so that tests can state what the report
must show without running a benchmark.
"""

from __future__ import annotations

import copy
from typing import Any

KINDS = ("insert", "delete", "customer", "date")
SHARES = (0.001, 0.01)

FAMILIES = ["ix.q4~store_sales[ss_sold_date_sk]", "ix.q4~store_sales[ss_sold_date_sk].nulls",
            "ix.q4~customer[c_customer_sk]", "ix.q4~customer[c_customer_sk].nulls",
            "agg[q4~agg5]"]


def samples() -> list[dict[str, Any]]:
    """Four samples: start, customer done (100 rows), two pushes of store_sales."""
    def one(t: float, source: str, rows: int, stall: int, l0: int, size: int) -> dict[str, Any]:
        return {"t": t, "source": source, "rows": rows, "stall_micros": stall,
                "l0": {cf: (l0 if cf == FAMILIES[0] else 0) for cf in FAMILIES},
                "pending": {cf: (size // 2 if cf == FAMILIES[0] else 0) for cf in FAMILIES},
                "bytes": {cf: (size if cf.startswith("ix.q4~store") else 1000)
                          for cf in FAMILIES}}
    return [one(0.0, "", 0, 0, 0, 0), one(0.5, "customer", 100, 0, 0, 0),
            one(1.5, "store_sales", 1100, 250_000, 2, 3 << 20),
            one(2.0, "store_sales", 2100, 500_000, 5, 6 << 20)]


def actions() -> list[dict[str, Any]]:
    return [{"t": 0.5, "action": "disable", "cf": FAMILIES[0], "reason": "r", "seconds": 0.0},
            {"t": 0.5, "action": "compact", "cf": FAMILIES[2], "reason": "r", "seconds": 0.1},
            {"t": 1.8, "action": "enable", "cf": FAMILIES[0], "reason": "r", "seconds": 0.0}]


def _size(share: float, scale: float) -> dict[str, Any]:
    kinds: dict[str, dict[str, Any]] = {}
    for i, k in enumerate(KINDS):
        ms = [scale * (i + 1) * 10, scale * (i + 1) * 12, scale * (i + 1) * 11]
        kinds[k] = {"ms": ms, "median_ms": sorted(ms)[1], "first_ms": ms[0],
                    "max_ms": max(ms), "rows": int(share * 100_000) * (i + 1),
                    "pushes": [], "out_rows": [{"year_total": 1, "q4": 0}] * 3}
    batch = [sum(kinds[k]["ms"][r] for k in KINDS) for r in range(3)]
    return {"share": share, "kinds": kinds,
            "batch": {"ms": batch, "median_ms": sorted(batch)[1], "first_ms": batch[0],
                      "max_ms": max(batch)},
            "sales_rows": {}, "customers": 1}


def _pass(name: str, scale: float, families: int, ok: bool = True) -> dict[str, Any]:
    checks = [{"after": "population", "ok": True, "year_total": {"ok": True},
               "q4": {"ok": True}, "top100_ok": True}]
    checks.append({"after": "0.01 #1 customer", "ok": ok, "year_total": {"ok": ok},
                   "q4": {"ok": True}, "top100_ok": True})
    return {"name": name, "share_indexes": name == "shared", "population": {"s": 2.5 * scale},
            "column_families": [f"cf{i}" for i in range(families)],
            "index_bytes": {"shared inputs": int(10 * scale) << 20},
            "state_bytes_after_population": int(30 * scale) << 20,
            "state_bytes_closed": int(25 * scale) << 20,
            "sizes": [_size(s, scale * (1 + j)) for j, s in enumerate(SHARES)],
            "checks": checks, "ok": ok, "output_deltas": 10}


RECORDED = {"what": "q4 change batches and recomputes", "machine": "the test machine",
            "runs": [
                {"sf": 1, "share": 0.0001, "rows": 1000, "incremental_ms": 100,
                 "duckdb_ms": 300, "spark_sql_ms": 7000, "date": "2026-01-01",
                 "commit": "aaa1111", "note": "quiet"},
                {"sf": 10, "share": 0.0001, "rows": 10000, "incremental_ms": 500,
                 "duckdb_ms": 3000, "spark_sql_ms": 50000, "date": "2026-01-02",
                 "commit": "bbb2222", "note": "quiet"}]}
"""Recorded runs: at SF10 a 10,000-row change took 500 ms against DuckDB's 3,000 (6x)."""


def synthetic_results(*, spark: bool = True, unshared: bool = True, failed: bool = False,
                      with_samples: bool = True, recorded: bool = True) -> dict[str, Any]:
    """The results dict; ``failed`` makes one check of the shared pass differ.

    Two rounds of population: symmetric ran 4.0 and 5.0 s, auto (picking asymmetric)
    2.0 and 2.5 s; the entries are each strategy's fastest run.
    """
    pops = []
    for requested, strategy, runs in (("symmetric", "symmetric", [5.0, 4.0]),
                                      ("auto", "auto->asymmetric", [2.0, 2.5])):
        s = min(runs)
        pops.append({"requested": requested, "strategy": strategy, "s": s,
                     "runs_s": runs, "picked": [strategy],
                     "rows_per_s": 2100 / s, "actions": 3,
                     "peak_rss_bytes": 100 << 20, "state_bytes": 20 << 20,
                     **({"samples": samples(), "compaction_actions": actions()}
                        if with_samples else {})})
    passes = [_pass("shared", 1.0, 23, ok=not failed)]
    if unshared:
        passes.append(_pass("unshared", 2.0, 41))
    q4 = {"suite": "q4", "sf": 0.01, "sizes": list(SHARES), "repeat": 3, "seed": 0,
          "started": "2026-01-01T00:00:00Z", "git": {"head": "abc123 test", "dirty": []},
          "load_average_start": [0.5, 0.5, 0.5],
          "rows": {"customer": 100, "store_sales": 2000},
          "population_strategies": pops, "passes": passes,
          "duckdb_recompute": {"answer": {"ms": [20.0, 20.0, 20.0], "median_ms": 20.0},
                               "year_total": {"ms": [15.0], "median_ms": 15.0},
                               "rows": {"year_total": 10, "q4": 1}, "threads": 2},
          "ok": not failed}
    spark_res = None
    if spark:
        spark_res = {"suite": "q4-spark", "sf": 0.01, "shards": 2, "share": 0.001,
                     "steps": [
                         {"step": "population", "seconds": 30.0, "applies": 1, "ok": True,
                          "q4_rows": 0, "year_total_rows": 10},
                         {"step": "qualifying sales (3 customers)", "seconds": 4.0,
                          "applies": 1, "ok": True, "q4_rows": 3, "year_total_rows": 12},
                         {"step": "batch 1: the four kinds at once (1,000 rows)",
                          "seconds": 2.0, "applies": 1, "ok": True, "q4_rows": 3,
                          "year_total_rows": 12},
                         {"step": "batch 2: the four kinds at once (1,000 rows)",
                          "seconds": 1.5, "applies": 1, "ok": True, "q4_rows": 3,
                          "year_total_rows": 12}],
                     "ok": True}
    return copy.deepcopy({
        "suite": "tpcds-q4", "sf": 0.01, "strategies": ["symmetric", "auto"],
        "sizes": list(SHARES), "repeat": 3, "spark_requested": spark,
        "started": "2026-01-01T00:00:00Z", "seconds": 42.0, "q4": q4, "spark": spark_res,
        "ok": not failed, "rounds": 2,
        **({"recorded": RECORDED} if recorded else {}),
    })
