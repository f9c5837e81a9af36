"""The command's errors a person can act on: damaged inputs, bad weights, flags not API.

Each case is one line on stderr naming the file, column or flag at fault and what to do,
and leaves the state as the message says: nothing new when nothing was loaded, a
partial population that ``--resume`` finishes (or ``joinstate drop`` removes) otherwise.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runner import assert_one_line_error, run

import joinstate
from joinstate.testing import zset

if TYPE_CHECKING:
    from pathlib import Path

    from click.testing import Result

CUSTOMER = pa.schema([("c_customer_sk", pa.int64()), ("c_name", pa.string())])
SALES = pa.schema([("ss_customer_sk", pa.int64()), ("ss_net_paid", pa.float64())])
N_CUSTOMERS, N_SALES = 100, 600


def customers() -> pa.Table:
    ks = np.arange(N_CUSTOMERS)
    return pa.table({"c_customer_sk": ks, "c_name": [f"c{k}" for k in ks]}, schema=CUSTOMER)


def sales() -> pa.Table:
    return pa.table({"ss_customer_sk": np.arange(N_SALES) % 120,
                     "ss_net_paid": np.arange(N_SALES) * 1.0}, schema=SALES)


def corrupt_page(file: Path, row_group: int, column: int = 1) -> bytes:
    """Flip one byte of ``row_group``'s data page so that Snappy refuses to decode it.

    Returns the file's original bytes.  Which byte does it depends on the page header's
    length, so the first byte after the page's start that makes the decoder fail is kept.
    """
    original = file.read_bytes()
    start = pq.ParquetFile(file).metadata.row_group(row_group).column(column).data_page_offset
    for offset in range(start, start + 256):
        data = bytearray(original)
        data[offset] ^= 0xFF
        file.write_bytes(bytes(data))
        try:
            pq.ParquetFile(file).read_row_group(row_group)
        except OSError as exc:
            if "snappy" in str(exc).lower():
                return original
    file.write_bytes(original)
    raise AssertionError(f"no byte of {file}'s row group {row_group} upsets Snappy")


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """Left: one file of 100 rows; right: two files of 300 rows in row groups of 100."""
    (tmp_path / "customer").mkdir()
    pq.write_table(customers(), tmp_path / "customer" / "c.parquet", compression="snappy")
    right = tmp_path / "sales"
    right.mkdir()
    pq.write_table(sales().slice(0, 300), right / "part-0.parquet", row_group_size=100,
                   compression="snappy")
    pq.write_table(sales().slice(300), right / "part-1.parquet", row_group_size=100,
                   compression="snappy")
    return {"left": tmp_path / "customer" / "c.parquet", "right": right}


def populate(state: Path, inputs: dict[str, Path], *extra: Any, name: str = "sales"
             ) -> Result:
    return run("populate", state, name, "--left", inputs["left"], "--left-key",
               "c_customer_sk", "--right", inputs["right"], "--right-key", "ss_customer_sk",
               "--no-progress", *extra)


# ---- populate: a damaged input -----------------------------------------------------------


def test_damaged_page_before_anything_loads_leaves_no_new_store(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    corrupt_page(inputs["left"], 0)
    state = tmp_path / "state"
    out = assert_one_line_error(populate(state, inputs), 2, str(inputs["left"]),
                                "row group 0", "snappy", "nothing was loaded")
    assert "--left" in out, out
    assert not state.exists()


def test_debug_shows_the_traceback_of_the_read_error(tmp_path: Path,
                                                    inputs: dict[str, Path]) -> None:
    import population

    corrupt_page(inputs["left"], 0)
    result = populate(tmp_path / "state", inputs, "--debug")
    assert result.exit_code != 0 and result.exception is not None
    cause = result.exception.__cause__
    assert isinstance(cause, population.PopulationError), repr(result.exception)
    assert isinstance(cause.__cause__, OSError)  # Arrow's own error, kept as the cause
    assert not (tmp_path / "state").exists()


def test_damaged_page_in_an_existing_store_removes_only_the_new_join(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    state = tmp_path / "state"
    assert populate(state, inputs, name="good").exit_code == 0
    corrupt_page(inputs["left"], 0)
    assert_one_line_error(populate(state, inputs, name="other"), 2, "row group 0",
                          "nothing was loaded")
    with joinstate.StateStore(state, read_only=True) as st:
        assert st.joins() == ["good"]
        assert st.join("good").rows("right") == N_SALES


def test_damaged_page_after_a_partial_load_says_how_to_resume_or_drop(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    bad = inputs["right"] / "part-1.parquet"
    original = corrupt_page(bad, 1)
    state = tmp_path / "state"
    out = assert_one_line_error(populate(state, inputs, "--batch-rows", 50), 2, str(bad),
                                "row group 1", "snappy", "partial population", "--resume",
                                f"joinstate drop {state} sales")
    assert "populate(" not in out and "resume=True" not in out, out
    with joinstate.StateStore(state, read_only=True) as st:
        join = st.join("sales")
        assert join.phase == "population" and join.rows("left") == N_CUSTOMERS
        assert 0 < join.rows("right") < N_SALES
    bad.write_bytes(original)  # the file restored: the resumed run checks what was loaded
    done = populate(state, inputs, "--resume")
    assert done.exit_code == 0, done.output
    assert "resumed: " in done.output
    with joinstate.StateStore(state, read_only=True) as st:
        join = st.join("sales")
        assert join.phase == "live" and join.rows("right") == N_SALES
        assert zset(join.state("right")) == zset(sales())


def test_drop_removes_a_join_so_it_can_be_populated_again(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    bad = inputs["right"] / "part-1.parquet"
    original = corrupt_page(bad, 1)
    state = tmp_path / "state"
    assert populate(state, inputs, "--batch-rows", 50).exit_code == 2
    assert_one_line_error(run("drop", state, "sales"), 2, "--yes", "irreversibly")
    assert_one_line_error(run("drop", state, "nope", "--yes"), 2, "no join or pipeline",
                          "sales")
    dropped = run("drop", state, "sales", "--yes")
    assert dropped.exit_code == 0, dropped.output
    assert "dropped join sales" in dropped.output
    bad.write_bytes(original)
    again = populate(state, inputs)
    assert again.exit_code == 0, again.output
    with joinstate.StateStore(state, read_only=True) as st:
        assert st.join("sales").rows("right") == N_SALES


def test_drop_removes_a_pipeline_so_another_view_can_take_its_name(tmp_path: Path) -> None:
    from planner.sql import compile as compile_sql

    state = tmp_path / "state"
    with joinstate.StateStore(state) as st:
        p = compile_sql("SELECT ss_customer_sk, sum(ss_net_paid) AS paid FROM sales GROUP BY "
                        "ss_customer_sk", {"sales": SALES}, store=st, name="paid")
        p.push("sales", sales())
    with joinstate.StateStore(state) as st, pytest.raises(joinstate.JoinSpecMismatchError,
                                                          match="different view"):
        compile_sql("SELECT ss_customer_sk FROM sales", {"sales": SALES}, store=st, name="paid")
    dropped = run("drop", state, "paid", "--yes")
    assert dropped.exit_code == 0, dropped.output
    assert "dropped pipeline paid" in dropped.output
    with joinstate.StateStore(state) as st:
        p = compile_sql("SELECT ss_customer_sk FROM sales", {"sales": SALES}, store=st,
                        name="paid")
        assert p.read("paid").num_rows == 0


def test_damaged_footer_is_named_before_a_store_is_made(tmp_path: Path,
                                                        inputs: dict[str, Path]) -> None:
    part = inputs["right"] / "part-1.parquet"
    data = bytearray(part.read_bytes())
    data[-12:-8] = b"\xff\xff\xff\x7f"  # the footer length: past the start of the file
    part.write_bytes(bytes(data))
    state = tmp_path / "state"
    assert_one_line_error(populate(state, inputs), 2, str(part), "--right")
    assert not state.exists()


@pytest.mark.parametrize(("extra", "needles"), [
    (["--strategy", "fastest"], ["--strategy", "fastest", "asymmetric"]),
    (["--order", "random"], ["--order", "random", "small-first"]),
    (["--left-key", "nope"], ["--left-key", "nope", "c_customer_sk"]),
    (["--right-unique", "nope"], ["--right-unique", "nope"]),
])
def test_bad_flags_name_the_flag_and_leave_no_store(
        tmp_path: Path, inputs: dict[str, Path], extra: list[str], needles: list[str]) -> None:
    state = tmp_path / "state"
    out = assert_one_line_error(populate(state, inputs, *extra), 2, *needles)
    assert "Side." not in out and "strategy=" not in out and "order=" not in out, out
    assert not state.exists()


# ---- populate: library messages in the command's terms -----------------------------------


def test_populate_messages_speak_in_flags(tmp_path: Path, inputs: dict[str, Path]) -> None:
    state = tmp_path / "state"
    bad = inputs["right"] / "part-1.parquet"
    original = corrupt_page(bad, 1)
    assert populate(state, inputs, "--batch-rows", 50).exit_code == 2
    bad.write_bytes(original)
    interrupted = assert_one_line_error(populate(state, inputs), 2, "interrupted population",
                                        "--resume", f"joinstate drop {state} sales")
    conflict = assert_one_line_error(
        populate(state, inputs, "--resume", "--batch-rows", 70, "--strategy", "symmetric"),
        2, "--batch-rows 70", "--strategy 'symmetric'", "--resume")
    pq.write_table(customers().slice(1), inputs["left"])
    changed = assert_one_line_error(populate(state, inputs, "--resume"), 2, "--left",
                                    "changed", f"joinstate drop {state} sales")
    for out in (interrupted, conflict, changed):
        for api in ("resume=True", "batch_rows=", "strategy=", "population.populate",
                    "store.drop_join", "join.push()"):
            assert api not in out, out
    pq.write_table(customers(), inputs["left"])
    assert populate(state, inputs, "--resume").exit_code == 0
    live = assert_one_line_error(populate(state, inputs), 2, "already live",
                                 "joinstate apply", f"joinstate drop {state} sales")
    assert "join.push()" not in live


def test_plan_messages_speak_in_flags(inputs: dict[str, Path]) -> None:
    src = f"customer={inputs['left']}"
    unknown = assert_one_line_error(run("plan", "--sql", "SELECT * FROM nope", "--source",
                                        src), 2, "nope", "--source")
    assert "`sources`" not in unknown
    unique = assert_one_line_error(run("plan", "--sql", "SELECT * FROM customer", "--source",
                                       src, "--unique", "customer=zz"), 2, "--unique", "zz")
    assert "Source(" not in unique


# ---- apply: weights ----------------------------------------------------------------------


@pytest.fixture
def live(tmp_path: Path, inputs: dict[str, Path]) -> Path:
    state = tmp_path / "live"
    assert populate(state, inputs).exit_code == 0
    return state


@pytest.mark.parametrize(("weights", "needles"), [
    (pa.array([1, None], pa.int64()), ["NULL", "row 1"]),
    (pa.array([1, 2**63 + 5], pa.uint64()), ["uint64", "int64"]),
    (pa.array([1.0, -1.0], pa.float64()), ["double", "int64"]),
])
def test_apply_with_a_bad_weight_is_one_line_without_warnings(
        live: Path, tmp_path: Path, weights: pa.Array, needles: list[str]) -> None:
    changes = tmp_path / "changes.parquet"
    pq.write_table(pa.table({"c_customer_sk": [1, 2], "c_name": ["a", "b"],
                             "_weight": weights}), changes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run("apply", live, "sales", "left", changes)
    assert not caught, [str(w.message) for w in caught]
    out = assert_one_line_error(result, 2, "'_weight'", str(changes), *needles)
    assert "cast" in out or "fill" in out, out  # the remedy
    with joinstate.StateStore(live, read_only=True) as st:
        assert st.join("sales").rows("left") == N_CUSTOMERS  # nothing applied


# ---- the population library underneath ----------------------------------------------------


def test_library_populate_from_a_damaged_parquet_path_names_file_and_row_group(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    import population

    bad = inputs["right"] / "part-1.parquet"
    corrupt_page(bad, 2)
    with joinstate.StateStore(tmp_path / "state") as st:
        join = st.join("j", left=joinstate.Side(CUSTOMER, key=["c_customer_sk"]),
                       right=joinstate.Side(SALES, key=["ss_customer_sk"]))
        with pytest.raises(population.PopulationError,
                           match=r"right: cannot read .*part-1\.parquet \(row group 2 of 3"):
            population.populate(join, str(inputs["left"]), str(bad), progress=False,
                                batch_rows=50)
        assert population.interrupted(join)["right"].rows == 200  # row groups 0 and 1

        def broken() -> Any:
            yield customers().to_batches()[0]
            raise OSError("connection reset by peer")

        other = st.join("k", left=joinstate.Side(CUSTOMER, key=["c_customer_sk"]),
                        right=joinstate.Side(SALES, key=["ss_customer_sk"]))
        with pytest.raises(population.PopulationError,
                           match=r"left: reading the input failed after 100 rows: connection"):
            population.populate(other, broken(), sales(), progress=False, order="as-given")


def test_apply_messages_speak_in_flags(live: Path, tmp_path: Path) -> None:
    changes = tmp_path / "c.parquet"
    pq.write_table(customers().slice(0, 1), changes)
    out = assert_one_line_error(run("apply", live, "sales", "left", changes, "--commit-id", ""),
                                2, "--commit-id ''")
    assert "commit_id=" not in out


def test_apply_into_a_population_in_progress_is_refused(tmp_path: Path,
                                                        inputs: dict[str, Path]) -> None:
    corrupt_page(inputs["right"] / "part-1.parquet", 1)
    state = tmp_path / "state"
    assert populate(state, inputs, "--batch-rows", 50).exit_code == 2
    with joinstate.StateStore(state, read_only=True) as st:
        before = st.join("sales").rows("left")
    changes = tmp_path / "c.parquet"
    pq.write_table(pa.table({"c_customer_sk": [1000], "c_name": ["new"]}), changes)
    assert_one_line_error(run("apply", state, "sales", "left", changes), 2,
                          "population in progress", "--resume", f"joinstate drop {state} sales")
    with joinstate.StateStore(state, read_only=True) as st:
        assert st.join("sales").rows("left") == before
