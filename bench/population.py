"""``python -m bench population``: population strategies x orders, and the memtable question.

Data sets (synthetic, seeded; ``population/synthetic.py``):

1. ``--set 1``: 100k customers (unique key) vs 3M store_sales rows;
2. ``--set 2``: 1M vs 30M (override with ``--small/--large``): compaction only matters
   once the state is much larger than the memtables;
3. ``--set 3``: hash skip list vs skip list vs vector memtable for the small side: write
   rate through the join, point-lookup rates while the side is still in the memtable,
   and big-side push rate when the small side is probed from RocksDB (probe cache off).

Every strategy runs in the same process on the same data, each in a fresh directory;
speedups are over ``symmetric`` with the same order, measured in the same run.  After
``populate`` returns, the benchmark also waits for RocksDB's background compactions to
finish (``settle``), because deferring compaction is not the same as avoiding it.
When ``auto`` runs, each data set also gets a table of ``auto`` (the planner) against
the fixed strategies per order, with what it picked and why, and the plan it ran
(``plan.explain()``).  Results: ``bench-results/population-<stamp>.json`` and ``.md``.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import random
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import rocksdict as rd

import joinstate
import population
from joinstate.activity import counter_delta, statistics_counters
from population import synthetic as syn

if TYPE_CHECKING:
    from collections.abc import Sequence

MIB = 1 << 20
STRATEGIES = ("symmetric", "asymmetric", "bulk", "auto")
MEMTABLES: tuple[joinstate.Memtable, ...] = ("skiplist", "hash_skip_list", "vector")
SETS = {1: (100_000, 3_000_000), 2: (1_000_000, 30_000_000)}


BIG_UNIQUE_KEY = ["ss_ticket_number", "ss_item_sk"]
"""store_sales' primary key, as TPC-DS users declare it (``--big-unique``)."""


def _sides(big_unique: bool = False) -> tuple[joinstate.Side, joinstate.Side]:
    return (joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                           unique_key=["c_customer_sk"]),
            joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"],
                           unique_key=BIG_UNIQUE_KEY if big_unique else None))


def _settle(store: joinstate.StateStore, cfs: list[str], timeout: float) -> float:
    """Wait until no compaction runs or is pending (auto-compaction is on again by now)."""
    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        busy = any(
            (store.property_int(cf, "rocksdb.num-running-compactions") or 0)
            or (store.property_int(cf, "rocksdb.compaction-pending") or 0)
            or (store.property_int(cf, "rocksdb.num-running-flushes") or 0)
            for cf in cfs
        )
        if not busy:
            break
        time.sleep(0.1)
    return time.perf_counter() - t


def _shard_sales(n_big: int, n_small: int, batch_rows: int, shard: int) -> Any:
    """Sales over customers ``[shard * n_small, (shard + 1) * n_small)``: one shard's data."""
    offset = shard * n_small
    for b in syn.sales_batches(n_big, n_small, batch_rows, seed=1 + shard):
        i = b.schema.get_field_index("ss_customer_sk")
        yield b.set_column(i, b.schema.field(i), pc.add(b.column(i), offset))


def run_one(workdir: Path, strategy: str, order: str, n_small: int, n_big: int,
            batch_rows: int, settle_timeout: float, shard: int = 0,
            big_unique: bool = False) -> dict[str, Any]:
    """Populate one fresh store with one strategy and order; report plus settle time.

    ``shard`` > 0 gives the data of another shard (disjoint customers), for the
    multi-process mode.
    """
    path = workdir / f"{strategy}-{order}-{shard}"
    shutil.rmtree(path, ignore_errors=True)
    gc.collect()
    with joinstate.StateStore(path) as store:
        ls, rs = _sides(big_unique)
        j = store.join("pop", left=ls, right=rs)
        left = syn.customers(n_small, seed=shard, start=shard * n_small)
        right = _shard_sales(n_big, n_small, batch_rows, shard)
        before = statistics_counters(store.statistics())
        t = time.perf_counter()
        rep = population.populate(j, left, right, strategy=strategy, order=order,
                                  progress=shard == 0 and sys.stderr.isatty(),
                                  sizes={"left": n_small, "right": n_big},
                                  batch_rows=batch_rows)
        wall = time.perf_counter() - t
        cfs = [c for s in ("left", "right") for c in j.index(s).column_families]
        settle = _settle(store, cfs, settle_timeout)
        total = counter_delta(statistics_counters(store.statistics()), before)
        l0_end = {cf: store.property_int(cf, "rocksdb.num-files-at-level0") for cf in cfs}
        ok = rep.output_rows == n_big  # every sale has its customer
    size_after = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    shutil.rmtree(path, ignore_errors=True)
    d = rep.to_dict()
    d.pop("l0_samples", None)
    d.update(
        bench_wall=round(wall, 3), settle_seconds=round(settle, 3),
        settled_rocksdb=total, l0_after_settle=l0_end, state_bytes_settled=size_after,
        correct=ok, l0_samples_n=len(rep.l0_samples),
        l0_trace=[(t_, sum(v.values())) for t_, v in rep.l0_samples[:: max(
            1, len(rep.l0_samples) // 40)]],
    )
    return d


def strategies_table(rows: list[dict[str, Any]]) -> str:
    """Render data sets 1/2 as markdown; speedups are over symmetric with the same order."""
    base = {r["order"]: r["bench_wall"] for r in rows if r["strategy"]["name"] == "symmetric"
            and r["label"] == "symmetric"}
    base_total = {r["order"]: r["bench_wall"] + r["settle_seconds"] for r in rows
                  if r["label"] == "symmetric"}
    head = ("| strategy | order | wall s | rows/s | speedup | +settle s | speedup incl. settle "
            "| written MiB | compaction r+w MiB (load / +settle) | compaction s | stall s "
            "| L0 max | state MiB | peak RSS MiB | ok |")
    out = [head, "|" + "---|" * 15]
    for r in rows:
        tot = r["bench_wall"] + r["settle_seconds"]
        rb = r["rocksdb"]
        sb = r["settled_rocksdb"]
        comp = (rb["compaction_read_bytes"] + rb["compaction_write_bytes"]) / MIB
        comp_s = (sb["compaction_read_bytes"] + sb["compaction_write_bytes"]) / MIB
        out.append(
            f"| {r['label']} | {r['order']} | {r['bench_wall']:.1f} | "
            f"{r['rows_per_second']:,.0f} | "
            f"{base.get(r['order'], float('nan')) / r['bench_wall']:.2f}x | "
            f"{r['settle_seconds']:.1f} | {base_total.get(r['order'], float('nan')) / tot:.2f}x"
            f" | {r['bytes_written'] / MIB:,.0f} | {comp:,.0f} / {comp_s:,.0f} | "
            f"{sb['compaction_micros'] / 1e6:.1f} | {sb['stall_micros'] / 1e6:.2f} | "
            f"{max(r['l0_max'].values(), default=0)} | {r['state_bytes_settled'] / MIB:,.0f} | "
            f"{r['peak_rss'] / MIB:,.0f} | {'yes' if r['correct'] else 'NO'} |"
        )
    return "\n".join(out)


def _strategy_reason(r: dict[str, Any]) -> str:
    """The planner's reason for the strategy it ran (from the report's plan)."""
    for d in r.get("plan", {}).get("decisions", []):
        if d["topic"] == "strategy":
            return str(d["reason"])
    return str(r.get("reason", ""))


def auto_table(rows: list[dict[str, Any]]) -> str:
    """``auto`` against the fixed strategies, per order: rows/s, what it picked and why.

    ``auto`` passes when it is within 10% of the best fixed strategy's rows/s and not
    below the worst one's (populate's wall time; the settle time is in the main table).
    A strategy listed more than once in ``--strategies`` counts with its best run (on a
    shared machine, the best of a few runs is the least disturbed one).  ``auto`` runs
    exactly the preset it picks, so "pick / best fixed" (the picked preset's own fixed
    runs against the best) judges the decision apart from run-to-run noise.
    """
    fixed_names = list(dict.fromkeys(r["label"] for r in rows if r["label"] != "auto"))
    out = ["| order | " + " | ".join(f"{n} rows/s" for n in fixed_names)
           + " | auto rows/s | auto picked | auto / best fixed | auto / worst fixed | ok "
           "| pick / best fixed | why (the planner's reason) |",
           "|" + "---|" * (len(fixed_names) + 8)]
    for order in dict.fromkeys(r["order"] for r in rows):
        mine = [r for r in rows if r["order"] == order]
        fixed: dict[str, float] = {}
        for r in mine:
            if r["label"] != "auto":
                fixed[r["label"]] = max(fixed.get(r["label"], 0.0), r["rows_per_second"])
        autos = [r for r in mine if r["label"] == "auto"]
        if autos:
            a = max(autos, key=lambda r: r["rows_per_second"])
            rate = a["rows_per_second"]
            best, worst = max(fixed.values(), default=0), min(fixed.values(), default=0)
            ok = bool(fixed) and rate >= 0.9 * best and rate >= worst
            runs = f" (best of {len(autos)})" if len(autos) > 1 else ""
            pick = fixed.get(a["strategy"]["name"])
            pick_text = f"{pick / best:.2f}x" if pick and best else "-"
            out.append(
                f"| {order} | " + " | ".join(f"{fixed.get(n, float('nan')):,.0f}"
                                             for n in fixed_names)
                + f" | {rate:,.0f}{runs} | {a['strategy']['name']} | "
                f"{rate / best if best else float('nan'):.2f}x | "
                f"{rate / worst if worst else float('nan'):.2f}x | "
                f"{'yes' if ok else 'NO'} | {pick_text} | {_strategy_reason(a)} |")
    return "\n".join(out)


def auto_explain(rows: list[dict[str, Any]]) -> list[str]:
    """The plan of the first ``auto`` run, as markdown (a fenced block)."""
    for r in rows:
        if r["label"] == "auto" and r.get("explain"):
            return [f"plan of the `auto` run ({r['order']}):", "", "```text", r["explain"],
                    "```", ""]
    return []


def run_parallel(workdir: Path, strategy: str, order: str, n_small: int, n_big: int,
                 batch_rows: int, settle_timeout: float, processes: int,
                 big_unique: bool = False) -> dict[str, Any]:
    """``processes`` shards populated at once, one process each (as Spark tasks would).

    With one writer per core, RocksDB's background compaction competes with the writers
    for CPU instead of running free on an idle core: the setting Epsio measured in.
    Each shard gets ``1/processes`` of the rows; the wall time is the slowest shard's.
    """
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
        futures = [
            pool.submit(run_one, workdir, strategy, order, n_small // processes,
                        n_big // processes, batch_rows, settle_timeout, shard, big_unique)
            for shard in range(processes)
        ]
        shards = [f.result() for f in futures]
    wall = max(r["bench_wall"] for r in shards)
    settle = max(r["bench_wall"] + r["settle_seconds"] for r in shards) - wall
    merged: dict[str, Any] = dict(shards[0])
    merged.update(
        bench_wall=wall, settle_seconds=settle, processes=processes,
        rows_per_second=(n_small // processes + n_big // processes) * processes / wall,
        bytes_written=sum(r["bytes_written"] for r in shards),
        state_bytes_settled=sum(r["state_bytes_settled"] for r in shards),
        peak_rss=sum(r["peak_rss"] for r in shards),
        correct=all(r["correct"] for r in shards),
        l0_max={cf: max(r["l0_max"].get(cf, 0) for r in shards) for cf in shards[0]["l0_max"]},
        shard_walls=[r["bench_wall"] for r in shards],
    )
    for key in ("rocksdb", "settled_rocksdb"):
        merged[key] = {k: sum(r[key][k] for r in shards) for k in shards[0][key]}
    return merged


# ---- data set 3: the memtable question -------------------------------------------------

def memtable_one(workdir: Path, memtable: joinstate.Memtable, n_small: int, n_big: int,
                 lookups: int) -> dict[str, Any]:
    """Measure one small-side memtable: writes, in-memtable lookups, big-side pushes."""
    path = workdir / f"memtable-{memtable}"
    shutil.rmtree(path, ignore_errors=True)
    # A memtable big enough that the whole small side stays in it: the case the hash
    # skip list is meant for.  Probe cache off: every probe goes to RocksDB.
    opts = joinstate.StoreOptions(write_buffer_size=512 * MIB, probe_cache_max_rows=0)
    res: dict[str, Any] = {"memtable": memtable, "small_rows": n_small}
    with joinstate.StateStore(path, opts) as store:
        ls, rs = _sides()
        j = store.join("m", left=ls, right=rs)
        cf = j.index("left").column_family
        store.recreate_empty(cf, joinstate.IndexOptions(memtable=memtable))
        cust = syn.customers(n_small)
        t = time.perf_counter()
        for b in cust.to_batches(max_chunksize=65_536):
            j.push("left", b)
        res["write_rows_per_s"] = n_small / (time.perf_counter() - t)
        h = store.cf(cf)  # raw reads: the memtable's own get rates, no join in between
        ro = rd.ReadOptions()
        ro.set_total_order_seek(True)
        keys = list(h.keys(read_opt=ro))
        rng = random.Random(0)
        sample = [rng.choice(keys) for _ in range(lookups)]
        # Time-boxed: a vector memtable sorts itself for every read (~ms per get).
        t = time.perf_counter()
        done = 0
        for k in sample:
            h.get(k)
            done += 1
            if done % 64 == 0 and time.perf_counter() - t > 5.0:
                break
        res["get_per_s"] = done / (time.perf_counter() - t)
        t = time.perf_counter()
        done = 0
        for i in range(0, len(sample), 100):
            h.get(sample[i:i + 100])
            done += len(sample[i:i + 100])
            if time.perf_counter() - t > 5.0:
                break
        res["multiget_keys_per_s"] = done / (time.perf_counter() - t)
        res["in_memtable_rows"] = store.property_int(cf, "rocksdb.num-entries-active-mem-table")
        t = time.perf_counter()
        for b in syn.sales_batches(n_big, n_small, 65_536):
            j.push("right", b)
        res["big_push_rows_per_s"] = n_big / (time.perf_counter() - t)
    shutil.rmtree(path, ignore_errors=True)
    return res


def memtable_table(rows: list[dict[str, Any]]) -> str:
    """Render data set 3 as markdown."""
    out = ["| small-side memtable | small rows | write rows/s (join.push) | get/s (hits, "
           "in memtable) | multi-get keys/s | big-side push rows/s (probe cache off: the small "
           "side is read from RocksDB for every batch, by a total-order scan or by "
           "multi-get as the cost model picks) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['memtable']} | {r['small_rows']:,} | {r['write_rows_per_s']:,.0f} | "
            f"{r['get_per_s']:,.0f} | {r['multiget_keys_per_s']:,.0f} | "
            f"{r['big_push_rows_per_s']:,.0f} |"
        )
    return "\n".join(out)


def run_sets(sets: Sequence[int], *, small: int | None = None, large: int | None = None,
             strategies: Sequence[str] = STRATEGIES,
             orders: Sequence[str] = ("small-first", "interleaved", "as-given"),
             batch_rows: int = 65_536, settle_timeout: float = 600.0,
             memtable_small: int = 100_000, memtable_big: int = 500_000,
             lookups: int = 20_000, processes: int = 1, big_unique: bool = False,
             out: Path = Path("bench-results")) -> int:
    """Run the data sets ``sets``; write JSON + markdown under ``out``; print the tables.

    What ``joinstate bench population`` runs.  Returns the exit status (0).
    """
    out.mkdir(parents=True, exist_ok=True)
    work = out / "population-work"
    work.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {"started": stamp, "sets": {}}
    md = [f"# population benchmark {stamp}", ""]
    for s in sets:
        if s in SETS:
            n_small, n_big = SETS[s]
            n_small, n_big = small or n_small, large or n_big
            rows = []
            for order in orders:
                for strategy in strategies:
                    print(f"set {s}: {strategy} {order} {n_small:,} x {n_big:,}", flush=True)
                    if processes > 1:
                        r = run_parallel(work, strategy, order, n_small, n_big,
                                         batch_rows, settle_timeout, processes,
                                         big_unique)
                    else:
                        r = run_one(work, strategy, order, n_small, n_big, batch_rows,
                                    settle_timeout, big_unique=big_unique)
                    r["label"] = strategy
                    rows.append(r)
                    print(f"  wall {r['bench_wall']:.1f}s settle {r['settle_seconds']:.1f}s "
                          f"({r['strategy']['name']}: {r['reason']})", flush=True)
            results["sets"][str(s)] = rows
            procs = f", {processes} shards in parallel processes" \
                if processes > 1 else ""
            procs += f", big side unique on {BIG_UNIQUE_KEY}" if big_unique else ""
            md += [f"## data set {s}: {n_small:,} customers x {n_big:,} sales{procs}", "",
                   strategies_table(rows), ""]
            if any(r["label"] == "auto" for r in rows):
                md += ["### `auto` (the planner) against the fixed strategies", "",
                       auto_table(rows), "", *auto_explain(rows)]
        elif s == 3:
            rows = [memtable_one(work, m, memtable_small, memtable_big, lookups)
                    for m in MEMTABLES]
            results["sets"]["3"] = rows
            md += ["## data set 3: small-side memtable", "", memtable_table(rows), ""]
        else:
            raise ValueError(f"data set {s}: must be 1, 2 or 3")
        (out / f"population-{stamp}.json").write_text(json.dumps(results, indent=1))
        (out / f"population-{stamp}.md").write_text("\n".join(md))
    shutil.rmtree(work, ignore_errors=True)
    print("\n".join(md))
    print(f"\nwrote {out / f'population-{stamp}.json'} and .md")
    return 0
