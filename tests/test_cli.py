"""The ``joinstate`` command: every subcommand on small inputs, and its failure modes.

Errors must be one line (``error: ...``) with a non-zero exit status and no traceback;
``verify`` exits 0 consistent / 1 corrupted / 2 other errors.  Run in-process through
click's CliRunner (plus one subprocess for the installed console script).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runner import assert_one_line_error, run
from faults import flip_bytes, sst_files

import joinstate
from bench.cli import main
from joinstate.testing import zset

N_CUSTOMERS = 100
N_SALES = 600

CUSTOMER = pa.schema([("c_customer_sk", pa.int64()), ("c_name", pa.string())])
SALES = pa.schema([("ss_customer_sk", pa.int32()), ("ss_net_paid", pa.float64())])
LEFT = joinstate.Side(CUSTOMER, key=["c_customer_sk"], unique_key=["c_customer_sk"])
RIGHT = joinstate.Side(SALES, key=["ss_customer_sk"])


def customers() -> pa.Table:
    ks = list(range(N_CUSTOMERS))
    return pa.table({"c_customer_sk": ks, "c_name": [f"c{k}" for k in ks]}, schema=CUSTOMER)


def sales() -> pa.Table:
    return pa.table({
        "ss_customer_sk": pa.array([i % 120 for i in range(N_SALES)], pa.int32()),
        "ss_net_paid": [float(i) for i in range(N_SALES)],
    }, schema=SALES)


def expected_join() -> Counter[tuple[Any, ...]]:
    names = dict(zip(customers()["c_customer_sk"].to_pylist(),
                     customers()["c_name"].to_pylist(), strict=True))
    return Counter(
        (k, names[k], k, paid)
        for k, paid in zip(sales()["ss_customer_sk"].to_pylist(),
                           sales()["ss_net_paid"].to_pylist(), strict=True)
        if k in names
    )


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """Left: one file reached by a glob; right: a Spark-like directory of two parts."""
    left_dir = tmp_path / "customer"
    left_dir.mkdir()
    pq.write_table(customers(), left_dir / "customer-0.parquet")
    right_dir = tmp_path / "store_sales"
    right_dir.mkdir()
    s = sales()
    pq.write_table(s.slice(0, 250), right_dir / "part-00000.parquet")
    pq.write_table(s.slice(250), right_dir / "part-00001.parquet")
    (right_dir / "_SUCCESS").write_text("")
    return {"left": left_dir / "*.parquet", "right": right_dir}


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A live store with the join 'sales' populated through the library."""
    path = tmp_path / "state"
    with joinstate.StateStore(path) as st:
        join = st.join("sales", left=LEFT, right=RIGHT)
        join.push("left", customers())
        join.push("right", sales(), commit_id="initial")
        join.set_phase("live")
    return path


# ---- help and entry points -----------------------------------------------------------


def test_help_lists_commands_with_examples() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for word in ("inspect", "verify", "apply", "populate", "Examples", "--debug"):
        assert word in result.output
    for command in ("inspect", "verify", "apply", "populate"):
        sub = run(command, "--help")
        assert sub.exit_code == 0, sub.output
        assert "Examples" in sub.output and f"joinstate {command}" in sub.output


def test_console_script_is_installed_and_cli_imports_no_optional_dependency() -> None:
    script = Path(sys.executable).parent / "joinstate"
    assert script.exists(), "reinstall: pip install -e ."
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and joinstate.__version__ in done.stdout
    probe = ("import sys, bench.cli; bad = [m for m in ('pyspark', 'spark_io', 'duckdb', "
             "'matplotlib') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_main_returns_the_exit_status(tmp_path: Path) -> None:
    assert main(["verify", str(tmp_path / "missing")]) == 2
    assert main(["--help"]) == 0


# ---- populate ------------------------------------------------------------------------


def test_populate_from_globs_and_directories(tmp_path: Path, inputs: dict[str, Path]) -> None:
    out_dir = tmp_path / "out"
    report = tmp_path / "report.json"
    result = run(
        "populate", tmp_path / "state", "sales",
        "--left", inputs["left"], "--left-key", "c_customer_sk",
        "--left-unique", "c_customer_sk",
        "--right", inputs["right"], "--right-key", "ss_customer_sk",
        "--batch-rows", 200, "--output", out_dir, "--report", report,
    )
    assert result.exit_code == 0, result.output
    assert "populated" in result.output and "strategy" in result.output
    files = sorted(out_dir.glob("part-*.parquet"))
    assert files and f"{len(files)} Parquet file(s)" in result.output
    assert zset(pq.read_table(out_dir)) == expected_join()
    rep = json.loads(report.read_text())
    assert rep["sides"]["left"]["rows"] == N_CUSTOMERS
    assert rep["sides"]["right"]["rows"] == N_SALES
    with joinstate.StateStore(tmp_path / "state", read_only=True) as st:
        join = st.join("sales")
        assert join.phase == "live"
        assert join.rows("right") == N_SALES
    again = run("populate", tmp_path / "state", "sales", "--left", inputs["left"],
                "--left-key", "c_customer_sk", "--left-unique", "c_customer_sk",
                "--right", inputs["right"], "--right-key", "ss_customer_sk")
    assert_one_line_error(again, 2, "already live")


def test_populate_writes_change_rows_with_cdf(tmp_path: Path, inputs: dict[str, Path]
                                              ) -> None:
    out_dir = tmp_path / "out"
    result = run("populate", tmp_path / "state", "j", "--left", inputs["left"],
                 "--left-key", "c_customer_sk", "--right", inputs["right"],
                 "--right-key", "ss_customer_sk", "--how", "left", "--strategy",
                 "symmetric", "--output", out_dir, "--cdf", "--no-progress")
    assert result.exit_code == 0, result.output
    out = pq.read_table(out_dir)
    # a left join: a customer loaded before its sales is emitted NULL-extended, then
    # deleted when its first sale arrives; the net change is the join
    assert set(out.column("_change_type").to_pylist()) <= {"insert", "delete"}
    assert zset(joinstate.from_changes(out)) == expected_join()


def test_populate_resumes_an_interrupted_population(tmp_path: Path, inputs: dict[str, Path]
                                                     ) -> None:
    import pyarrow.dataset as ds

    import population

    state = tmp_path / "state"
    data = {"left": ds.dataset(sorted(map(str, inputs["left"].parent.glob("*.parquet")))),
            "right": ds.dataset(inputs["right"])}
    delivered: list[int] = []

    def failing_sink(out: pa.Table) -> None:
        delivered.append(out.num_rows)
        if len(delivered) == 2:
            raise RuntimeError("killed")

    with joinstate.StateStore(state) as st:
        join = st.join("sales", left=joinstate.Side(data["left"].schema, key=["c_customer_sk"]),
                       right=joinstate.Side(data["right"].schema, key=["ss_customer_sk"]))
        with pytest.raises(RuntimeError, match="killed"):
            population.populate(join, data["left"].to_batches(batch_size=100),
                                data["right"].to_batches(batch_size=100), sink=failing_sink,
                                progress=False, batch_rows=100)
    args = ["populate", state, "sales", "--left", inputs["left"], "--left-key", "c_customer_sk",
            "--right", inputs["right"], "--right-key", "ss_customer_sk"]
    assert_one_line_error(run(*args), 2, "interrupted population", "--resume")
    result = run(*args, "--resume")  # cuts the inputs in batches of 100, as recorded
    assert result.exit_code == 0, result.output
    assert "resumed: " in result.output
    with joinstate.StateStore(state, read_only=True) as st:
        join = st.join("sales")
        assert join.phase == "live" and join.rows("right") == N_SALES
        assert zset(join.state("left")) == zset(customers())


@pytest.mark.parametrize(("args", "needles"), [
    (["--left-key", "nope"], ["nope"]),
    (["--how", "sideways"], ["--how", "--help"]),
    (["--strategy", "fastest"], ["fastest"]),
])
def test_populate_bad_arguments(tmp_path: Path, inputs: dict[str, Path], args: list[str],
                                needles: list[str]) -> None:
    base = {"--left": inputs["left"], "--left-key": "c_customer_sk",
            "--right": inputs["right"], "--right-key": "ss_customer_sk"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    assert_one_line_error(run("populate", tmp_path / "state", "j", *flat), 2, *needles)


def test_populate_missing_input(tmp_path: Path) -> None:
    result = run("populate", tmp_path / "state", "j", "--left", tmp_path / "none.parquet",
                 "--left-key", "k", "--right", tmp_path / "x*.parquet", "--right-key", "k")
    assert_one_line_error(result, 2, "--left", "does not exist")
    missing_flag = run("populate", tmp_path / "state", "j", "--left", "a")
    assert_one_line_error(missing_flag, 2, "Missing option")


# ---- inspect -------------------------------------------------------------------------


def test_inspect_human_and_json(store: Path) -> None:
    result = run("inspect", store)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "join sales (inner, phase live)" in out
    assert "key" in out and "bag" in out and "auto-compaction" in out
    assert "recorded commit ids: 1" in out
    data = json.loads(run("inspect", store, "--json").output)
    (only,) = data["stores"]
    assert only["shard"] is None
    (j,) = only["joins"]
    assert j["name"] == "sales" and j["phase"] == "live" and j["commit_ids"] == 1
    assert j["population_progress"] == {"left": None, "right": None}
    assert j["sides"]["left"]["rows"] == N_CUSTOMERS
    assert j["sides"]["left"]["distinct_keys"] == N_CUSTOMERS
    assert j["sides"]["right"]["rows"] == N_SALES
    assert j["sides"]["right"]["distinct_keys"] == 120
    assert j["sides"]["right"]["layout"] == "bag"
    assert j["sides"]["right"]["auto_compaction"] == "on"
    assert isinstance(j["sides"]["right"]["l0_files"], int)
    assert j["stats"]["right"]["rows"] == N_SALES  # the raw stats() dict rides along


def test_inspect_shows_an_interrupted_population(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with joinstate.StateStore(path) as st:
        join = st.join("j", left=LEFT, right=RIGHT)
        marker = json.dumps({"batches": 3, "rows": 300, "done": False}).encode()
        join.apply("left", join.prepare("left", customers()), progress=marker)
    result = run("inspect", path)
    assert result.exit_code == 0, result.output
    assert "phase population" in result.output
    assert "population progress: left 3 batches, 300 rows; right nothing loaded" in result.output


def test_stats_summary_is_readable(store: Path) -> None:
    with joinstate.StateStore(store, read_only=True) as st:
        text = joinstate.stats_summary(st.join("sales").stats())
    lines = text.splitlines()
    assert lines[0] == "join sales (inner, phase live)"
    assert lines[1].split()[:2] == ["side", "layout"]
    assert lines[2].split()[:3] == ["left", "key", f"{N_CUSTOMERS:,}"]
    assert lines[3].split()[:3] == ["right", "bag", f"{N_SALES:,}"]


def test_spark_state_directory_lists_every_shard(tmp_path: Path) -> None:
    for shard in range(2):
        with joinstate.StateStore(tmp_path / f"shard-{shard:05d}") as st:
            join = st.join("sales", left=LEFT, right=RIGHT)
            join.push("left", customers().slice(shard * 50, 50))
    (tmp_path / "_spark").mkdir()
    result = run("inspect", tmp_path)
    assert result.exit_code == 0, result.output
    assert "shard 0 " in result.output and "shard 1 " in result.output
    data = json.loads(run("inspect", tmp_path, "--json").output)
    assert [s["shard"] for s in data["stores"]] == [0, 1]
    assert [s["joins"][0]["sides"]["left"]["rows"] for s in data["stores"]] == [50, 50]
    verified = run("verify", tmp_path)
    assert verified.exit_code == 0 and "2 store(s)" in verified.output
    changes = tmp_path / "c.parquet"
    pq.write_table(customers().slice(0, 1), changes)
    assert_one_line_error(run("apply", tmp_path, "sales", "left", changes), 2,
                          "Spark state directory")


def test_inspect_errors(tmp_path: Path) -> None:
    assert_one_line_error(run("inspect", tmp_path / "missing"), 2, "no state store")
    (tmp_path / "notes.txt").write_text("hi")
    assert_one_line_error(run("inspect", tmp_path), 2, "not a joinstate state store")
    assert_one_line_error(run("inspect"), 2, "STATE_DIR")
    assert_one_line_error(run("inspect", tmp_path, "--yaml"), 2, "--yaml")
    assert_one_line_error(run("frobnicate"), 2, "frobnicate")


# ---- verify --------------------------------------------------------------------------


def test_verify_consistent(store: Path) -> None:
    result = run("verify", store)
    assert result.exit_code == 0, result.output
    assert f"join sales: left {N_CUSTOMERS:,} rows" in result.output
    assert "consistent: 1 join(s) in 1 store(s)" in result.output
    data = json.loads(run("verify", store, "--json").output)
    assert data["consistent"] is True
    assert data["stores"][0]["joins"]["sales"]["right"]["rows"] == N_SALES


def test_verify_corrupted_store_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "state"
    n = 20_000
    side = joinstate.Side(pa.schema([("k", pa.int64()), ("s", pa.string())]), key=["k"])
    with joinstate.StateStore(path) as st:
        join = st.join("big", left=side, right=RIGHT)
        join.push("left", pa.table({"k": np.arange(n),
                                    "s": [f"row {i:08d} " + "x" * 80 for i in range(n)]}))
        st.flush()
    big = [p for p in sst_files(path) if p.stat().st_size > 1 << 20]
    assert big, sst_files(path)
    for sst in big:
        flip_bytes(sst, 64)
    assert_one_line_error(run("verify", path), 1, "corrupt")


def test_verify_usage_errors_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(run("verify", tmp_path / "missing"), 2, "no state store")
    assert_one_line_error(run("verify"), 2, "STATE_DIR")


# ---- apply ---------------------------------------------------------------------------


def test_apply_weighted_changes(store: Path, tmp_path: Path) -> None:
    changes = tmp_path / "changes.parquet"
    pq.write_table(pa.table({"c_customer_sk": [1, 1], "c_name": ["c1", "C1"],
                             "_weight": [-1, 1]}), changes)
    out_path = tmp_path / "out" / "o.parquet"
    result = run("apply", store, "sales", "left", changes, "--output", out_path,
                 "--commit-id", "rename-1")
    assert result.exit_code == 0, result.output
    assert "applied 1 inserted and 1 deleted rows to the left side" in result.output
    out = pq.read_table(out_path)
    paid = [float(i) for i in range(N_SALES) if i % 120 == 1]
    assert zset(out) == Counter(
        {**{(1, "c1", 1, p): -1 for p in paid}, **{(1, "C1", 1, p): 1 for p in paid}}
    )
    again = run("apply", store, "sales", "left", changes, "--commit-id", "rename-1")
    assert again.exit_code == 0, again.output
    assert "already applied" in again.output
    with joinstate.StateStore(store, read_only=True) as st:
        names = st.join("sales").state("left")
    assert sorted(names.column("c_name").to_pylist()).count("C1") == 1


def test_apply_unweighted_and_change_rows(store: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"ss_customer_sk": pa.array([5], pa.int32()),
                             "ss_net_paid": [1.25]}), plain)
    result = run("apply", store, "sales", "right", plain)
    assert result.exit_code == 0, result.output
    assert "output: 1 rows (1 inserted, 0 deleted)" in result.output
    assert "c5" in result.output  # the preview table
    cdf = tmp_path / "cdf.parquet"
    pq.write_table(pa.table({"ss_customer_sk": pa.array([5, 5], pa.int32()),
                             "ss_net_paid": [1.25, 1.25],
                             "_change_type": ["delete", "delete"]}), cdf)
    over = run("apply", store, "sales", "right", cdf)
    assert_one_line_error(over, 2, "nothing")  # one stored copy, two deletes: refused
    pq.write_table(pa.table({"ss_customer_sk": pa.array([5], pa.int32()),
                             "ss_net_paid": [1.25], "_change_type": ["delete"]}), cdf)
    out_path = tmp_path / "o.parquet"
    result = run("apply", store, "sales", "right", cdf, "-o", out_path, "--cdf")
    assert result.exit_code == 0, result.output
    assert pq.read_table(out_path).to_pylist() == [{
        "c_customer_sk": 5, "c_name": "c5", "ss_customer_sk": 5, "ss_net_paid": 1.25,
        "_change_type": "delete"}]


def test_apply_errors(store: Path, tmp_path: Path) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(customers().slice(0, 1), changes)
    assert_one_line_error(run("apply", store, "nojoin", "left", changes), 2,
                          "'nojoin' does not exist", "sales")
    assert_one_line_error(run("apply", store, "sales", "middle", changes), 2, "middle")
    assert_one_line_error(run("apply", store, "sales", "right", changes), 2, "column")
    assert_one_line_error(run("apply", tmp_path / "none", "sales", "left", changes), 2,
                          "no state store")
    assert_one_line_error(run("apply", store, "sales", "left", tmp_path / "x.parquet"), 2,
                          "does not exist")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert_one_line_error(run("apply", store, "sales", "left", bad), 2, "bad.parquet")


def test_locked_store_inspects_read_only_and_refuses_apply(store: Path, tmp_path: Path
                                                           ) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(pa.table({"c_customer_sk": [1000], "c_name": ["new"]}), changes)
    with joinstate.StateStore(store) as held:
        held.join("sales").push("left", pa.table({"c_customer_sk": [999], "c_name": ["w"]}))
        result = run("inspect", store, "--json")
        assert result.exit_code == 0, result.output
        sides = json.loads(result.output)["stores"][0]["joins"][0]["sides"]
        assert sides["left"]["rows"] == N_CUSTOMERS + 1  # the writer's committed push
        assert run("verify", store).exit_code == 0
        assert_one_line_error(run("apply", store, "sales", "left", changes), 2,
                              "already open")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run("inspect", tmp_path / "missing", "--debug")
    assert isinstance(result.exception, joinstate.NotAStateStoreError)
