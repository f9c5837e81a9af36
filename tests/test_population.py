"""Population driver: every strategy and order gives the same state and output.

Differential: the output sum and ``join.state`` of each strategy x order are compared
with each other and with a from-scratch recomputation (``tests/oracle.py``), also after
a live phase with deletes.  Plus the report's bookkeeping, small-side detection, the
progress bar's graceful degradation and the CLI.
"""

from __future__ import annotations

import ast
import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from oracle import join_oracle, zset_add, zset_from_table

import joinstate
import population
from planner.context import PlannerSettings
from planner.history import read_history
from planner.plan import plan_join
from planner.stats import given
from population.progress import Progress
from population.strategy import PRESETS, from_plan

if TYPE_CHECKING:
    from collections import Counter

L_SCHEMA = pa.schema([("k", pa.int64()), ("id", pa.int64()), ("name", pa.string())])
R_SCHEMA = pa.schema([("rk", pa.int32()), ("v", pa.int64()), ("tag", pa.string())])
STRATEGIES = ["symmetric", "asymmetric", "bulk", "auto"]
ORDERS = ["small-first", "interleaved", "as-given"]


def make_data(seed: int, n_left: int = 300, n_right: int = 3000) -> tuple[pa.Table, pa.Table]:
    """A small dimension (unique ``id``) and a big fact with duplicates and NULL keys."""
    rng = random.Random(seed)
    left = pa.table({
        "k": [None if rng.random() < 0.03 else rng.randrange(250) for _ in range(n_left)],
        "id": list(range(n_left)),
        "name": [rng.choice(["a", "b", "c", None]) for _ in range(n_left)],
    }, schema=L_SCHEMA)
    right = pa.table({
        "rk": [None if rng.random() < 0.02 else rng.randrange(300) for _ in range(n_right)],
        "v": [rng.randrange(5) for _ in range(n_right)],
        "tag": [rng.choice(["x", "y"]) for _ in range(n_right)],
    }, schema=R_SCHEMA)
    return left, right


def sides() -> tuple[joinstate.Side, joinstate.Side]:
    return (joinstate.Side(L_SCHEMA, key=["k"], unique_key=["id"]),
            joinstate.Side(R_SCHEMA, key=["rk"]))


def oracle(left: Counter[Any], right: Counter[Any], how: str) -> Counter[Any]:
    return join_oracle(left, right, [0], [0], how, len(L_SCHEMA), len(R_SCHEMA))


def out_columns(join: joinstate.Join) -> list[str]:
    return [n for n in join.output_schema.names if n != "_weight"]


def populate_once(tmp_path: Any, strategy: Any, order: str, left: Any, right: Any,
                  how: str = "inner", **kw: Any) -> tuple[Counter[Any], Any, Any, Any]:
    """Populate a fresh store; return output Z-set, both states and the report."""
    outs: list[pa.Table] = []
    path = tmp_path / f"{getattr(strategy, 'name', strategy)}-{order}-{how}"
    with joinstate.StateStore(path) as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs, how=how)
        rep = population.populate(j, left=left, right=right, strategy=strategy, order=order,
                                  sink=outs.append, progress=False, **kw)
        cols = out_columns(j)
        out = zset_add(*(zset_from_table(t, cols) for t in outs))
        st_l = zset_from_table(j.state("left"), L_SCHEMA.names)
        st_r = zset_from_table(j.state("right"), R_SCHEMA.names)
        assert j.phase == "live"
    return out, st_l, st_r, rep


@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_strategies_equivalent_to_oracle(tmp_path: Any, how: str) -> None:
    left, right = make_data(1)
    lz, rz = zset_from_table(left, L_SCHEMA.names), zset_from_table(right, R_SCHEMA.names)
    expected = oracle(lz, rz, how)
    seen = []
    for strategy in STRATEGIES:
        for order in ORDERS:
            # right given as batches (unknown size): small side found by counting
            out, st_l, st_r, rep = populate_once(
                tmp_path, strategy, order, left, right.to_batches(max_chunksize=700), how,
                batch_rows=128)
            assert out == expected, (strategy, order)
            assert st_l == lz and st_r == rz, (strategy, order)
            assert rep.small_side == "left"
            seen.append(rep.strategy["name"])
    assert {"symmetric", "asymmetric", "bulk"} <= set(seen)


def test_bulk_runs_are_ingested_and_small_side_may_be_right(tmp_path: Any) -> None:
    """The small side on the right; the big left side is bulk-loaded in several runs."""
    left, right = make_data(2, n_left=300, n_right=4000)
    # swap roles: a bag-layout big side on the left, the unique small side on the right
    big = right.rename_columns(["k", "id", "name"]).cast(
        pa.schema([("k", pa.int64()), ("id", pa.int64()), ("name", pa.string())]))
    small = left.rename_columns(["rk", "v", "tag"]).cast(
        pa.schema([("rk", pa.int32()), ("v", pa.int64()), ("tag", pa.string())]))
    results = []
    for strategy in ["symmetric", population.Strategy.bulk_load().replace(bulk_run_rows=1000)]:
        outs: list[pa.Table] = []
        with joinstate.StateStore(tmp_path / str(len(results))) as store:
            j = store.join("j", left=joinstate.Side(big.schema, key=["k"]),
                           right=joinstate.Side(small.schema, key=["rk"], unique_key=["v"]))
            rep = population.populate(j, big, small, strategy=strategy, sink=outs.append,
                                      progress=False, batch_rows=256)
            assert rep.small_side == "right" and rep.small_side_from == "sizes"
            results.append((
                zset_add(*(zset_from_table(t, out_columns(j)) for t in outs)),
                zset_from_table(j.state("left"), big.schema.names),
                zset_from_table(j.state("right"), small.schema.names),
            ))
    assert results[0] == results[1]
    assert 0.9 * big.num_rows < rep.sides["left"].bulk_entries <= big.num_rows
    assert rep.sides["left"].sst_files >= 4  # ~4000 rows in runs of 1000 (plus nulls CF)
    assert rep.ingested_bytes > 0


def test_live_phase_after_each_strategy_matches_oracle(tmp_path: Any) -> None:
    """After population, live inserts and deletes on both sides keep matching the oracle."""
    left, right = make_data(3)
    rng = random.Random(7)
    base: Any = None
    for strategy in ["symmetric", "asymmetric", "bulk"]:
        outs: list[pa.Table] = []
        with joinstate.StateStore(tmp_path / strategy) as store:
            ls, rs = sides()
            j = store.join("j", left=ls, right=rs, how="full")
            population.populate(j, left, right, strategy=strategy, sink=outs.append,
                                 progress=False, batch_rows=500)
            lz = zset_from_table(left, L_SCHEMA.names)
            rz = zset_from_table(right, R_SCHEMA.names)
            out = zset_add(*(zset_from_table(t, out_columns(j)) for t in outs))
            rng.seed(11)
            for step in range(6):
                # delete some present right rows, insert new ones; update a left row
                present = [r for r, w in rz.items() for _ in range(w)]
                dels = rng.sample(present, 40)
                ins = [(rng.randrange(300), rng.randrange(5), "z") for _ in range(30)]
                delta = pa.table({
                    "rk": [r[0] for r in dels] + [r[0] for r in ins],
                    "v": [r[1] for r in dels] + [r[1] for r in ins],
                    "tag": [r[2] for r in dels] + [r[2] for r in ins],
                    "_weight": [-1] * len(dels) + [1] * len(ins),
                }, schema=R_SCHEMA.append(pa.field("_weight", pa.int64())))
                out = zset_add(out, zset_from_table(j.push("right", delta), out_columns(j)))
                rz = zset_add(rz, zset_from_table(delta, R_SCHEMA.names))
                old = rng.choice(sorted((r for r in lz), key=lambda r: r[1]))
                new = (rng.randrange(250), old[1], "u")
                ldelta = pa.table({
                    "k": [old[0], new[0]], "id": [old[1], new[1]], "name": [old[2], new[2]],
                    "_weight": [-1, 1],
                }, schema=L_SCHEMA.append(pa.field("_weight", pa.int64())))
                out = zset_add(out, zset_from_table(j.push("left", ldelta), out_columns(j)))
                lz = zset_add(lz, zset_from_table(ldelta, L_SCHEMA.names))
                assert out == oracle(lz, rz, "full"), (strategy, step)
            final = (out, zset_from_table(j.state("left"), L_SCHEMA.names),
                     zset_from_table(j.state("right"), R_SCHEMA.names))
            assert final[1] == lz and final[2] == rz
        if base is None:
            base = final
        assert final == base, strategy


def test_deletes_during_population_fall_back_and_match(tmp_path: Any) -> None:
    """A big side that retracts rows mid-load: bulk falls back; state still exact."""
    left, right = make_data(4, n_right=2000)
    w = pa.array([1] * right.num_rows, pa.int64())
    ins = right.append_column("_weight", w)
    dels = right.slice(0, 500).append_column("_weight", pa.array([-1] * 500, pa.int64()))
    batches = [*ins.to_batches(max_chunksize=400), *dels.to_batches(max_chunksize=250)]
    expected_r = zset_from_table(right.slice(500), R_SCHEMA.names)
    expected = oracle(zset_from_table(left, L_SCHEMA.names), expected_r, "inner")
    for strategy in ["symmetric", "asymmetric", "bulk"]:
        out, _, st_r, rep = populate_once(tmp_path, strategy, "small-first", left, batches)
        assert out == expected and st_r == expected_r, strategy
        assert rep.sides["right"].deletes == 500
        if strategy != "symmetric":
            # the guard (run beside every policy) re-enabled the big side on the deletes
            enables = [a for a in rep.actions if a["action"] == "enable"
                       and a["reason"].startswith("guard: ") and "deletes" in a["reason"]]
            assert enables, rep.actions


def test_report_fields_consistent(tmp_path: Any) -> None:
    left, right = make_data(5)
    outs: list[pa.Table] = []
    with joinstate.StateStore(tmp_path / "s") as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs)
        rep = population.populate(j, left, right, strategy="asymmetric", order="interleaved",
                                  sink=outs.append, progress=False, batch_rows=512)
        index_cfs = {j.index("left").column_family, j.index("right").column_family}
    assert rep.sides["left"].rows == left.num_rows
    assert rep.sides["right"].rows == right.num_rows
    assert rep.rows == left.num_rows + right.num_rows
    assert rep.sides["right"].batches == -(-right.num_rows // 512)
    assert rep.output_rows == sum(t.num_rows for t in outs)
    assert rep.output_weight == sum(sum(t.column("_weight").to_pylist()) for t in outs)
    assert rep.sides["left"].finished_at is not None
    assert rep.sides["left"].finished_at <= rep.sides["right"].finished_at  # type: ignore[operator]
    assert rep.sides["left"].memtable == "hash_skip_list"
    assert rep.sides["right"].memtable == "skiplist"
    assert rep.wall_seconds > 0 and rep.state_bytes > 0 and rep.peak_rss >= rep.rss_start > 0
    assert rep.bytes_written >= rep.rocksdb["wal_bytes"] > 0
    assert rep.l0_samples and set(rep.l0_max) >= index_cfs
    assert {"compaction_read_bytes", "compaction_write_bytes", "stall_micros"} <= set(
        rep.rocksdb)
    assert rep.compaction_bytes == (rep.rocksdb["compaction_read_bytes"]
                                    + rep.rocksdb["compaction_write_bytes"])
    assert rep.compaction_seconds == rep.rocksdb["compaction_micros"] / 1e6
    assert rep.stall_seconds == rep.rocksdb["stall_micros"] / 1e6
    assert rep.phase == "live"
    d = json.loads(rep.to_json())
    assert d["rows"] == rep.rows and d["sides"]["left"]["rows"] == left.num_rows
    assert population.Report.from_dict(d) == rep
    assert "output" in rep.summary()


def test_small_side_from_strategy_sizes_or_counting(tmp_path: Any) -> None:
    left, right = make_data(6, n_left=200, n_right=1000)
    lb, rb = left.to_batches(max_chunksize=50), right.to_batches(max_chunksize=50)
    cases = [
        (population.Strategy.asymmetric().replace(small_side="right"), left, right, {},
         ("right", "strategy")),
        ("asymmetric", iter(lb), iter(rb), {"sizes": {"left": 5000, "right": 10}},
         ("right", "sizes")),
        ("asymmetric", iter(lb), iter(rb), {}, ("left", "counted")),
        ("asymmetric", left, right, {}, ("left", "sizes")),
    ]
    for i, (strategy, lsrc, rsrc, kw, want) in enumerate(cases):
        with joinstate.StateStore(tmp_path / str(i)) as store:
            ls, rs = sides()
            j = store.join("j", left=ls, right=rs)
            rep = population.populate(j, lsrc, rsrc, strategy=strategy, progress=False, **kw)
            assert (rep.small_side, rep.small_side_from) == want, i
            assert rep.sides["left"].rows == 200 and rep.sides["right"].rows == 1000
            # the report's plan says the same, and explains it
            assert rep.plan["decisions"][0]["topic"] == "small_side"
            assert f"small_side: {want[0]}" in rep.explain


def test_auto_asks_the_planner_and_explains_its_choice(tmp_path: Any) -> None:
    """``auto`` runs what the planner decides; the report carries the plan's reasons.

    The rules themselves are tested in tests/test_planner_rules.py.
    """
    left, right = make_data(7, n_left=100, n_right=1000)
    _, _, _, rep = populate_once(tmp_path, "auto", "small-first", left, right)
    # 1,000 rows is below the bulk threshold: Epsio's policy for a 10x asymmetry
    assert rep.strategy["name"] == "asymmetric" and "10x" in rep.reason
    assert rep.strategy["compaction"] == "epsio"
    assert rep.strategy["small_memtable"] == "hash_skip_list"
    assert "strategy: asymmetric" in rep.explain and "memtable: hash_skip_list" in rep.explain
    strategy = next(d for d in rep.plan["decisions"] if d["topic"] == "strategy")
    assert strategy["figures"]["ratio"] == 10.0 and strategy["rule"] == "strategy"
    # A fresh run records what it measured for the planner's next decision.
    left, right = make_data(7, n_left=500, n_right=6000)
    path = tmp_path / "bulk"
    with joinstate.StateStore(path) as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs)
        assert read_history(store, "j").empty
        rep = population.populate(j, left, right, strategy="auto", progress=False,
                                  batch_rows=512)
        assert rep.strategy["name"] == "asymmetric"  # 6,000 < the 100,000-row threshold
        hist = read_history(store, "j")
        assert set(hist.population) == {"asymmetric"}
        assert hist.population["asymmetric"].rows == 6500
        assert set(hist.push_us_per_row) == {"left", "right"}
    assert PlannerSettings().bulk_min_rows == 100_000


def test_a_fixed_preset_and_the_planners_choice_of_it_are_one_strategy() -> None:
    """Presets are built from the planner's tables, so ``auto`` picking X runs X."""
    for name in PRESETS:
        plan = plan_join(given("left", 10), given("right", 1000), strategy=name)
        got = from_plan(plan, "join")
        assert got.replace(reason="") == population.preset(name), name


def test_bad_arguments_name_the_culprit(tmp_path: Any) -> None:
    left, right = make_data(8, n_left=10, n_right=10)
    with joinstate.StateStore(tmp_path / "s") as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs)
        with pytest.raises(population.PopulationError, match="order="):
            population.populate(j, left, right, order="random")
        with pytest.raises(population.PopulationError, match="strategy='fast'"):
            population.populate(j, left, right, strategy="fast")
        with pytest.raises(population.PopulationError, match="right= must be"):
            population.populate(j, left, 42)
        with pytest.raises(population.PopulationError, match="l0_limit"):
            population.Strategy("x", l0_limit=0)
        with pytest.raises(population.PopulationError, match="sample_interval=-1"):
            population.populate(j, left, right, sample_interval=-1)
        population.populate(j, left, right, progress=False)
        with pytest.raises(population.PopulationError, match="already live"):
            population.populate(j, left, right)


def failing(batches: list[pa.RecordBatch], after: int) -> Any:
    for i, b in enumerate(batches):
        if i == after:
            raise RuntimeError("injected failure mid-population")
        yield b


@pytest.mark.parametrize("strategy", ["symmetric", "asymmetric", "bulk"])
@pytest.mark.parametrize("order", ["small-first", "interleaved"])
def test_exception_midway_then_resume_is_exact(tmp_path: Any, strategy: str, order: str
                                               ) -> None:
    """An exception in the middle leaves a known prefix; populate again refuses (no
    doubled bag rows, no misleading UniqueKeyViolationError); resume=True finishes it."""
    left, right = make_data(10, n_left=400, n_right=3000)
    lb, rb = left.to_batches(max_chunksize=100), right.to_batches(max_chunksize=200)
    expected = oracle(zset_from_table(left, L_SCHEMA.names),
                      zset_from_table(right, R_SCHEMA.names), "full")
    strat: Any = (population.Strategy.bulk_load().replace(bulk_run_rows=700)
                  if strategy == "bulk" else strategy)
    sizes = {"left": left.num_rows, "right": right.num_rows}
    outs: dict[tuple[str, int], pa.Table] = {}

    def sink(t: pa.Table, b: population.OutputBatch) -> None:
        outs[(b.side, b.index)] = t  # idempotent: a re-delivery replaces

    with joinstate.StateStore(tmp_path / "s") as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs, how="full")
        with pytest.raises(RuntimeError, match="injected"):
            population.populate(j, lb, failing(rb, 9), strategy=strat, order=order,
                                sink=sink, progress=False, sizes=sizes)
        found = population.interrupted(j)
        assert found["right"].batches <= 9 and found["left"].batches >= 1
        for again in (lambda: population.populate(j, lb, rb, progress=False),
                      lambda: population.populate(j, lb, rb, strategy=strat, order=order,
                                                  progress=False, sizes=sizes)):
            with pytest.raises(population.PopulationInterruptedError,
                               match=r"join 'j' .*interrupted population.*right side: "
                                     r"\d+ batches.*resume=True.*drop_join\('j'\)") as err:
                again()
            assert err.value.progress["right"]["batches"] == found["right"].batches
        rep = population.populate(j, lb, rb, sink=sink, progress=False, resume=True)
        assert rep.resumed == {s: m.summary() for s, m in found.items()}
        assert rep.redelivered == {s: found[s].batches for s in ("left", "right")}
        assert rep.strategy["name"] == strategy and rep.order == order
        assert rep.sides["right"].batches == len(rb) - found["right"].batches
        out = zset_add(*(zset_from_table(t, out_columns(j)) for t in outs.values()))
        assert out == expected
        assert zset_from_table(j.state("left"), L_SCHEMA.names) == zset_from_table(
            left, L_SCHEMA.names)
        assert zset_from_table(j.state("right"), R_SCHEMA.names) == zset_from_table(
            right, R_SCHEMA.names)
        assert j.phase == "live" and population.interrupted(j) == {}
        assert j.progress("left") is None and j.progress("right") is None
        store.verify()


def test_sides_loaded_in_separate_calls(tmp_path: Any) -> None:
    """go_live=False leaves both markers done (not an interruption); the next call
    clears them and starts afresh; going live clears them for good."""
    left, right = make_data(12)
    outs: list[pa.Table] = []
    with joinstate.StateStore(tmp_path / "s") as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs, how="full")
        population.populate(j, left, [], sink=outs.append, progress=False, go_live=False,
                            sizes={"left": 1, "right": 2})
        found = population.markers(j)
        assert population.completed(found) and population.interrupted(j) == {}
        assert found["left"].batches == 1 and found["right"].batches == 0
        assert j.phase == "population"
        population.populate(j, [], right, sink=outs.append, progress=False,
                            sizes={"left": 1, "right": 2})
        assert j.phase == "live" and population.markers(j) == {}
        out = zset_add(*(zset_from_table(t, out_columns(j)) for t in outs))
        assert out == oracle(zset_from_table(left, L_SCHEMA.names),
                             zset_from_table(right, R_SCHEMA.names), "full")


def test_sink_with_two_arguments_gets_the_batch(tmp_path: Any) -> None:
    left, right = make_data(11)
    got: list[population.OutputBatch] = []
    with joinstate.StateStore(tmp_path / "s") as store:
        ls, rs = sides()
        j = store.join("j", left=ls, right=rs, how="left")
        rep = population.populate(j, left, right, sink=lambda _t, b: got.append(b),
                                  progress=False, batch_rows=250)
    assert got[0] == population.OutputBatch("left", 0)  # null-extended customers
    right_batches = [b.index for b in got if b.side == "right"]
    assert right_batches == list(range(rep.sides["right"].batches))
    assert rep.resumed == {} and rep.redelivered == {}
    assert population.Report.from_dict(json.loads(rep.to_json())) == rep
    with pytest.raises(TypeError, match="wal"):
        population.Strategy("x", wal=False)  # type: ignore[call-arg]


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def __init__(self) -> None:
            self.written: list[str] = []

        def isatty(self) -> bool:
            return True

        def write(self, s: str) -> int:
            self.written.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    assert Progress(True, 10, "x").bar is None  # pytest's stderr is not a terminal
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.delenv("TERM", raising=False)
    bar = Progress(True, 10, "populate x")
    assert bar.bar is not None
    bar.update("left", 5)
    assert bar.bar.tasks[0].completed == 5 and bar.bar.tasks[0].fields["side"] == "left"
    bar.close()
    assert bar.bar is None
    assert "populate x" in "".join(tty.written)  # rich drew it on the terminal
    assert Progress(False, 10, "x").bar is None


def test_cli_populates_from_parquet_and_synthetic(tmp_path: Any, capsys: Any) -> None:
    import pyarrow.parquet as pq

    from population.__main__ import main

    left, right = make_data(9)
    pq.write_table(left, tmp_path / "l.parquet")
    pq.write_table(right, tmp_path / "r.parquet")
    rc = main([str(tmp_path / "state"), "--left", str(tmp_path / "l.parquet"),
               "--right", str(tmp_path / "r.parquet"), "--left-key", "k",
               "--left-unique", "id", "--right-key", "rk", "--strategy", "bulk",
               "--json", str(tmp_path / "r.json")])
    assert rc == 0
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["rows"] == left.num_rows + right.num_rows
    assert "output" in capsys.readouterr().out
    rc = main([str(tmp_path / "syn"), "--synthetic", "200,2000", "--order", "interleaved"])
    assert rc == 0
    assert main([str(tmp_path / "x"), "--left", str(tmp_path / "missing.parquet"),
                 "--right", str(tmp_path / "r.parquet"), "--left-key", "k",
                 "--right-key", "rk"]) == 2


def private_uses(path: Path) -> list[str]:
    """What ruff's SLF001 flags, plus imports of private core names: ``x._name`` on any
    object but ``self``/``cls``, ``import joinstate._mod``, ``from joinstate import _name``.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
            node.attr.startswith("__") and node.attr.endswith("__")
        ):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                      if any(part.startswith("_") for part in a.name.split(".")[1:])]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            private_module = any(p.startswith("_") for p in node.module.split(".")[1:])
            names = [a.name for a in node.names if a.name.startswith("_")]
            if top != path.parent.name and (private_module or names):
                found.append(f"{path.name}:{node.lineno}: from {node.module} import "
                             + ", ".join(a.name for a in node.names))
    return found


@pytest.mark.parametrize("package", ["population", "compaction"])
def test_only_public_names_of_other_packages(package: str) -> None:
    root = Path(__file__).resolve().parents[1] / package
    offenders = [u for p in sorted(root.rglob("*.py")) for u in private_uses(p)]
    assert offenders == []
