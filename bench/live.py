"""``python -m bench live``: the live phase at the speed of the change, on TPC-DS data.

After population the join should cost in proportion to the change, not to the state:
a batch touching 0.01% of the sales should take milliseconds whatever the size of the
join.  This suite measures that on TPC-DS data (``bench/tpcds.py``, cached Parquet):

* customer (left, unique on ``c_customer_sk``) ⋈ store_sales (right, a bag on
  ``ss_customer_sk``; its NULL-key rows are kept: stored, never matching), inner;
* ``population.populate(strategy="auto")`` into a fresh store, then **straight away**
  (no warm-up, no ``stats()``), for each batch size (a share of the sales rows) and
  ``--repeat`` times, three pushes: (i) delete a random sample of sales rows (each row
  deleted once in the whole run), (ii) re-insert the same rows, (iii) update as many
  customers in proportion (-old row, +row with a new last name and e-mail);
* DuckDB recomputing the whole join from the Parquet files into Arrow (median of 3),
  and the ratio recompute / incremental batch;
* the store closed, reopened and the join re-attached from its catalog before each
  size: the first batch after a reopen (cold caches) against the tenth;
* the whole pass again with ``StoreOptions(probe="point")``: no in-memory probe cache,
  every probe reads RocksDB (``--no-point-pass`` skips it);
* every pass checks that the sum of all output deltas (population included) equals
  DuckDB's join of the final inputs, as multisets; a mismatch fails the run (exit 1).

Writes ``live.json`` and ``live.md`` under ``--out`` and prints the markdown.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import joinstate
import population
from bench import tpcds

__all__ = ["CUSTOMER_COLUMNS", "SALES_COLUMNS", "run_live", "to_markdown"]

JOIN = "customer_sales"
CUSTOMER_COLUMNS = ["c_customer_sk", "c_customer_id", "c_first_name", "c_last_name",
                    "c_preferred_cust_flag", "c_email_address"]
SALES_COLUMNS = ["ss_sold_date_sk", "ss_item_sk", "ss_customer_sk", "ss_ticket_number",
                 "ss_quantity", "ss_net_paid"]
SIZES = (0.0001, 0.001, 0.01)
KINDS = ("delete", "insert", "customer")
KIND_TEXT = {"delete": "sales delete (-1)", "insert": "sales re-insert (+1)",
             "customer": "customer update (-old +new)"}
TARGET_MS = {0.0001: 10.0, 0.001: 40.0, 0.01: 300.0}
"""Per-batch (delete + insert + customer update) targets by share of the sales rows."""
DELETE_TARGET_ROWS_S = 100_000.0
RECOMPUTE_RUNS = 3


# ---- the workload --------------------------------------------------------------------


def _weighted(table: pa.Table, w: int) -> pa.Table:
    return table.append_column("_weight", pa.array(np.full(table.num_rows, w, np.int64)))


class Workload:
    """The change batches of one pass, and the inputs as they stand after them.

    Sales rows to delete come from one random permutation of the loaded rows, consumed in
    order, so no row is deleted twice in a pass (rows deleted and re-inserted in the
    same place of the state would flatter later batches); it wraps around (and says so
    in ``wrapped``) only if a pass needs more rows than the table has.  Customer
    updates change ``c_last_name`` and ``c_email_address``; the current values are kept
    here, so each update retracts exactly the row the join holds.
    """

    def __init__(self, customer: pa.Table, sales: pa.Table, seed: int) -> None:
        self.customer, self.sales = customer, sales
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(sales.num_rows)
        self.cursor = 0
        self.wrapped = False
        self.version = 0
        self.i_last = customer.schema.get_field_index("c_last_name")
        self.i_email = customer.schema.get_field_index("c_email_address")
        self.last: list[str | None] = customer.column("c_last_name").to_pylist()
        self.email: list[str | None] = customer.column("c_email_address").to_pylist()

    def sales_rows(self, n: int) -> pa.Table:
        """The next ``n`` rows of the permutation (no row twice unless it wraps)."""
        if self.cursor + n > len(self.order):
            self.order = self.rng.permutation(self.sales.num_rows)
            self.cursor, self.wrapped = 0, True
        idx = self.order[self.cursor:self.cursor + n]
        self.cursor += n
        return self.sales.take(pa.array(idx))

    def _with(self, base: pa.Table, idx: np.ndarray) -> pa.Table:
        t = base.set_column(self.i_last, base.schema.field(self.i_last),
                            pa.array([self.last[i] for i in idx], pa.string()))
        return t.set_column(self.i_email, t.schema.field(self.i_email),
                            pa.array([self.email[i] for i in idx], pa.string()))

    def customer_update(self, n: int) -> pa.Table:
        """-current row, +changed row for ``n`` distinct random customers (2n rows)."""
        idx = self.rng.choice(self.customer.num_rows, n, replace=False)
        base = self.customer.take(pa.array(idx))
        old = self._with(base, idx)
        self.version += 1
        for i in idx:
            self.last[i] = f"{self.last[i] or ''}~{self.version}"
            self.email[i] = f"v{self.version}.{self.email[i] or ''}"
        new = self._with(base, idx)
        return pa.concat_tables([_weighted(old, -1), _weighted(new, 1)])

    def final_customer(self) -> pa.Table:
        """The customer table after every update so far."""
        return self._with(self.customer, np.arange(self.customer.num_rows))


def batch_rows(share: float, n_sales: int, n_customers: int) -> tuple[int, int]:
    """Sales rows and customers (each gives 2 rows) of a batch of ``share`` of the sales.

    Customers change in proportion: the same share of the customers (at SF1, 0.01% of
    sales = 288 rows, and 10 customers = 20 rows).
    """
    n = max(1, round(share * n_sales))
    return n, max(1, min(n_customers, round(n * n_customers / n_sales)))


# ---- measurement ---------------------------------------------------------------------


@dataclass
class Series:
    """The pushes of one kind at one size: input rows, ms and output rows per push."""

    rows: int = 0
    ms: list[float] = field(default_factory=list)
    out_rows: list[int] = field(default_factory=list)

    def summary(self, kth: int) -> dict[str, Any]:
        """First / median / max / k-th (1-based, the last one if fewer) and rates."""
        med = statistics.median(self.ms)
        return {
            "rows": self.rows, "ms": [round(x, 3) for x in self.ms], "out_rows": self.out_rows,
            "first_ms": self.ms[0], "median_ms": med, "max_ms": max(self.ms),
            "kth": min(kth, len(self.ms)), "kth_ms": self.ms[min(kth, len(self.ms)) - 1],
            "rows_per_s_median": self.rows / med * 1e3 if med > 0 else float("inf"),
            "out_rows_median": statistics.median(self.out_rows),
        }


def _push(join: joinstate.Join, side: joinstate.SideName, delta: pa.Table,
          series: Series, outputs: list[pa.Table]) -> float:
    """One timed push (the delta is built before the clock starts); returns ms."""
    t0 = time.perf_counter()
    out = join.push(side, delta)
    ms = (time.perf_counter() - t0) * 1e3
    series.rows = delta.num_rows
    series.ms.append(ms)
    series.out_rows.append(out.num_rows)
    outputs.append(out)
    return ms


def _batches(join: joinstate.Join, work: Workload, share: float, repeat: int,
             outputs: list[pa.Table]) -> dict[str, Any]:
    """``repeat`` rounds of delete / re-insert / customer update at one size."""
    n_sales, n_cust = batch_rows(share, work.sales.num_rows, work.customer.num_rows)
    series = {k: Series() for k in KINDS}
    tot = Series(rows=n_sales * 2 + n_cust * 2)
    memtable: list[int] = []
    for _ in range(repeat):
        rows = work.sales_rows(n_sales)
        minus, plus = _weighted(rows, -1), _weighted(rows, 1)
        update = work.customer_update(n_cust)
        ms = _push(join, "right", minus, series["delete"], outputs)
        ms += _push(join, "right", plus, series["insert"], outputs)
        ms += _push(join, "left", update, series["customer"], outputs)
        tot.ms.append(ms)
        tot.out_rows.append(sum(s.out_rows[-1] for s in series.values()))
        memtable.append(_memtable_entries(join))
    kth = 10
    return {
        "share": share, "sales_rows": n_sales, "customers": n_cust,
        "kinds": {k: s.summary(kth) for k, s in series.items()},
        "total": tot.summary(kth),
        # Writes slow down as the sales index's memtable fills (an insert into a full
        # 64 MiB memtable costs 2-4x one into an empty one), and reset when it is flushed:
        # this is what makes a batch slower than the previous one.
        "memtable_entries": memtable,
    }


def _memtable_entries(join: joinstate.Join) -> int:
    """Entries (puts and deletes) in the sales index's active memtable."""
    store = join.store
    if store is None:
        return 0
    n = store.property_int(join.index("right").column_family,
                           "rocksdb.num-entries-active-mem-table")
    return n or 0


def _join(store: joinstate.StateStore, customer: pa.Schema, sales: pa.Schema
          ) -> joinstate.Join:
    return store.join(
        JOIN,
        left=joinstate.Side(customer, ["c_customer_sk"], ["c_customer_sk"]),
        right=joinstate.Side(sales, ["ss_customer_sk"]),
        how="inner",
    )


def check(outputs: list[pa.Table], customer: pa.Table, sales: pa.Table) -> dict[str, Any]:
    """Integrated output vs DuckDB's join of the final inputs, as multisets.

    ``mismatches`` counts (row, multiplicity) pairs in either difference; ``ok`` needs
    none, and equal total multiplicities (a second, independent count).
    """
    import duckdb  # the bench extra: the reference implementation

    out = pa.concat_tables([o for o in outputs if o.num_rows], promote_options="permissive")
    cols = ", ".join(f'"{c}"' for c in out.column_names if c != "_weight")
    con = duckdb.connect()
    try:
        con.register("outputs", out)
        con.register("customer", customer)
        con.register("store_sales", sales)
        con.execute(f"""
            CREATE TEMP TABLE got AS SELECT {cols}, sum(_weight)::BIGINT AS w FROM outputs
                GROUP BY ALL HAVING sum(_weight) <> 0;
            CREATE TEMP TABLE want AS SELECT {cols}, count(*)::BIGINT AS w
                FROM customer JOIN store_sales ON c_customer_sk = ss_customer_sk GROUP BY ALL;
        """)
        row = con.execute("""
            SELECT (SELECT count(*) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want)),
                   (SELECT count(*) FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got)),
                   (SELECT coalesce(sum(w), 0) FROM got), (SELECT coalesce(sum(w), 0) FROM want),
                   (SELECT count(*) FROM got WHERE w < 0)
        """).fetchone()
    finally:
        con.close()
    assert row is not None
    extra, missing, got, want, negative = (int(x) for x in row)
    return {"ran": True, "ok": extra == 0 and missing == 0 and got == want and negative == 0,
            "mismatches": extra + missing, "extra_rows": extra, "missing_rows": missing,
            "got_rows": got, "want_rows": want, "negative_rows": negative,
            "output_deltas": len(outputs), "output_delta_rows": out.num_rows}


def run_pass(name: str, options: joinstate.StoreOptions, paths: dict[str, Path],
             customer: pa.Table, sales: pa.Table, sizes: tuple[float, ...], repeat: int,
             workdir: Path, seed: int) -> dict[str, Any]:
    """Populate a fresh store, run the batches, reopen per size, check; return figures."""
    path = workdir / name
    shutil.rmtree(path, ignore_errors=True)
    work = Workload(customer, sales, seed)
    outputs: list[pa.Table] = []
    res: dict[str, Any] = {"name": name, "options": {"probe": options.probe}}
    store = joinstate.StateStore(path, options)
    try:
        join = _join(store, customer.schema, sales.schema)
        t0 = time.perf_counter()
        rep = population.populate(join, left=str(paths["customer"]),
                                  right=str(paths["store_sales"]), strategy="auto",
                                  progress=False, sink=outputs.append)
        res["populate_s"] = time.perf_counter() - t0
        res["population"] = {"strategy": rep.strategy.get("name"), "reason": rep.reason,
                             "output_rows": rep.output_rows,
                             "rows_per_s": rep.rows_per_second}
        # Straight into the live phase: the first batch is the one a user gets.
        res["sizes"] = [_batches(join, work, s, repeat, outputs) for s in sizes]
        res["reopen"] = []
        for s in sizes:
            store.close()
            t0 = time.perf_counter()
            store = joinstate.StateStore(path, options)
            join = store.join(JOIN)  # re-attached from the catalog
            reopen_ms = (time.perf_counter() - t0) * 1e3
            r = _batches(join, work, s, repeat, outputs)
            r["reopen_ms"] = reopen_ms
            res["reopen"].append(r)
    finally:
        store.close()
    res["delete_rows_wrapped"] = work.wrapped
    res["check"] = check(outputs, work.final_customer(), sales)
    shutil.rmtree(path, ignore_errors=True)
    return res


def duckdb_recompute(paths: dict[str, Path], runs: int = RECOMPUTE_RUNS) -> dict[str, Any]:
    """DuckDB recomputing the whole join from the Parquet files into an Arrow table."""
    import duckdb

    con = duckdb.connect()
    try:
        cols = ", ".join(CUSTOMER_COLUMNS + SALES_COLUMNS)
        sql = (f"SELECT {cols} FROM read_parquet(?) JOIN read_parquet(?) "
               "ON c_customer_sk = ss_customer_sk")
        ms, rows = [], 0
        for _ in range(runs):
            t0 = time.perf_counter()
            rows = con.execute(sql, [str(paths["customer"]), str(paths["store_sales"])]
                               ).to_arrow_table().num_rows
            ms.append((time.perf_counter() - t0) * 1e3)
        threads = con.execute("SELECT current_setting('threads')").fetchone()
    finally:
        con.close()
    return {"ms": ms, "median_ms": statistics.median(ms), "rows": rows,
            "threads": int(threads[0]) if threads else None}


def _git() -> dict[str, Any]:
    """The commit measured, and uncommitted changes to the code under test.

    ``JOINSTATE_BENCH_COMMIT`` names the commit of a tree exported without ``.git``
    (``git archive``), e.g. to measure a clean commit while the checkout is being edited.
    """
    named = os.environ.get("JOINSTATE_BENCH_COMMIT")
    if named:
        return {"head": named, "dirty": []}
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "log", "--oneline", "-1"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "joinstate", "population"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return {"head": None, "dirty": []}
    return {"head": head, "dirty": [d.strip() for d in dirty if d.strip()]}


def run_live(sf: float = 1.0, sizes: tuple[float, ...] = SIZES, repeat: int = 10,
             out: Path | None = None, *, point_pass: bool = True, seed: int = 0,
             workdir: Path | None = None, cache_dir: Path | None = None,
             recompute_runs: int = RECOMPUTE_RUNS) -> dict[str, Any]:
    """Run the suite; write ``live.json``/``live.md`` under ``out`` if given.

    Returns the results; ``results["ok"]`` is whether every pass's check passed.
    """
    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1")
    paths = tpcds.tables(sf, ["customer", "store_sales"],
                         {"customer": CUSTOMER_COLUMNS, "store_sales": SALES_COLUMNS},
                         cache_dir=cache_dir)
    customer = pq.read_table(paths["customer"])
    sales = pq.read_table(paths["store_sales"])
    res: dict[str, Any] = {
        "suite": "live", "sf": sf, "sizes": list(sizes), "repeat": repeat, "seed": seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git": _git(),
        "load_average_start": list(os.getloadavg()),
        "customers": customer.num_rows, "sales": sales.num_rows,
        "sales_null_customer": sales.column("ss_customer_sk").null_count,
        "targets": {"batch_ms": {str(k): v for k, v in TARGET_MS.items()},
                    "delete_rows_per_s": DELETE_TARGET_ROWS_S, "first_le_tenth": True},
    }
    res["duckdb_recompute"] = duckdb_recompute(paths, recompute_runs)
    tmp = Path(workdir or tempfile.mkdtemp(prefix="joinstate-live-"))
    passes = [("auto", joinstate.StoreOptions())]
    if point_pass:
        passes.append(("point", joinstate.StoreOptions(probe="point")))
    try:
        res["passes"] = [run_pass(n, o, paths, customer, sales, sizes, repeat, tmp, seed)
                         for n, o in passes]
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["load_average_end"] = list(os.getloadavg())
    res["ok"] = all(p["check"]["ok"] for p in res["passes"])
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "live.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "live.md").write_text(to_markdown(res) + "\n")
    return res


# ---- report ---------------------------------------------------------------------------


def _short(head: str | None, width: int = 72) -> str:
    head = head or "unknown"
    return head if len(head) <= width else head[: width - 3] + "..."


def _pct(share: float) -> str:
    return f"{share * 100:g}%"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _pass_markdown(p: dict[str, Any], recompute_ms: float) -> list[str]:
    kth = p["sizes"][0]["total"]["kth"]
    nth = f"#{kth}"
    md = [f"population: {p['populate_s']:.1f} s, strategy {p['population']['strategy']} "
          f"({p['population']['reason']}), {p['population']['output_rows']:,} output rows", "",
          "### per push (the first push is the first after population)", "",
          f"| size | kind | rows | first ms | median ms | max ms | {nth} ms | rows/s (median) "
          "| output rows (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for s in p["sizes"]:
        for k in KINDS:
            r = s["kinds"][k]
            md.append(f"| {_pct(s['share'])} | {KIND_TEXT[k]} | {r['rows']:,} | "
                      f"{r['first_ms']:.1f} | {r['median_ms']:.1f} | {r['max_ms']:.1f} | "
                      f"{r['kth_ms']:.1f} | {r['rows_per_s_median']:,.0f} | "
                      f"{r['out_rows_median']:,.0f} |")
    md += ["", "### per batch (delete + re-insert + customer update)", "",
           f"| size | sales rows | customers | first ms | median ms | max ms | {nth} ms "
           "| target ms | median ≤ target | max ≤ target | first ≤ "
           f"{nth} | DuckDB recompute ms | recompute / median batch |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in p["sizes"]:
        t = s["total"]
        target = TARGET_MS.get(s["share"])
        tgt = f"{target:g}" if target else "-"
        med_ok = _yes(t["median_ms"] <= target) if target else "-"
        max_ok = _yes(t["max_ms"] <= target) if target else "-"
        md.append(f"| {_pct(s['share'])} | {s['sales_rows']:,} | {s['customers']:,} | "
                  f"{t['first_ms']:.1f} | {t['median_ms']:.1f} | {t['max_ms']:.1f} | "
                  f"{t['kth_ms']:.1f} | {tgt} | {med_ok} | {max_ok} | "
                  f"{_yes(t['first_ms'] <= t['kth_ms'])} ({t['first_ms'] / t['kth_ms']:.2f}x) | "
                  f"{recompute_ms:,.0f} | {recompute_ms / t['median_ms']:,.0f}x |")
    mem = [f"{_pct(s['share'])}: {s['memtable_entries'][0] / 1e3:,.0f}k → "
           f"{max(s['memtable_entries']) / 1e3:,.0f}k" for s in p["sizes"]
           if s.get("memtable_entries")]
    if mem:
        md += ["", "entries in the sales index's memtable after the first batch → at most "
               "(writes slow down as it fills, until it is flushed): " + "; ".join(mem)]
    md += ["", "### after a reopen (close, reopen, re-attach from the catalog, before each "
           "size)", "",
           f"| size | reopen ms | kind | first after reopen ms | median ms | {nth} ms | "
           f"first / {nth} |", "|---|---|---|---|---|---|---|"]
    for s in p["reopen"]:
        for k in (*KINDS, "total"):
            r = s["total"] if k == "total" else s["kinds"][k]
            md.append(f"| {_pct(s['share'])} | {s['reopen_ms']:.0f} | "
                      f"{KIND_TEXT.get(k, 'batch total')} | {r['first_ms']:.1f} | "
                      f"{r['median_ms']:.1f} | {r['kth_ms']:.1f} | "
                      f"{r['first_ms'] / r['kth_ms']:.2f}x |")
    md += ["", "### targets", "", "| target | measured | met |", "|---|---|---|"]
    for s in p["sizes"]:
        target = TARGET_MS.get(s["share"])
        if target:
            t = s["total"]
            md.append(f"| {_pct(s['share'])} batch ≤ {target:g} ms | median "
                      f"{t['median_ms']:.1f} ms, max {t['max_ms']:.1f} ms | "
                      f"{_yes(t['median_ms'] <= target)} |")
    for s in p["sizes"]:
        d = s["kinds"]["delete"]
        md.append(f"| bag deletes ≥ {DELETE_TARGET_ROWS_S:,.0f} rows/s ({_pct(s['share'])}, "
                  f"{d['rows']:,} rows) | {d['rows_per_s_median']:,.0f} rows/s (median) | "
                  f"{_yes(d['rows_per_s_median'] >= DELETE_TARGET_ROWS_S)} |")
    for label, group in (("after population", p["sizes"]), ("after reopen", p["reopen"])):
        for s in group:
            t = s["total"]
            md.append(f"| first ≤ {nth} ({_pct(s['share'])}, {label}) | "
                      f"{t['first_ms']:.1f} vs {t['kth_ms']:.1f} ms | "
                      f"{_yes(t['first_ms'] <= t['kth_ms'])} |")
    c = p["check"]
    md += ["", f"check: integrated output ({c['output_deltas']:,} deltas) vs DuckDB join of "
           f"the final inputs: {c['mismatches']} mismatching rows, {c['got_rows']:,} vs "
           f"{c['want_rows']:,} rows -> **{'OK' if c['ok'] else 'FAILED'}**"]
    if p.get("delete_rows_wrapped"):
        md.append("(the pass needed more sales rows than the table has: some rows were "
                  "deleted twice)")
    return md


def to_markdown(res: dict[str, Any]) -> str:
    """The report: per pass, per push and per batch tables, reopen, targets, check."""
    g = res["git"]
    rc = res["duckdb_recompute"]
    md = [f"# live phase: TPC-DS SF{res['sf']:g} customer ⋈ store_sales", "",
          f"{res['customers']:,} customers x {res['sales']:,} sales "
          f"({res['sales_null_customer']:,} with NULL ss_customer_sk, kept); "
          f"{res['repeat']} batches per size, seed {res['seed']}; {res['started']}; "
          f"commit `{_short(g['head'])}`" + (f" (uncommitted changes in {', '.join(g['dirty'])})"
                                     if g["dirty"] else ""), "",
          f"DuckDB recompute of the whole join from Parquet into Arrow "
          f"({rc['rows']:,} rows, {rc['threads']} threads): median {rc['median_ms']:,.0f} ms "
          f"of {', '.join(f'{x:,.0f}' for x in rc['ms'])}; load average (1 min) "
          f"{res['load_average_start'][0]:.1f} at the start, {res['load_average_end'][0]:.1f} "
          f"at the end ({os.cpu_count()} CPUs)", ""]
    titles = {"auto": "default StoreOptions (probe auto: in-memory probe cache allowed)",
              "point": 'StoreOptions(probe="point"): every probe reads RocksDB'}
    for p in res["passes"]:
        md += [f"## pass `{p['name']}`: {titles.get(p['name'], p['name'])}", ""]
        md += _pass_markdown(p, rc["median_ms"])
        md.append("")
    return "\n".join(md)
