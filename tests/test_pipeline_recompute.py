"""A pipeline's recompute path, chosen per operator and per batch: same answers, same state.

``population.apply(pipeline, source, delta, strategy=...)`` runs a push with each join,
``join_all`` and window on the incremental path (reads by key) or the recompute path
(reads by whole-index scans), or lets the planner choose per operator.  Here:

* random pipelines (the generator of ``test_pipeline_random``: every join type, NULL keys,
  duplicates, deletes, unique keys, filtered legs of one stream) applied four ways on
  four stores (all incremental, all recompute, the planner's choice, and a random path
  per operator and push): every output checked against the oracle after every push, and
  the stores' column families equal byte for byte at the end (``__meta__`` aside, where
  the measured costs differ);
* a window pipeline (no oracle for windows here): the three ways give equal outputs and
  equal state;
* the planner picks recompute for a batch of half a table and incremental for a tiny
  one, and says so per operator in ``explain()``;
* a refused batch (an over-retraction) changes nothing on either path;
* kill -9 anywhere in a recompute (after a scan, around the commit, around the cost
  records) leaves the old state or the new one, committed exactly when new, and a retry
  with the same commit id gives push's output;
* unknown operators, unknown strategies and operators without a recompute path are
  refused by name.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pipeline_oracle import PipelineHarness
from test_pipeline_random import RandomPipeline

import joinstate
import population
from joinstate.names import META_CF
from joinstate.options import StoreOptions

WAYS = ("incremental", "recompute", "auto")


class _Applied:
    """A pipeline whose pushes go through ``population.apply`` with one strategy."""

    def __init__(self, pipeline: joinstate.Pipeline, strategy: str) -> None:
        self.pipeline = pipeline
        self.strategy = strategy
        self.reports: list[Any] = []
        """One per push (for ``"mixed"``: the choices drawn)."""
        self.outputs = pipeline.outputs

    def output_schema(self, name: str) -> pa.Schema:
        return self.pipeline.output_schema(name)

    def push(self, source: str, delta: pa.Table, *, commit_id: str | None = None
             ) -> dict[str, pa.Table]:
        if self.strategy == "mixed":  # each operator's path drawn at random, per push
            rng = random.Random(len(self.reports))
            choice = {label: rng.choice(("incremental", "recompute"))
                      for label in self.pipeline.recompute_candidates(source)}
            self.reports.append(choice)
            return self.pipeline.push(source, delta, commit_id=commit_id, strategies=choice)
        rep = population.apply_batch(self.pipeline, source, delta,
                                     strategy=self.strategy,  # type: ignore[arg-type]
                                     commit_id=commit_id)
        self.reports.append(rep)
        out = rep.output
        assert isinstance(out, dict)
        return out


def _families(store: joinstate.StateStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every column family's entries, ``__meta__`` aside (it holds measured costs)."""
    out = {}
    for name in sorted(store.column_families()):
        if name == META_CF:
            continue
        out[name] = list(store.cf(name).items())
    return out


def _push_all(harnesses: dict[str, PipelineHarness], source: str, entries: Any) -> None:
    """One push to every store: incremental's checked against the oracle, the others'
    outputs (each push's, consolidated) equal to incremental's."""
    want = harnesses["incremental"].push(source, entries)
    for w, h in harnesses.items():
        if w != "incremental":
            got = h.push(source, entries, check=False)
            assert got == want, f"strategy={w!r}: push to {source} gave {got}, not {want}"


def _run_all_ways(tmp_path: Path, seed: int, pushes: int = 6) -> dict[str, _Applied]:
    rp = RandomPipeline(seed)
    stores = {w: joinstate.StateStore(str(tmp_path / f"{w}{seed}"))
              for w in (*WAYS, "mixed")}
    try:
        harnesses = {}
        for w, store in stores.items():
            h = PipelineHarness(store, f"rc{seed}", rp.outputs,
                                context=f"seed {seed}, strategy {w}")
            h.pipeline = _Applied(h.pipeline, w)
            harnesses[w] = h
        rng = random.Random(seed * 104729 + 3)
        order = [n for n in rp.gens if n in harnesses["auto"].sources]
        steps: list[tuple[str, Any]] = []
        for src in order:
            steps.append((src, rp.gens[src].delta(rng, harnesses["auto"].inputs[src], 8,
                                                  inserts_only=True)))
            _push_all(harnesses, *steps[-1])
        for _ in range(pushes):
            src = rng.choice(order)
            _push_all(harnesses, src, rp.gens[src].delta(rng, harnesses["auto"].inputs[src], 5))
        states = {w: _families(s) for w, s in stores.items()}
        for w in ("recompute", "auto", "mixed"):
            assert states[w] == states["incremental"], (
                f"seed {seed}: the state after strategy={w!r} differs from incremental's")
        for h in harnesses.values():
            h.pipeline.pipeline.verify()
        return {w: h.pipeline for w, h in harnesses.items()}
    finally:
        for s in stores.values():
            s.close()


SEEDS = range(6)
SLOW_SEEDS = range(6, 60)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_pipelines_all_ways(tmp_path: Path, seed: int) -> None:
    _check_all_ways(tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_random_pipelines_all_ways_many(tmp_path: Path, seed: int) -> None:
    _check_all_ways(tmp_path, seed)


def _check_all_ways(tmp_path: Path, seed: int) -> None:
    applied = _run_all_ways(tmp_path, seed)
    rec = applied["recompute"]
    ran = {d.figures["operator"] for rep in rec.reports for d in rep.operators
           if d.choice == "recompute"}
    has_keyed = any(rec.pipeline.recompute_candidates(s) for s in rec.pipeline.sources)
    assert bool(ran) == has_keyed
    if has_keyed:  # the recompute path read by scans (not only from probe caches)
        assert any(rep.phases.get("scan_ms") for rep in rec.reports)


def test_random_pipelines_cover_joins_of_every_kind() -> None:
    """The seeds above recompute joins of every type and a join_all."""
    from pipeline_oracle import Join, JoinAll, topo

    hows: set[str] = set()
    join_all = False
    for seed in SEEDS:
        for n in topo(RandomPipeline(seed).outputs):
            if isinstance(n, Join):
                hows.add(n.how)
            join_all |= isinstance(n, JoinAll)
    assert join_all
    assert {"inner", "left", "full"} <= hows


# ---- windows ---------------------------------------------------------------------------

SALES = pa.schema([("id", pa.int64()), ("cust", pa.int64()), ("amount", pa.int64())])
CUST = pa.schema([("c_id", pa.int64()), ("region", pa.string())])


def window_graph() -> joinstate.Graph:
    sales = joinstate.source("sales", schema=SALES)
    cust = joinstate.source("cust", schema=CUST, unique_key=["c_id"])
    joined = sales.join(cust, on=("cust", "c_id"), how="left")
    ranked = joined.window("region", [("amount", "descending")], rk=("rank",),
                           total=("sum", "amount"))
    return joinstate.Graph().output("ranked", ranked).output("joined", joined)


def _sales(rng: np.random.Generator, n: int, start: int, w: int = 1) -> pa.Table:
    cust = rng.integers(0, 40, n).astype(object)
    cust[rng.random(n) < 0.05] = None  # NULL keys
    return pa.table({"id": np.arange(start, start + n), "cust": pa.array(cust, pa.int64()),
                     "amount": rng.integers(0, 50, n), "_weight": np.full(n, w)})


def _zset(table: pa.Table) -> Counter[tuple[Any, ...]]:
    c: Counter[tuple[Any, ...]] = Counter()
    cols = [n for n in table.column_names if n != "_weight"]
    for row in table.to_pylist():
        c[tuple(row[k] for k in cols)] += row["_weight"]
    return c


def test_window_three_ways(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    cust = pa.table({"c_id": np.arange(40), "region": [f"r{i % 5}" if i % 7 else None
                                                       for i in range(40)],
                     "_weight": np.ones(40, np.int64)})
    first = _sales(rng, 300, 0)
    dup = first.slice(0, 20)  # duplicates of held rows
    gone = first.slice(100, 50).set_column(3, "_weight", pa.array(np.full(50, -1)))
    moved = pa.concat_tables([  # a customer changes region: -old +new
        cust.slice(3, 2).set_column(2, "_weight", pa.array([-1, -1])),
        pa.table({"c_id": [3, 4], "region": ["r9", None], "_weight": [1, 1]})])
    steps = [("cust", cust), ("sales", first), ("sales", dup), ("sales", gone),
             ("cust", moved), ("sales", _sales(rng, 200, 1000))]
    got: dict[str, list[dict[str, Counter[tuple[Any, ...]]]]] = {}
    states = {}
    for way in WAYS:
        with joinstate.StateStore(str(tmp_path / way)) as store:
            p = joinstate.Pipeline(store, "w", window_graph())
            got[way] = []
            for src, delta in steps:
                rep = population.apply_batch(p, src, delta, strategy=way)  # type: ignore[arg-type]
                assert isinstance(rep.output, dict)
                got[way].append({k: _zset(v) for k, v in rep.output.items()})
                if way == "recompute":
                    assert {d.choice for d in rep.operators} == {"recompute"}
            p.verify()
            states[way] = _families(store)
    assert got["recompute"] == got["incremental"]
    assert got["auto"] == got["incremental"]
    assert any(sum(o["ranked"].values()) != 0 for o in got["incremental"])
    assert states["recompute"] == states["incremental"]
    assert states["auto"] == states["incremental"]


# ---- the planner's choice ---------------------------------------------------------------


def _join_pipeline(store: joinstate.StateStore) -> joinstate.Pipeline:
    sales = joinstate.source("sales", schema=SALES)
    cust = joinstate.source("cust", schema=CUST, unique_key=["c_id"])
    graph = joinstate.Graph().output("j", sales.join(cust, on=("cust", "c_id")))
    return joinstate.Pipeline(store, "pick", graph)


def test_planner_picks_recompute_for_half_a_table_incremental_for_a_sliver(
        tmp_path: Path) -> None:
    n = 20_000
    # point probes: no probe cache, so a recompute really scans (over a cached index both
    # paths probe memory and the planner keeps the incremental label; see
    # test_planner_batch_cached)
    with joinstate.StateStore(str(tmp_path / "db"), StoreOptions(probe="point")) as store:
        p = _join_pipeline(store)
        rng = np.random.default_rng(1)
        cust_ids = np.arange(n)
        p.push("sales", _sales(rng, n, 0).set_column(
            1, "cust", pa.array(rng.integers(0, n, n), pa.int64())))
        p.push("cust", pa.table({"c_id": cust_ids, "region": ["a"] * n,
                                 "_weight": np.ones(n, np.int64)}))
        h = n // 2  # half of the customers move: -old +new
        half = pa.table({"c_id": np.concatenate([cust_ids[:h], cust_ids[:h]]),
                         "region": ["a"] * h + ["x"] * h,
                         "_weight": np.concatenate([-np.ones(h, np.int64),
                                                    np.ones(h, np.int64)])})
        big = population.apply_batch(p, "cust", half)
        (d,) = big.operators
        assert d.choice == "recompute", big.explain()
        assert d.figures["operator"] in big.explain()
        assert "recompute" in big.explain()
        sliver = pa.table({"c_id": [n - 1, n - 1], "region": ["a", "y"], "_weight": [-1, 1]})
        small = population.apply_batch(p, "cust", sliver)
        (d,) = small.operators
        assert d.choice == "incremental", small.explain()
        assert "incremental" in small.explain()
        # both batches were measured and recorded for the next decisions
        from planner.batch import operator_runs
        label = str(d.figures["operator"])
        assert operator_runs(p, "cust", label, "recompute")[0]
        assert operator_runs(p, "cust", label, "incremental")[0]


# ---- refused batches and bad choices ----------------------------------------------------


@pytest.mark.parametrize("way", ["incremental", "recompute"])
def test_refused_batch_changes_nothing(tmp_path: Path, way: str) -> None:
    with joinstate.StateStore(str(tmp_path / "db")) as store:
        p = joinstate.Pipeline(store, "w", window_graph())
        rng = np.random.default_rng(3)
        cust = pa.table({"c_id": np.arange(40), "region": ["r"] * 40,
                         "_weight": np.ones(40, np.int64)})
        population.apply(p, "cust", cust, strategy=way)  # type: ignore[arg-type]
        sales = _sales(rng, 100, 0)
        population.apply(p, "sales", sales, strategy=way)  # type: ignore[arg-type]
        before = _families(store)
        over = pa.concat_tables([sales.slice(0, 5).set_column(
            3, "_weight", pa.array(np.full(5, -1))), pa.table({
                "id": [999], "cust": [1], "amount": [1], "_weight": [-1]})])
        with pytest.raises(joinstate.OverRetractionError):
            population.apply(p, "sales", over, strategy=way,  # type: ignore[arg-type]
                             commit_id="c1")
        assert _families(store) == before
        assert not p.committed("c1")
        p.verify()


def test_bad_choices_are_refused_by_name(tmp_path: Path) -> None:
    with joinstate.StateStore(str(tmp_path / "db")) as store:
        p = _join_pipeline(store)
        delta = pa.table({"c_id": [1], "region": ["x"], "_weight": [1]})
        with pytest.raises(joinstate.SchemaMismatchError, match="nope"):
            p.push("cust", delta, strategies={"nope": "recompute"})
        label = next(iter(p.recompute_candidates("cust")))
        with pytest.raises(joinstate.SchemaMismatchError, match="sideways"):
            p.push("cust", delta, strategies={label: "sideways"})
        with pytest.raises(joinstate.SchemaMismatchError, match="no recompute path"):
            p.push("cust", delta, strategies={"cust": "recompute"})
        assert sum(i.rows for i in p.indexes()) == 0
        with pytest.raises(population.PopulationError, match="strategy="):
            population.apply(p, "cust", delta, strategy="fast")  # type: ignore[arg-type]


def test_replayed_commit_records_nothing(tmp_path: Path) -> None:
    with joinstate.StateStore(str(tmp_path / "db")) as store:
        p = _join_pipeline(store)
        delta = pa.table({"c_id": [1], "region": ["x"], "_weight": [1]})
        first = population.apply_batch(p, "cust", delta, strategy="recompute", commit_id="a")
        again = population.apply_batch(p, "cust", delta, strategy="incremental",
                                       commit_id="a")
        assert again.replayed and not first.replayed
        assert isinstance(again.output, dict) and isinstance(first.output, dict)
        assert again.output["j"].equals(first.output["j"])
        from planner.batch import operator_runs
        label = next(iter(p.recompute_candidates("cust")))
        assert len(operator_runs(p, "cust", label, "recompute")[0]) == 1
        assert not operator_runs(p, "cust", label, "incremental")[0]


# ---- kill -9 ------------------------------------------------------------------------------

CHILD = Path(__file__).with_name("pipeline_recompute_crash_child.py")
CRASH_POINTS = [
    "scan", "write",
    *(pytest.param(p, marks=pytest.mark.slow)
      for p in ("commit-before", "commit", "record-before", "meta-put")),
]
"""Two points by default (a child process costs seconds); every point under ``slow``."""


def crash_batch() -> pa.Table:
    """40 deletes of loaded sales and 60 new ones (NULL keys among them)."""
    loaded = _sales(np.random.default_rng(5), 300, 0)
    gone = loaded.slice(100, 40).set_column(3, "_weight", pa.array(np.full(40, -1)))
    return pa.concat_tables([gone, _sales(np.random.default_rng(6), 60, 5000)])


def _load(store: joinstate.StateStore) -> joinstate.Pipeline:
    p = joinstate.Pipeline(store, "w", window_graph())
    p.push("cust", pa.table({"c_id": np.arange(40), "region": [f"r{i % 3}" for i in range(40)],
                             "_weight": np.ones(40, np.int64)}))
    p.push("sales", _sales(np.random.default_rng(5), 300, 0))
    return p


def zset_json(outs: dict[str, pa.Table]) -> dict[str, list[list[Any]]]:
    """Outputs as sorted ``[row..., weight]`` lists (JSON-able, order-free)."""
    return {name: sorted(([*k, w] for k, w in _zset(t).items() if w), key=repr)
            for name, t in outs.items()}


def _child(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], check=False,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def crash_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("crash-ref")
    with joinstate.StateStore(str(tmp / "base")) as store:
        _load(store)
        old = _families(store)
    shutil.copytree(tmp / "base", tmp / "pushed")
    with joinstate.StateStore(str(tmp / "pushed")) as store:
        p = joinstate.Pipeline(store, "w", window_graph())
        want = zset_json(p.push("sales", crash_batch()))
        new = _families(store)
    assert new != old
    shutil.copytree(tmp / "base", tmp / "menu")
    proc = _child({"path": str(tmp / "menu"), "kill": ["none", 0], "out": str(tmp / "o")})
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp / "o").read_text()) == want  # the recompute gives push's output
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"base": tmp / "base", "old": old, "new": new, "want": want, "counts": counts}


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_anywhere_in_a_recompute_leaves_old_or_new(
        tmp_path: Path, crash_reference: dict[str, Any], point: str) -> None:
    ref = crash_reference
    reached = ref["counts"].get(point, 0)
    assert reached, f"the uninterrupted run never reaches {point!r}: {ref['counts']}"
    n = random.Random(point).randint(1, reached)
    path = tmp_path / "state"
    shutil.copytree(ref["base"], path)
    proc = _child({"path": str(path), "kill": [point, n], "out": str(tmp_path / "o")})
    assert proc.returncode == -9, f"not killed at {point!r} #{n}: {proc.stdout}{proc.stderr}"
    assert not (tmp_path / "o").exists()
    with joinstate.StateStore(str(path)) as store:
        found = _families(store)
        assert found in (ref["old"], ref["new"]), "neither the old state nor the new one"
        p = joinstate.Pipeline(store, "w", window_graph())
        committed = p.committed("c1")
        assert committed == (found == ref["new"])
        # the push's commit is the first; the cost records are written after it
        after_push = point in ("write", "commit", "record-before", "meta-put") or (
            point == "commit-before" and n > 1)
        assert committed == after_push
        p.verify()
        rep = population.apply_batch(p, "sales", crash_batch(), strategy="recompute",
                                     commit_id="c1")
        assert rep.replayed == committed
        assert isinstance(rep.output, dict)
        assert zset_json(rep.output) == ref["want"]
        assert _families(store) == ref["new"]
        p.verify()
