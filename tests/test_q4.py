"""TPC-DS query 4 as a pipeline (bench/q4.py) against DuckDB, and the harness itself."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytest.importorskip("duckdb")
pytest.importorskip("duckdb_extension_tpcds")

import joinstate
from bench import q4  # after the skips: the bench extra
from joinstate.testing import consolidate

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

SF = 0.01


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tpcds-sf0.01")


@pytest.fixture(scope="module")
def tables(cache: Path) -> dict[str, pa.Table]:
    return q4.load(SF, cache)


def _rows(t: pa.Table) -> Counter[tuple[Any, ...]]:
    t = t.drop_columns([q4.WEIGHT]) if q4.WEIGHT in t.column_names else t
    return Counter(zip(*(t[c].to_pylist() for c in t.column_names), strict=True))


# ---- the reference --------------------------------------------------------------------


def test_reference_sql_is_the_shipped_text() -> None:
    year_total, answer, limited = q4.reference_sql()
    text = q4.tpcds.query(4)
    assert year_total.startswith("WITH year_total AS")
    assert year_total.rstrip().endswith("SELECT * FROM year_total")
    assert "LIMIT" not in answer and limited.endswith("LIMIT 100")
    assert answer in text and limited in text
    # the details build_q4 relies on
    assert "SELECT t_s_secyear.customer_id,\n       t_s_secyear.customer_first_name," in text
    assert "t_s_secyear.customer_preferred_cust_flag\nFROM" in text
    for leg, (sale_type, year, positive) in q4.LEGS.items():
        assert f"{leg}.sale_type = '{sale_type}'" in text
        assert f"{leg}.dyear = {'2001' if year == 2001 else '2001+1'}" in text
        assert (f"{leg}.year_total > 0\n" in text) is positive
    with pytest.raises(ValueError, match="LIMIT 100"):
        q4.reference_sql(text.replace("LIMIT 100", ""))


def test_load_has_the_fixed_schemas(tables: Mapping[str, pa.Table]) -> None:
    assert set(tables) == set(q4.TABLES)
    for n, t in tables.items():
        assert t.schema.equals(q4.SCHEMAS[n]) and t.num_rows > 0


def test_integrated_outputs() -> None:
    t = pa.table({"a": ["x", "x", None, None, "y"], "f": [1.5, 1.5, None, None, 2.0],
                  q4.WEIGHT: pa.array([1, 1, 1, -1, 1], pa.int64())})
    integ = q4.Integrated()
    integ.add({"o": t})
    integ.add({"o": t.slice(4).set_column(2, q4.WEIGHT, pa.array([-1], pa.int64()))})
    assert _rows(integ.state("o")) == Counter({("x", 1.5): 2})
    integ.add({"o": t.slice(4).set_column(2, q4.WEIGHT, pa.array([-1], pa.int64()))})
    with pytest.raises(ValueError, match="negative weight"):
        integ.state("o")


# ---- the batch generators -------------------------------------------------------------


def test_delete_batch_only_deletes_present_rows(tables: Mapping[str, pa.Table]) -> None:
    w = q4.Workload(tables, seed=1)
    for _ in range(3):
        for ch in q4.CHANNELS:
            before = w.tables[ch.table]
            d = w.deleted_sales(ch, 200)
            assert d.num_rows == 200 and pc.all(pc.equal(d[q4.WEIGHT], -1)).as_py()
            have, drop = _rows(before), _rows(d)
            assert not drop - have, "a delete batch deletes a row that is not there"
            w.apply(ch.table, d)
            assert w.tables[ch.table].num_rows == before.num_rows - 200
            assert _rows(w.tables[ch.table]) == have - drop


def test_apply_delta_refuses_absent_rows(tables: Mapping[str, pa.Table]) -> None:
    sales = tables["store_sales"]
    row = sales.slice(0, 1)
    absent = row.set_column(row.schema.get_field_index("ss_ext_list_price"),
                            row.schema.field("ss_ext_list_price"),
                            pa.array([Decimal("99999.99")], pa.decimal128(7, 2)))
    with pytest.raises(ValueError, match="absent"):
        q4.apply_delta(sales, q4.weighted(absent, -1), "ss_ticket_number")
    twice = pa.concat_tables([q4.weighted(row, -1)] * (_rows(sales)[next(iter(_rows(row)))] + 1))
    with pytest.raises(ValueError, match="absent"):
        q4.apply_delta(sales, twice, "ss_ticket_number")
    # -1 and +1 of the same row in one delta cancel out
    same = q4.apply_delta(sales, pa.concat_tables([q4.weighted(absent, -1),
                                                   q4.weighted(absent, 1)]), "ss_ticket_number")
    assert same.num_rows == sales.num_rows


def test_new_sales_are_new_rows_with_valid_keys(tables: Mapping[str, pa.Table]) -> None:
    w = q4.Workload(tables, seed=2)
    customers = set(tables["customer"]["c_customer_sk"].to_pylist())
    dates = set(tables["date_dim"]["d_date_sk"].to_pylist())
    for ch in q4.CHANNELS:
        numbers = set(w.tables[ch.table][ch.number_col].to_pylist())
        d = w.new_sales(ch, 100)
        assert d.num_rows == 100 and pc.all(pc.equal(d[q4.WEIGHT], 1)).as_py()
        new = d[ch.number_col].to_pylist()
        assert len(set(new)) == 100 and not set(new) & numbers
        assert set(d[ch.customer_col].drop_null().to_pylist()) <= customers
        assert set(d[ch.date_col].drop_null().to_pylist()) <= dates
        w.apply(ch.table, d)
        assert w.tables[ch.table].num_rows == tables[ch.table].num_rows + 100
        again = w.new_sales(ch, 100)[ch.number_col].to_pylist()
        assert not set(again) & set(new)


def test_customer_update_retracts_the_current_row(tables: Mapping[str, pa.Table]) -> None:
    w = q4.Workload(tables, seed=3)
    for _ in range(2):  # the second update retracts what the first inserted
        d = w.customer_update(10)
        old = d.filter(pc.equal(d[q4.WEIGHT], -1))
        new = d.filter(pc.equal(d[q4.WEIGHT], 1))
        assert old.num_rows == new.num_rows == 10
        assert not _rows(old) - _rows(w.tables["customer"])
        assert old["c_customer_sk"].to_pylist() == new["c_customer_sk"].to_pylist()
        assert old["c_customer_id"].to_pylist() == new["c_customer_id"].to_pylist()
        for c in ("c_first_name", "c_preferred_cust_flag", "c_email_address"):
            assert all(a != b for a, b in zip(old[c].to_pylist(), new[c].to_pylist(),
                                              strict=True))
        w.apply("customer", d)
        sks = w.tables["customer"]["c_customer_sk"]
        assert len(set(sks.to_pylist())) == sks.length() == tables["customer"].num_rows
    picked = w.customer_update(0, customer_sks=[1, 2])
    assert sorted(picked["c_customer_sk"].to_pylist()) == [1, 1, 2, 2]


def test_date_correction_swaps_2001_and_2002(tables: Mapping[str, pa.Table]) -> None:
    w = q4.Workload(tables, seed=4)
    for _ in range(3):
        d = w.date_correction()
        old = d.filter(pc.equal(d[q4.WEIGHT], -1)).to_pylist()
        new = d.filter(pc.equal(d[q4.WEIGHT], 1)).to_pylist()
        assert len(old) == len(new) == 1 and old[0]["d_date_sk"] == new[0]["d_date_sk"]
        assert {old[0]["d_year"], new[0]["d_year"]} == {2001, 2002}
        assert not _rows(pa.Table.from_pylist(old)) - _rows(w.tables["date_dim"])
        w.apply("date_dim", d)
    assert w.tables["date_dim"].num_rows == tables["date_dim"].num_rows


def test_batches_are_deterministic_and_proportional(tables: Mapping[str, pa.Table]) -> None:
    a, b = q4.Workload(tables, seed=5), q4.Workload(tables, seed=5)
    for kind in q4.KINDS:
        da, db = a.batch(kind, 0.01), b.batch(kind, 0.01)
        assert [s for s, _ in da] == [s for s, _ in db]
        assert all(x.equals(y) for (_, x), (_, y) in zip(da, db, strict=True))
    counts = a.sales_counts(0.01)
    total = sum(tables[ch.table].num_rows for ch in q4.CHANNELS)
    assert abs(sum(counts.values()) - 0.01 * total) <= 3
    assert counts["store_sales"] > counts["catalog_sales"] > counts["web_sales"] >= 1
    assert a.sales_counts(1e-9) == {ch.table: 1 for ch in q4.CHANNELS}
    assert a.customers(0.01) == round(0.01 * tables["customer"].num_rows)


def test_qualifying_sales_fill_the_answer(tables: Mapping[str, pa.Table]) -> None:
    w = q4.Workload(tables, seed=6)
    ref = q4.Reference()
    try:
        assert ref.answer(w.tables)[0].num_rows == 0  # SF0.01: empty without them
        deltas = w.qualifying_sales(4)
        assert [s for s, _ in deltas] == [ch.table for ch in q4.CHANNELS]
        assert [d.num_rows for _, d in deltas] == [8, 16, 8]
        for s, d in deltas:
            w.apply(s, d)
        assert ref.answer(w.tables)[0].num_rows == 4
    finally:
        ref.close()


# ---- the harness, with a stand-in pipeline (DuckDB recomputing each push) --------------


class Recompute:
    """A stand-in pipeline: both outputs recomputed by DuckDB, returned as differences."""

    def __init__(self, drop_q4_of: str | None = None) -> None:
        self.tables = {n: s.empty_table() for n, s in q4.SCHEMAS.items()}
        self.ref = q4.Reference()
        self.prev: dict[str, pa.Table] = {}
        self.drop_q4_of = drop_q4_of

    def warm(self) -> dict[str, float]:
        """Nothing is built lazily here."""
        return {}

    def push(self, source: str, delta: pa.Table) -> dict[str, pa.Table]:
        if q4.WEIGHT not in delta.column_names:
            delta = q4.weighted(delta, 1)
        self.tables[source] = q4.apply_delta(self.tables[source], delta, q4.LOCATOR[source])
        out = {}
        for name, fn in (("year_total", self.ref.year_total), ("q4", self.ref.answer)):
            new = fn(self.tables)[0]
            parts = [q4.weighted(new, 1)]
            if name in self.prev:
                parts.append(q4.weighted(self.prev[name], -1))
            out[name] = consolidate(pa.concat_tables(parts))
            if not (name == "q4" and source == self.drop_q4_of):
                self.prev[name] = new
            else:
                out[name] = out[name].slice(0, 0)
        return out


def test_harness_passes_a_right_pipeline_and_fails_a_wrong_one(
        tables: Mapping[str, pa.Table], tmp_path: Path) -> None:
    res = q4.run_pass("fake", True, tables, (0.001,), 1, 0, tmp_path, qualify=3,
                      build=lambda store, share_indexes: Recompute())
    assert res["ok"], [c for c in res["checks"] if not c["ok"]]
    assert [c["after"] for c in res["checks"]] == [
        "population", "qualifying sales", *(f"0.001 #1 {k}" for k in q4.KINDS)]
    assert res["qualify"]["q4_rows"] == 3
    assert all(c["top100_ok"] for c in res["checks"])
    s = res["sizes"][0]
    assert set(s["kinds"]) == set(q4.KINDS) and s["batch"]["median_ms"] > 0
    assert [len(p) for p in s["kinds"]["insert"]["pushes"]] == [3]

    # a pipeline that loses the answer's change after a customer update of an answer row
    w = q4.Workload(tables, 0)
    bad = Recompute(drop_q4_of="customer")
    integ = q4.Integrated()
    ref = q4.Reference()
    try:
        for n in q4.POPULATION_ORDER:
            integ.add(bad.push(n, tables[n]))
        for s_, d in w.qualifying_sales(3):
            integ.add(bad.push(s_, d))
            w.apply(s_, d)
        sk = w.tables["customer"].filter(pc.is_in(
            w.tables["customer"]["c_customer_id"],
            ref.answer(w.tables)[0]["customer_id"]))["c_customer_sk"][0].as_py()
        d = w.customer_update(1, customer_sks=[sk])
        integ.add(bad.push("customer", d))
        w.apply("customer", d)
        c = q4.check(integ, ref, w.tables, "bad")
    finally:
        ref.close()
    assert c["year_total"]["ok"] and not c["q4"]["ok"] and not c["ok"]
    assert c["q4"]["only_got_rows"] == c["q4"]["only_want_rows"] == 1
    assert c["q4"]["only_want"][0]["customer_first_name"].endswith("~1")


# ---- the real pipeline ----------------------------------------------------------------


def test_q4_pipeline_matches_duckdb(tables: Mapping[str, pa.Table], tmp_path: Path) -> None:
    """Population, qualifying sales, one batch of each kind, aimed changes: all vs DuckDB."""
    ref = q4.Reference()
    integ = q4.Integrated()
    w = q4.Workload(tables, seed=7)

    def push(source: str, delta: pa.Table) -> None:
        integ.add(p.push(source, delta))
        w.apply(source, delta)

    def ok(label: str) -> dict[str, Any]:
        c = q4.check(integ, ref, w.tables, label)
        assert c["ok"], c
        return c

    try:
        with joinstate.StateStore(tmp_path / "s") as store:
            p = q4.build_q4(store)
            assert set(p.outputs) == {"year_total", "q4"}
            q4.populate_pipeline(p, tables, chunk_rows=10_000, on_output=integ.add)
            assert ok("population")["year_total"]["want_rows"] > 1000
            for s, d in w.qualifying_sales(5):
                push(s, d)
            assert ok("qualifying sales")["q4"]["want_rows"] == 5
            for kind in q4.KINDS:
                for s, d in w.batch(kind, 0.001):
                    push(s, d)
                ok(kind)
            # aimed: rename answer customers, then take all of one's catalog sales away
            answer = ref.answer(w.tables)[0]
            cust = w.tables["customer"]
            sks = cust.filter(pc.is_in(cust["c_customer_id"], answer["customer_id"]))[
                "c_customer_sk"].to_pylist()
            push("customer", w.customer_update(0, customer_sks=sks[:2]))
            c = ok("answer customers renamed")
            assert c["q4"]["want_rows"] == answer.num_rows
            cs = w.tables["catalog_sales"]
            gone = cs.filter(pc.equal(cs["cs_bill_customer_sk"], sks[2]))
            assert gone.num_rows >= 4  # the qualifying sales at least
            push("catalog_sales", q4.weighted(gone, -1))
            assert ok("answer customer's catalog sales deleted")["q4"]["want_rows"] == (
                answer.num_rows - 1)
            push("catalog_sales", q4.weighted(gone, 1))
            ok("and re-inserted")
    finally:
        ref.close()


def test_run_q4_writes_both_passes(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = q4.run_q4(SF, (0.001,), 1, out, cache_dir=cache, workdir=tmp_path / "w",
                    recompute_runs=1, check_every="size")
    assert res["ok"], [c for p in res["passes"] for c in p["checks"] if not c["ok"]]
    assert [p["name"] for p in res["passes"]] == ["shared", "unshared"]
    shared, unshared = res["passes"]
    assert len(shared["column_families"]) <= len(unshared["column_families"])
    for p in res["passes"]:
        assert p["state_bytes_closed"] > 0 and p["population"]["s"] > 0
        assert len(p["checks"]) == 3  # population, qualifying sales, the size
    md = (out / "q4.md").read_text()
    assert "shared vs unshared" in md and "FAILED" not in md
    assert (out / "q4.json").read_text().startswith("{")
