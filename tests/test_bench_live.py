"""The live-phase benchmark (bench/live.py) at a tiny scale, and the TPC-DS cache."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest

pytest.importorskip("duckdb")
pytest.importorskip("duckdb_extension_tpcds")

from bench import live, tpcds  # after the skips: the bench extra
from bench.cli import bench_main

if TYPE_CHECKING:
    from pathlib import Path

SF = 0.01
SIZES = (0.0001, 0.001, 0.01)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tpcds-sf0.01")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("live-out")
    res = live.run_live(SF, SIZES, repeat=2, out=out, point_pass=True, cache_dir=cache,
                        workdir=tmp_path_factory.mktemp("live-work"), recompute_runs=1)
    return res, out


def test_live_check_ran_and_passed(result: tuple[dict[str, Any], Path]) -> None:
    res, _ = result
    assert res["ok"] is True
    assert [p["name"] for p in res["passes"]] == ["auto", "point"]
    for p in res["passes"]:
        c = p["check"]
        assert c["ran"] and c["ok"] and c["mismatches"] == 0
        assert c["got_rows"] == c["want_rows"] > 0
        # population output + 3 pushes per batch, 2 batches, 3 sizes, twice (reopen)
        assert c["output_deltas"] >= 3 * 2 * 3 * 2


def test_live_figures_cover_every_size_and_kind(result: tuple[dict[str, Any], Path]) -> None:
    res, _ = result
    for p in res["passes"]:
        for group in (p["sizes"], p["reopen"]):
            assert [s["share"] for s in group] == list(SIZES)
            for s in group:
                assert set(s["kinds"]) == set(live.KINDS)
                for k in live.KINDS:
                    assert len(s["kinds"][k]["ms"]) == 2
                    assert s["kinds"][k]["out_rows_median"] >= 0
                assert s["kinds"]["delete"]["rows"] == s["sales_rows"]
                assert s["kinds"]["customer"]["rows"] == 2 * s["customers"]
                assert s["total"]["median_ms"] > 0
        assert not p["delete_rows_wrapped"]
    assert res["duckdb_recompute"]["rows"] == res["passes"][0]["check"]["want_rows"]


def test_live_writes_json_and_markdown(result: tuple[dict[str, Any], Path]) -> None:
    _, out = result
    data = json.loads((out / "live.json").read_text())
    assert data["sizes"] == list(SIZES) and data["ok"] is True
    md = (out / "live.md").read_text()
    for text in ("0.01%", "0.1%", "1%", "DuckDB recompute", "pass `point`", "**OK**"):
        assert text in md


def test_check_detects_a_lost_delta(cache: Path) -> None:
    """The check is not vacuous: dropping one output delta makes it fail."""
    paths = tpcds.tables(SF, ["customer", "store_sales"],
                         {"customer": live.CUSTOMER_COLUMNS, "store_sales": live.SALES_COLUMNS},
                         cache_dir=cache)
    customer, sales = pq.read_table(paths["customer"]), pq.read_table(paths["store_sales"])
    half = sales.slice(0, sales.num_rows // 2)
    import duckdb

    con = duckdb.connect()
    con.register("c", customer)
    con.register("s", half)
    joined = con.execute("SELECT c.*, s.*, 1::BIGINT AS _weight FROM c JOIN s "
                         "ON c_customer_sk = ss_customer_sk").to_arrow_table()
    con.close()
    assert live.check([joined], customer, half)["ok"]
    bad = live.check([joined.slice(1)], customer, half)
    assert not bad["ok"] and bad["missing_rows"] == 1


def test_main_exits_non_zero_when_the_check_fails(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = live.check
    monkeypatch.setattr(live, "check", lambda o, c, s: real(o[:-1], c, s))
    rc = bench_main(["live", "--sf", str(SF), "--sizes", "0.01", "--repeat", "1",
                     "--no-point-pass", "--out", str(tmp_path / "out"), "--cache-dir", str(cache)])
    assert rc == 1
    assert (tmp_path / "out" / "live.md").exists()


def test_tpcds_tables_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cols = {"customer": ["c_customer_sk", "c_last_name"]}
    first = tpcds.tables(SF, ["customer", "store_sales"], cols, cache_dir=tmp_path)
    assert pq.read_schema(first["customer"]).names == ["c_customer_sk", "c_last_name"]
    assert "ss_customer_sk" in pq.read_schema(first["store_sales"]).names  # whole table
    mtimes = {n: p.stat().st_mtime_ns for n, p in first.items()}

    def no_generation() -> None:
        raise AssertionError("tables() regenerated a cached table")

    monkeypatch.setattr(tpcds, "connect", no_generation)
    again = tpcds.tables(SF, ["customer", "store_sales"], cols, cache_dir=tmp_path)
    assert again == first
    assert {n: p.stat().st_mtime_ns for n, p in again.items()} == mtimes
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_tpcds_cache_root_from_environment(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tpcds.CACHE_ENV, str(tmp_path))
    assert tpcds.cache_root() == tmp_path


def test_tpcds_query_text() -> None:
    assert "store_sales" in tpcds.query(3).lower()
    with pytest.raises(ValueError, match="does not exist"):
        tpcds.query(100)
