"""``python -m bench recompute``: incremental apply vs recompute per change batch, and the rule.

TPC-DS customer ⋈ store_sales (the live benchmark's join and columns, ``bench/live.py``)
is populated once into a store, which is closed (its derived files saved: entry maps,
probe-cache decisions).  Then for every batch kind and size:

* the closed store is copied twice (SST files hard-linked: they are immutable, so two
  stores can share them; the rest copied), and each copy opened and re-attached;
* the same change batch is applied to one copy with ``strategy="incremental"`` and to
  the other with ``strategy="recompute"`` (``population.apply_batch``), each timed from
  the call to the commit;
* the two outputs must be equal as Z-sets and the two sides' row and entry counters
  equal, else the run fails (exit 1);
* the planner's decision (``planner.batch.decide_batch``) is taken on the recompute
  copy before applying, twice: with the built-in defaults (a store with no history) and
  with the costs measured at the smaller sizes of the same kind recorded into it first
  (what ``strategy="auto"`` decides in a running system).

Kinds: ``sales``: a batch of ``size`` x the sales rows to the right side, half deletes of
existing rows, half inserts of new rows (existing rows with a new ticket number);
``customer``: ``size`` x the customers rows to the left side as updates (-old, +new row
with a changed last name), so the batch probes the big side.

Each path starts from a reopened store (cold block cache, the OS page cache warm from
the copy), so both pay the same first-batch costs.  Writes ``recompute.json`` and
``recompute.md`` under ``--out`` and prints the markdown.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import joinstate
import population
from bench import tpcds
from bench.live import CUSTOMER_COLUMNS, JOIN, SALES_COLUMNS, _git, _join, _weighted
from joinstate.testing import consolidate
from planner.batch import decide_batch, record_batch
from planner.rules.recompute import Observation
from population.apply import ApplyStrategy, apply_batch

__all__ = ["KINDS", "SIZES", "run", "to_markdown"]

SIZES = (0.0001, 0.001, 0.01, 0.1)
KINDS = ("sales", "customer")
SIDE = {"sales": "right", "customer": "left"}
PATHS: tuple[ApplyStrategy, ...] = ("incremental", "recompute")
TIE = 0.10
"""Times within this fraction of each other are a tie: either choice is right (run-to-run
noise on the shared 2-core VM is 20-40% for single batches)."""


# ---- batches ---------------------------------------------------------------------------


def sales_batch(sales: pa.Table, share: float, rng: np.random.Generator) -> pa.Table:
    """``share`` x the sales rows: half deletes of stored rows, half inserts of new rows."""
    n = max(2, round(share * sales.num_rows))
    picked = rng.choice(sales.num_rows, n, replace=False)
    gone = sales.take(pa.array(picked[: n // 2]))
    new = sales.take(pa.array(picked[n // 2:]))
    ticket = new.schema.get_field_index("ss_ticket_number")
    shifted = pc.add(new.column(ticket), pa.scalar(10**9, new.schema.field(ticket).type))
    new = new.set_column(ticket, new.schema.field(ticket), shifted)
    return pa.concat_tables([_weighted(gone, -1), _weighted(new, 1)])


def customer_batch(customer: pa.Table, share: float, rng: np.random.Generator) -> pa.Table:
    """``share`` x the customer rows as updates: -old row, +row with a new last name."""
    n = max(1, round(share * customer.num_rows / 2))
    old = customer.take(pa.array(rng.choice(customer.num_rows, n, replace=False)))
    i = old.schema.get_field_index("c_last_name")
    renamed = pc.binary_join_element_wise(pc.fill_null(old.column(i), ""), pa.scalar("~1"), "")
    new = old.set_column(i, old.schema.field(i), renamed.cast(old.schema.field(i).type))
    return pa.concat_tables([_weighted(old, -1), _weighted(new, 1)])


# ---- stores ----------------------------------------------------------------------------


def copy_store(src: Path, dst: Path) -> None:
    """A copy of a closed store: SST files hard-linked (immutable), everything else copied."""
    shutil.rmtree(dst, ignore_errors=True)

    def link_or_copy(a: str, b: str) -> object:
        if a.endswith(".sst"):
            os.link(a, b)
            return b
        return shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def _sorted_zset(table: pa.Table) -> pa.Table:
    """A change set consolidated (rows summed by value, zeros dropped) and sorted."""
    g = consolidate(table)
    return g.sort_by([(c, "ascending") for c in g.column_names if c != "_weight"])


def counters(join: joinstate.Join) -> dict[str, tuple[int, int]]:
    """Rows and entries of each side."""
    return {s: (join.index(s).rows, join.index(s).entries) for s in ("left", "right")}


# ---- one measurement -------------------------------------------------------------------


def measure(base: Path, work: Path, kind: str, share: float, delta: pa.Table,
            history: dict[str, list[tuple[str, Observation]]], repeat: int,
            options: joinstate.StoreOptions) -> dict[str, Any]:
    """Apply ``delta`` both ways on fresh copies of ``base``; times, decisions, checks."""
    side = SIDE[kind]
    res: dict[str, Any] = {"kind": kind, "side": side, "share": share,
                           "batch_rows": delta.num_rows, "ms": {}, "ok": True}
    outputs: dict[str, pa.Table] = {}
    state: dict[str, Any] = {}
    for r in range(repeat):
        for strategy in PATHS:
            path = work / strategy
            copy_store(base, path)
            with joinstate.StateStore(path, options) as store:
                join = store.join(JOIN)
                if strategy == "recompute" and r == 0:
                    res["decision_default"] = decide_batch(join, side, delta).to_dict()
                    for done, obs in history.get(kind, []):
                        record_batch(join, side, done, obs.batch_rows, obs.scanned_rows, obs.ms,
                                     obs.scan_ms)
                    res["decision"] = decide_batch(join, side, delta).to_dict()
                rep = apply_batch(join, side, delta, strategy=strategy)
                res["ms"].setdefault(strategy, []).append(rep.ms)
                if strategy == "recompute":
                    res.setdefault("scan_ms", []).append(rep.phases["scan_ms"])
                if r == 0:
                    assert isinstance(rep.output, pa.Table)
                    outputs[strategy] = rep.output
                    state[strategy] = counters(join)
                    res.setdefault("scanned_rows", {})[strategy] = \
                        rep.decision.figures["scanned_rows"] if strategy == "recompute" else 0
            shutil.rmtree(path, ignore_errors=True)
    inc, rc = (statistics.median(res["ms"][s]) for s in ("incremental", "recompute"))
    res["incremental_ms"], res["recompute_ms"] = inc, rc
    res["recompute_scan_ms"] = statistics.median(res["scan_ms"])
    res["output_rows"] = outputs["incremental"].num_rows
    res["outputs_equal"] = _sorted_zset(outputs["incremental"]).equals(
        _sorted_zset(outputs["recompute"]))
    res["counters_equal"] = state["incremental"] == state["recompute"]
    res["ok"] = bool(res["outputs_equal"] and res["counters_equal"])
    res["faster"] = "recompute" if rc < inc else "incremental"
    res["tie"] = abs(rc / inc - 1.0) <= TIE
    for key in ("decision", "decision_default"):
        res[key + "_right"] = res[key]["choice"] == res["faster"] or res["tie"]
    history.setdefault(kind, []).extend([
        ("incremental", Observation(delta.num_rows, 0, inc)),
        ("recompute", Observation(delta.num_rows, int(res["scanned_rows"]["recompute"]), rc,
                                  res["recompute_scan_ms"]))])
    return res


def run(sf: float = 1.0, sizes: tuple[float, ...] = SIZES, kinds: tuple[str, ...] = KINDS,
        repeat: int = 1, seed: int = 0, out: Path | None = None,
        workdir: Path | None = None, cache_dir: Path | None = None,
        probes: tuple[str, ...] = ("auto",)) -> dict[str, Any]:
    """Populate once, measure every (probe mode, kind, size); write JSON + markdown.

    ``probes``: the ``StoreOptions.probe`` modes the copies are opened with (``auto``:
    the incremental path may keep the other side as an in-memory probe cache;
    ``point``: it reads RocksDB for every probe).
    """
    paths = tpcds.tables(sf, ["customer", "store_sales"],
                         {"customer": CUSTOMER_COLUMNS, "store_sales": SALES_COLUMNS},
                         cache_dir=cache_dir)
    customer = pq.read_table(paths["customer"])
    sales = pq.read_table(paths["store_sales"])
    tmp = Path(workdir or tempfile.mkdtemp(prefix="joinstate-recompute-"))
    base = tmp / "base"
    shutil.rmtree(base, ignore_errors=True)
    res: dict[str, Any] = {
        "suite": "recompute", "sf": sf, "sizes": list(sizes), "kinds": list(kinds),
        "repeat": repeat, "seed": seed, "probes": list(probes), "git": _git(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_start": list(os.getloadavg()), "cpus": os.cpu_count(),
        "customers": customer.num_rows, "sales": sales.num_rows,
    }
    try:
        with joinstate.StateStore(base) as store:
            join = _join(store, customer.schema, sales.schema)
            t0 = time.perf_counter()
            population.populate(join, left=str(paths["customer"]),
                                right=str(paths["store_sales"]), strategy="auto",
                                progress=False)
            res["populate_s"] = time.perf_counter() - t0
        res["rows"] = []
        for probe in probes:
            rng = np.random.default_rng(seed)  # the same batches in every probe mode
            options = joinstate.StoreOptions(probe=probe)  # type: ignore[arg-type]
            history: dict[str, list[tuple[str, Observation]]] = {}
            for kind in kinds:
                for share in sorted(sizes):
                    delta = (sales_batch(sales, share, rng) if kind == "sales"
                             else customer_batch(customer, share, rng))
                    row = measure(base, tmp, kind, share, delta, history, repeat, options)
                    res["rows"].append({"probe": probe, **row})
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["load_average_end"] = list(os.getloadavg())
    res["ok"] = all(r["ok"] for r in res["rows"])
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "recompute.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "recompute.md").write_text(to_markdown(res) + "\n")
    return res


# ---- report ----------------------------------------------------------------------------


def to_markdown(res: dict[str, Any]) -> str:
    """The table: both times, the ratio, the rule's estimates and choice, checks."""
    g = res["git"]
    md = [f"# incremental vs recompute per change batch: TPC-DS SF{res['sf']:g} "
          "customer ⋈ store_sales", "",
          f"{res['customers']:,} customers x {res['sales']:,} sales; population "
          f"{res['populate_s']:.1f} s; median of {res['repeat']} run(s) per path, each on a "
          f"fresh copy of the populated store; seed {res['seed']}; {res['started']}; commit "
          f"`{g['head']}`" + (f" (uncommitted: {', '.join(g['dirty'])})" if g["dirty"] else "")
          + f"; load average {res['load_average_start'][0]:.1f} -> "
          f"{res['load_average_end'][0]:.1f} ({res['cpus']} CPUs)", "",
          "| probe | kind | size | batch rows | output rows | incremental ms | recompute ms "
          "(of which scans) | "
          "recompute / incremental | faster | rule est. inc / rc ms (defaults) | choice "
          "(defaults) | rule est. inc / rc ms (measured) | choice (measured) | choice was "
          "the faster | outputs & counters equal |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        d, dd = r["decision"], r["decision_default"]
        fd, fdd = d["figures"], dd["figures"]
        md.append(
            f"| {r['probe']} | {r['kind']} ({r['side']}) | {r['share'] * 100:g}% | "
            f"{r['batch_rows']:,} | "
            f"{r['output_rows']:,} | {r['incremental_ms']:,.1f} | {r['recompute_ms']:,.1f} "
            f"({r['recompute_scan_ms']:,.1f}) | "
            f"{r['recompute_ms'] / r['incremental_ms']:.2f}x | {r['faster']} | "
            f"{fdd['incremental_ms']:,.1f} / {fdd['recompute_ms']:,.1f} | {dd['choice']} | "
            f"{fd['incremental_ms']:,.1f} / {fd['recompute_ms']:,.1f} | {d['choice']} | "
            f"{_verdict(r, 'decision')} | {'yes' if r['ok'] else '**no**'} |")
    n = len(res["rows"])
    right = sum(r["decision_right"] for r in res["rows"])
    right_default = sum(r["decision_default_right"] for r in res["rows"])
    ties = sum(r["tie"] for r in res["rows"])
    md += ["", f"The rule chose the faster path (or one within {TIE:.0%} of it: a tie) in "
           f"{right} of {n} batches with measured costs and {right_default} of {n} with the "
           f"defaults; {ties} of {n} were ties.", "", "Reasons (measured costs):", ""]
    md += [f"- probe {r['probe']}, {r['kind']} {r['share'] * 100:g}%: {r['decision']['reason']}"
           for r in res["rows"]]
    return "\n".join(md)


def _verdict(r: dict[str, Any], key: str) -> str:
    if r[key]["choice"] == r["faster"]:
        return "yes"
    return f"yes (tie within {TIE:.0%})" if r["tie"] else "**no**"
