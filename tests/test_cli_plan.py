"""``joinstate plan``: the planner's decisions for a SQL view or a join over Parquet data.

The figures the plan quotes come from the files (footers and a key sample), so the tests
write small Parquet inputs with known row counts and check that the decisions quote
them, that the view's pipeline is shown, and that bad arguments are one-line errors.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runner import assert_one_line_error, run

if TYPE_CHECKING:
    from pathlib import Path




@pytest.fixture
def data(tmp_path: Path) -> dict[str, Path]:
    customers = pa.table({"c_id": pa.array(range(500), pa.int64()),
                          "name": [f"n{i}" for i in range(500)]})
    sales = pa.table({"s_c": pa.array([i % 500 for i in range(20_000)], pa.int64()),
                      "amount": pa.array([i % 97 for i in range(20_000)], pa.int64())})
    paths = {"customers": tmp_path / "customers.parquet", "sales": tmp_path / "sales"}
    pq.write_table(customers, paths["customers"])
    paths["sales"].mkdir()
    pq.write_table(sales.slice(0, 12_000), paths["sales"] / "part-0.parquet")
    pq.write_table(sales.slice(12_000), paths["sales"] / "part-1.parquet")
    return paths


def test_plan_of_a_sql_view_shows_its_pipeline_and_decisions(data: dict[str, Path],
                                                             tmp_path: Path) -> None:
    sql = tmp_path / "v.sql"
    sql.write_text("SELECT name, sum(amount) AS total FROM customers JOIN sales "
                   "ON c_id = s_c GROUP BY name ORDER BY total DESC LIMIT 3")
    r = run("plan", "--sql", f"@{sql}", "--source", f"customers={data['customers']}",
            "--source", f"sales={data['sales']}", "--unique", "customers=c_id")
    assert r.exit_code == 0, r.output
    assert "pipeline 'view'" in r.output
    assert "index ix.view~customers[c_id]" in r.output
    # the order rule quotes the row counts read from the footers (dimension first)
    assert "customers -> sales" in r.output
    assert "500" in r.output and "20,000" in r.output
    j = run("plan", "--sql", f"@{sql}", "--source", f"customers={data['customers']}",
            "--source", f"sales={data['sales']}", "--unique", "customers=c_id", "--json")
    assert j.exit_code == 0, j.output
    plan = json.loads(j.output)
    topics = {d["topic"] for d in plan["decisions"]}
    assert {"order", "strategy", "layout", "small_side"} <= topics


def test_plan_of_a_join_picks_the_small_side_from_the_files(data: dict[str, Path]) -> None:
    r = run("plan", "--left", data["sales"], "--right", data["customers"],
            "--left-key", "s_c", "--right-key", "c_id", "--right-unique", "c_id", "--json")
    assert r.exit_code == 0, r.output
    decisions = json.loads(r.output)["decisions"]
    (small,) = [d for d in decisions if d["topic"] == "small_side"]
    assert small["choice"] == "right"
    assert small["figures"]["left_rows"] == 20_000
    assert small["figures"]["right_rows"] == 500


@pytest.mark.parametrize(("args", "needles"), [
    ((), ("--sql", "--left")),
    (("--sql", "select 1", "--left", "x"), ("either",)),
    (("--sql", "select * from t", "--source", "t"), ("NAME=PATH",)),
    (("--sql", "@/nonexistent/q.sql"), ("cannot read",)),
    (("--left", "a.parquet", "--right", "b.parquet"), ("--left-key",)),
])
def test_bad_plan_arguments_are_one_line_errors(args: tuple[str, ...],
                                                needles: tuple[str, ...]) -> None:
    assert_one_line_error(run("plan", *args), 2, *needles)


def test_sql_outside_the_subset_is_refused_quoting_it(data: dict[str, Path]) -> None:
    r = run("plan", "--sql", "SELECT name, lag(c_id) OVER (ORDER BY name) FROM customers",
            "--source", f"customers={data['customers']}")
    assert_one_line_error(r, 2, "LAG(c_id) OVER")


def test_unknown_unique_source_is_named(data: dict[str, Path]) -> None:
    r = run("plan", "--sql", "SELECT * FROM customers", "--source",
            f"customers={data['customers']}", "--unique", "nope=c_id")
    assert_one_line_error(r, 2, "'nope=c_id'")
