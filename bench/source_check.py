"""``joinstate bench source-check``: what checking a pipeline source's retractions costs.

A source refuses the retraction of a row it does not hold; where no index of the source
holds every column, it keeps a row record for that (:mod:`joinstate._source_rows`).
This measures that record on TPC-DS q4 (:func:`bench.q4.define_q4`), whose three sales
sources keep records (q4 reads six of their eight columns) while customer and date_dim
are checked by their indexes:

* **population**: the whole pipeline populated as ``bench q4`` does it (every source,
  200k rows per push, the planner's strategy), once with every source ``checked`` (the
  default) and once ``unchecked`` (no record: what population cost before sources kept
  one), alternating, ``--rounds`` times each, a fresh store every time.  Reported: the
  median seconds of each, the overhead, the record's cost per pushed sales row, and the
  record's state in bytes per row (the values' bytes, and SST files after a flush).
* **live pushes** on a one-source aggregate pipeline: µs per row of inserting and of
  retracting (the in-memory multiset built), checked against unchecked.

``joinstate bench source-check`` writes ``source_check.json`` and ``source_check.md``
under ``--out`` (``bench-results/`` by default).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import joinstate
import population
from bench import q4

__all__ = ["measure_live", "measure_population", "run_check", "to_markdown"]


def _record_facts(store: joinstate.StateStore) -> dict[str, int]:
    """Rows held, hash entries, value bytes and SST bytes of every row record."""
    cfs = [cf for cf in store.column_families() if cf.startswith("rows[")]
    facts = {"rows": 0, "entries": 0, "value_bytes": 0, "sst_bytes": 0, "values": 0}
    for cf in cfs:
        store.flush(cf)
        facts["rows"] += store.counter(cf, "rows")
        facts["entries"] += store.counter(cf, "entries")
        facts["sst_bytes"] += store.property_int(cf, "rocksdb.total-sst-files-size") or 0
        for _, v in store.cf(cf).items():
            facts["values"] += 1
            facts["value_bytes"] += len(v)
    return facts


def _populate(tables: dict[str, pa.Table], checked: bool, workdir: Path,
              chunk_rows: int) -> dict[str, Any]:
    path = workdir / ("checked" if checked else "unchecked")
    shutil.rmtree(path, ignore_errors=True)
    with joinstate.StateStore(path) as store:
        p = joinstate.Pipeline(store, "q4", q4.define_q4(
            retractions="checked" if checked else "unchecked"))
        t0 = time.perf_counter()
        report = population.populate(p, sources=dict(tables), batch_rows=chunk_rows,
                                     progress=False)
        seconds = time.perf_counter() - t0
        per = {s.name: s.seconds for s in report.sources}
        facts = _record_facts(store)
    shutil.rmtree(path, ignore_errors=True)
    return {"seconds": seconds, "sources": per, "record": facts}


def measure_population(tables: dict[str, pa.Table], rounds: int, workdir: Path,
                       chunk_rows: int = 200_000) -> dict[str, Any]:
    """Checked and unchecked q4 populations, alternating (see the module docstring)."""
    runs: dict[str, list[dict[str, Any]]] = {"checked": [], "unchecked": []}
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for checked in order:
            res = _populate(tables, checked, workdir, chunk_rows)
            runs["checked" if checked else "unchecked"].append(res)
            print(f"round {r + 1}: {'checked' if checked else 'unchecked'} "
                  f"{res['seconds']:.2f} s", flush=True)
    med = {k: statistics.median(x["seconds"] for x in v) for k, v in runs.items()}
    sales = sum(tables[ch.table].num_rows for ch in q4.CHANNELS)
    rec = runs["checked"][0]["record"]
    return {
        "rounds": rounds, "chunk_rows": chunk_rows, "rows": sum(t.num_rows for t in
                                                                 tables.values()),
        "sales_rows": sales, "median_s": med, "runs": runs,
        "overhead": med["checked"] / med["unchecked"] - 1,
        "us_per_sales_row": (med["checked"] - med["unchecked"]) / sales * 1e6,
        "record_value_bytes_per_row": rec["value_bytes"] / max(rec["rows"], 1),
        "record_sst_bytes_per_row": rec["sst_bytes"] / max(rec["rows"], 1),
        "record": rec,
    }


def measure_live(rows: int = 200_000, batch: int = 1000, rounds: int = 3) -> dict[str, Any]:
    """µs per row of live inserts and retractions into a one-source aggregate pipeline."""
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.decimal128(7, 2)),
                        ("d", pa.int64())])
    rng = np.random.default_rng(0)
    cols = [pa.array(rng.integers(0, 1 << 40, rows)), pa.array(rng.integers(0, 500, rows)),
            pa.array(rng.integers(0, 10**5, rows) / 100).cast(pa.decimal128(7, 2)),
            pa.array(np.arange(rows))]
    data = pa.Table.from_arrays(cols, schema=schema)
    out: dict[str, Any] = {}
    for mode in ("checked", "unchecked", "checked", "unchecked")[: 2 * max(1, rounds // 2)]:
        with tempfile.TemporaryDirectory() as d, joinstate.StateStore(Path(d) / "s") as store:
            src = joinstate.source("t", schema, retractions=mode)
            p = joinstate.Pipeline(store, "live", joinstate.Graph().output(
                "o", src.group_by("b").aggregate(s=("sum", "c"), n=("count", None))))
            t0 = time.perf_counter()
            for s in range(0, rows, batch):
                p.push("t", data.slice(s, batch))
            ins = time.perf_counter() - t0
            gone = data.append_column("_weight", pa.array(np.full(rows, -1, np.int64)))
            t0 = time.perf_counter()
            for s in range(0, rows, batch):
                p.push("t", gone.slice(s, batch))
            dels = time.perf_counter() - t0
        res = out.setdefault(mode, {"insert_us_per_row": [], "retract_us_per_row": []})
        res["insert_us_per_row"].append(ins / rows * 1e6)
        res["retract_us_per_row"].append(dels / rows * 1e6)
    for res in out.values():
        for k in list(res):
            res[k] = statistics.median(res[k])
    out["rows"], out["batch"] = rows, batch
    return out


def to_markdown(res: dict[str, Any]) -> str:
    """The report."""
    pop, live = res["population"], res["live"]
    med = pop["median_s"]
    return "\n".join([
        "# Checking pipeline sources' retractions: what it costs", "",
        f"TPC-DS q4 at SF {res['sf']}: {pop['rows']:,} rows populated ({pop['sales_rows']:,} "
        f"sales rows into three row records), {pop['chunk_rows']:,} rows per push, median of "
        f"{pop['rounds']} runs each, alternating.", "",
        "| sources | population s |", "|---|---:|",
        f"| checked (row records) | {med['checked']:.2f} |",
        f"| unchecked (no record) | {med['unchecked']:.2f} |", "",
        f"Overhead {100 * pop['overhead']:+.1f}% ({pop['us_per_sales_row']:.3f} µs per sales "
        f"row); record state {pop['record_value_bytes_per_row']:.2f} bytes per row of values "
        f"({pop['record_sst_bytes_per_row']:.2f} in SST files after a flush).", "",
        f"Live pushes of {live['batch']} rows into an aggregate ({live['rows']:,} rows):", "",
        "| sources | insert µs/row | retract µs/row |", "|---|---:|---:|",
        *(f"| {m} | {live[m]['insert_us_per_row']:.2f} | {live[m]['retract_us_per_row']:.2f} |"
          for m in ("checked", "unchecked")), "",
    ])


def run_check(sf: float = 1.0, rounds: int = 3, chunk_rows: int = 200_000, *,
              skip_live: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    """Measure population checked vs unchecked (and live pushes unless ``skip_live``).

    What ``joinstate bench source-check`` runs; the stores go to ``workdir`` (default: a
    temporary directory, removed after).
    """
    tables = q4.load(sf)
    work = workdir or Path(tempfile.mkdtemp(prefix="source-check-"))
    try:
        res: dict[str, Any] = {"sf": sf,
                               "population": measure_population(tables, rounds, work,
                                                                chunk_rows)}
        res["live"] = measure_live() if not skip_live else {}
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return res
