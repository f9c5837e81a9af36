"""A pipeline source refuses the retraction of a row it does not hold, whatever reads it.

Every view shape: a source read only by an aggregate (no index), by a join whose index
keeps some of its columns, by a union, by a filter; a source whose index holds every
column (that index decides); NULLs, duplicates, inserts and retractions of one row in
one push.  A refused push raises ``OverRetractionError`` naming the pipeline and the
source and leaves every byte of the store as it was.  Random legal streams with bad
retractions mixed in are compared with the DuckDB oracle of tests/pipeline_oracle.py.
The row record survives a reopen, is checked by ``Pipeline.verify``, stays bounded under
churn, and is shown by ``explain``/``describe``/``summary``.  Crash tests are in
tests/test_pipeline_sources_crash.py.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest
import rocksdict as rd
from pipeline_oracle import ChangeGen, Node, PipelineHarness, Source, col, make_delta

import joinstate
from joinstate import _source_rows
from joinstate.names import pipeline_column_families, pipeline_spec_key, source_rows_cf
from planner.sql import Source as SQLSource
from planner.sql import compile as compile_sql

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

SALES = pa.schema([("sk", pa.int64()), ("ck", pa.int64()), ("amt", pa.int64())])
CUSTOMERS = pa.schema([("ck", pa.int64()), ("name", pa.string())])
RETURNS = pa.schema([("ck", pa.int64()), ("amt", pa.int64())])
Row = tuple[Any, ...]


def delta(schema: pa.Schema, rows: Sequence[Row], weights: Sequence[int] | None = None
          ) -> pa.Table:
    w = [1] * len(rows) if weights is None else list(weights)
    return make_delta(schema, list(zip(rows, w, strict=True)))


def contents(store: joinstate.StateStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every column family (``__meta__`` included)."""
    ro = rd.ReadOptions()
    ro.set_total_order_seek(True)
    out = {}
    for cf in store.column_families():
        if cf != "default":
            out[cf] = list(store.cf(cf).items(read_opt=ro))
    return out


def refused(store: joinstate.StateStore, p: joinstate.Pipeline, source: str,
            rows: Sequence[Row], weights: Sequence[int], match: str) -> None:
    """The push raises OverRetractionError matching ``match`` and changes nothing."""
    before = contents(store)
    with pytest.raises(joinstate.OverRetractionError, match=match):
        p.push(source, delta(p.source_schema(source), rows, weights))
    assert contents(store) == before


def read(p: joinstate.Pipeline, output: str) -> list[Row]:
    return sorted(tuple(r.values()) for r in p.read(output).to_pylist())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[joinstate.StateStore]:
    with joinstate.StateStore(tmp_path / "state") as s:
        yield s


# ---- the examples, one per view shape -----------------------------------------------------


def test_aggregate_only_view(store: joinstate.StateStore) -> None:
    """No index reads the source: the row record decides."""
    sales = joinstate.source("sales", SALES)
    graph = joinstate.Graph().output(
        "by_ck", sales.group_by("ck").aggregate(s=("sum", "amt"), n=("count", None)),
        materialize=True)
    p = joinstate.Pipeline(store, "q", graph)
    p.push("sales", delta(SALES, [(1, 1, 10), (2, 1, 20)]))
    refused(store, p, "sales", [(77, 1, 999)], [-1],
            r"pipeline 'q', source 'sales'.*\(sk=77, ck=1, amt=999\)")
    assert read(p, "by_ck") == [(1, 30, 2)]
    assert p.verify()["row_records"][source_rows_cf("q", "sales")]["rows"] == 2


def test_aggregate_only_view_through_sql(store: joinstate.StateStore) -> None:
    p = compile_sql("SELECT ck, sum(amt) AS s, count(*) AS n FROM sales GROUP BY ck",
                    {"sales": SQLSource(SALES)}, store=store, name="v")
    p.push("sales", delta(SALES, [(1, 1, 10), (2, 1, 20)]))
    refused(store, p, "sales", [(77, 1, 999)], [-1], "source 'sales'")
    assert read(p, "v") == [(1, 30, 2)]
    p.push("sales", delta(SALES, [(2, 1, 20)], [-1]))
    assert read(p, "v") == [(1, 10, 1)]


def test_join_view_with_a_projected_index(store: joinstate.StateStore) -> None:
    """The sales index keeps (ck, amt): a row differing only in sk must not match."""
    p = compile_sql("SELECT c.name, s.amt FROM sales s JOIN customers c ON s.ck = c.ck",
                    {"sales": SQLSource(SALES), "customers": SQLSource(CUSTOMERS, ["ck"])},
                    store=store, name="v")
    assert all("sk" not in json.dumps(i.column_family) for i in p.indexes())
    p.push("customers", delta(CUSTOMERS, [(1, "ann")]))
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    refused(store, p, "sales", [(99, 1, 10)], [-1], r"source 'sales'.*sk=99")
    assert read(p, "v") == [("ann", 10)]
    out = p.push("sales", delta(SALES, [(1, 1, 10)], [-1]))["v"]
    assert out.to_pylist() == [{"name": "ann", "amt": 10, "_weight": -1}]
    assert read(p, "v") == []


def test_union_view(store: joinstate.StateStore) -> None:
    sales = joinstate.source("sales", SALES).select(["ck", "amt"])
    returns = joinstate.source("returns", RETURNS)
    graph = joinstate.Graph()
    graph = graph.output("all", sales.union_all(returns), materialize=True)
    p = joinstate.Pipeline(store, "u", graph)
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    p.push("returns", delta(RETURNS, [(1, 5)]))
    # (1, 10) is in the union, but returns never received it
    refused(store, p, "returns", [(1, 10)], [-1], r"source 'returns'.*ck=1, amt=10")
    refused(store, p, "sales", [(2, 1, 5)], [-1], r"source 'sales'")
    p.push("returns", delta(RETURNS, [(1, 5)], [-1]))
    assert read(p, "all") == [(1, 10)]


def test_filter_only_view_refuses_rows_the_filter_drops(store: joinstate.StateStore) -> None:
    """A retracted row the filter would drop never reaches any state, yet it is refused."""
    sales = joinstate.source("sales", SALES)
    graph = joinstate.Graph()
    graph = graph.output("big", sales.filter(col("amt").to_pc() > 5), materialize=True)
    p = joinstate.Pipeline(store, "f", graph)
    p.push("sales", delta(SALES, [(1, 1, 10), (2, 1, 3)]))
    refused(store, p, "sales", [(3, 1, 2)], [-1], r"sk=3, ck=1, amt=2")
    refused(store, p, "sales", [(1, 1, 11)], [-1], r"sk=1, ck=1, amt=11")
    p.push("sales", delta(SALES, [(2, 1, 3)], [-1]))
    assert read(p, "big") == [(1, 1, 10)]


@pytest.mark.parametrize("column", ["sk", "ck", "amt"])
def test_a_row_differing_in_one_column_is_refused(store: joinstate.StateStore,
                                                 column: str) -> None:
    sales = joinstate.source("sales", SALES)
    customers = joinstate.source("customers", CUSTOMERS, unique_key="ck")
    graph = joinstate.Graph()
    graph = graph.output("names", sales.join(customers, on="ck").select(["name"]), materialize=True)
    graph = graph.output("n", sales.group_by([]).aggregate(n=("count", None)))
    p = joinstate.Pipeline(store, "d", graph)
    p.push("customers", delta(CUSTOMERS, [(1, "ann"), (2, "bob")]))
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    wrong = {"sk": (9, 1, 10), "ck": (1, 2, 10), "amt": (1, 1, 9)}[column]
    refused(store, p, "sales", [wrong], [-1], "source 'sales'")
    assert read(p, "names") == [("ann",)]


def test_duplicates(store: joinstate.StateStore) -> None:
    sales = joinstate.source("sales", SALES)
    graph = joinstate.Graph()
    graph = graph.output("n", sales.group_by("ck").aggregate(n=("count", None)), materialize=True)
    p = joinstate.Pipeline(store, "dup", graph)
    p.push("sales", delta(SALES, [(1, 1, 10)], [2]))
    refused(store, p, "sales", [(1, 1, 10)], [-3], r"retracts the row .* 3 time\(s\), but "
            r"the source holds it 2 time\(s\)")
    p.push("sales", delta(SALES, [(1, 1, 10), (1, 1, 10)]))  # a second push: 4 copies
    refused(store, p, "sales", [(1, 1, 10), (1, 1, 10)], [-3, -2], "holds it 4 time")
    p.push("sales", delta(SALES, [(1, 1, 10)], [-4]))
    assert read(p, "n") == []
    refused(store, p, "sales", [(1, 1, 10)], [-1], "holds it 0 time")


def test_nulls_are_values_of_the_row(store: joinstate.StateStore) -> None:
    sales = joinstate.source("sales", SALES)
    graph = joinstate.Graph()
    graph = graph.output("s", sales.group_by("ck").aggregate(s=("sum", "amt")), materialize=True)
    p = joinstate.Pipeline(store, "nul", graph)
    p.push("sales", delta(SALES, [(None, 1, None), (None, None, 5)]))
    refused(store, p, "sales", [(None, 1, 0)], [-1], "amt=0")
    refused(store, p, "sales", [(0, 1, None)], [-1], "sk=0")
    refused(store, p, "sales", [(None, None, None)], [-1], "sk=None, ck=None, amt=None")
    p.push("sales", delta(SALES, [(None, 1, None)], [-1]))
    assert read(p, "s") == [(None, 5)]


def test_inserts_and_retractions_in_one_push_consolidate(store: joinstate.StateStore) -> None:
    sales = joinstate.source("sales", SALES)
    graph = joinstate.Graph()
    graph = graph.output("n", sales.group_by("ck").aggregate(n=("count", None)), materialize=True)
    p = joinstate.Pipeline(store, "c", graph)
    r = (1, 1, 10)
    out = p.push("sales", delta(SALES, [r, r], [1, -1]))["n"]
    assert out.num_rows == 0
    refused(store, p, "sales", [r, r, r], [1, -1, -1], "holds it 0 time")
    p.push("sales", delta(SALES, [r, r, (2, 1, 1)], [-1, 2, 1]))
    assert read(p, "n") == [(1, 2)]
    refused(store, p, "sales", [r, (2, 1, 1)], [-1, -2], r"sk=2.*holds it 1 time")
    p.push("sales", delta(SALES, [(2, 1, 1), r], [-1, 0]))  # a zero weight is no change
    assert read(p, "n") == [(1, 1)]


# ---- who checks -----------------------------------------------------------------------------


def test_an_index_holding_every_column_decides(store: joinstate.StateStore) -> None:
    """No row record where an index of the source holds all of it."""
    sales = joinstate.source("sales", SALES)
    customers = joinstate.source("customers", CUSTOMERS, unique_key="ck")
    graph = joinstate.Graph()
    graph = graph.output("j", sales.join(customers, on="ck"), materialize=True)
    p = joinstate.Pipeline(store, "all", graph)
    p.compile()
    families = store.column_families()
    assert source_rows_cf("all", "sales") not in families
    assert source_rows_cf("all", "customers") not in families
    assert "sales: retractions checked by its index" in p.explain()
    p.push("customers", delta(CUSTOMERS, [(1, "ann")]))
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    refused(store, p, "sales", [(2, 1, 10)], [-1],
            r"pipeline 'all', source 'sales' \(checked by its index")
    refused(store, p, "customers", [(1, "bob")], [-1], r"source 'customers'")
    p.push("customers", delta(CUSTOMERS, [(1, "ann"), (1, "bob")], [-1, 1]))
    assert read(p, "j") == [(1, 1, 10, 1, "bob")]
    described = joinstate.inspect.describe(store, "all")
    assert {s["name"]: s["checked_by"] for s in described["sources"]} == {
        "sales": "its index holding every column", "customers": "its index holding every column"}


def test_a_filtered_shared_index_does_not_decide(store: joinstate.StateStore) -> None:
    """An index keeping only the rows its readers pass cannot vouch for the others."""
    sales = joinstate.source("sales", SALES)
    customers = joinstate.source("customers", CUSTOMERS, unique_key="ck")
    graph = joinstate.Graph()
    graph = graph.output("j", sales.filter(col("amt").to_pc() > 5).join(customers, on="ck"),
                         materialize=True)
    p = joinstate.Pipeline(store, "fi", graph)
    p.compile()
    assert source_rows_cf("fi", "sales") in store.column_families()
    p.push("sales", delta(SALES, [(1, 1, 10), (2, 1, 1)]))
    refused(store, p, "sales", [(3, 1, 1)], [-1], "sk=3")
    p.push("sales", delta(SALES, [(2, 1, 1)], [-1]))


def test_unchecked_sources_keep_no_record(store: joinstate.StateStore) -> None:
    sales = joinstate.source("sales", SALES, retractions="unchecked")
    graph = joinstate.Graph()
    graph = graph.output("n", sales.group_by("ck").aggregate(n=("count", None)), materialize=True)
    p = joinstate.Pipeline(store, "un", graph)
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    p.push("sales", delta(SALES, [(2, 1, 99)], [-1]))  # trusted: not checked
    assert read(p, "n") == []
    assert source_rows_cf("un", "sales") not in store.column_families()
    assert "not checked (retractions='unchecked')" in p.explain()
    assert "sales (retractions unchecked)" in p.summary()
    with pytest.raises(joinstate.SchemaMismatchError, match="retractions='sometimes'"):
        joinstate.source("s", SALES, retractions="sometimes")


def test_the_mode_is_part_of_the_definition(tmp_path: Path) -> None:
    def build(store: joinstate.StateStore, mode: str) -> joinstate.Pipeline:
        graph = joinstate.Graph().output("o", joinstate.source("sales", SALES,
                                                               retractions=mode))
        return joinstate.Pipeline(store, "m", graph)

    with joinstate.StateStore(tmp_path / "s") as store:
        build(store, "checked").push("sales", delta(SALES, [(1, 1, 1)]))
    with joinstate.StateStore(tmp_path / "s") as store, \
            pytest.raises(joinstate.JoinSpecMismatchError, match="retractions"):
        build(store, "unchecked").compile()


def test_a_definition_of_an_older_version_is_refused(store: joinstate.StateStore) -> None:
    graph = joinstate.Graph()
    graph = graph.output("o", joinstate.source("sales", SALES))
    p = joinstate.Pipeline(store, "old", graph)
    p.compile()
    spec = json.loads(store.meta_get(pipeline_spec_key("old")) or b"{}")
    spec["version"] = 1
    store.meta_put(pipeline_spec_key("old"), json.dumps(spec).encode())
    store.close()
    with joinstate.StateStore(store.path) as again:
        graph = joinstate.Graph()
        graph = graph.output("o", joinstate.source("sales", SALES))
        q = joinstate.Pipeline(again, "old", graph)
        with pytest.raises(joinstate.JoinSpecMismatchError, match="older joinstate"):
            q.compile()


# ---- durability, bookkeeping ----------------------------------------------------------------


def _agg_pipeline(store: joinstate.StateStore, name: str = "r") -> joinstate.Pipeline:
    sales = joinstate.source("sales", SALES)
    graph = joinstate.Graph().output("by_ck", sales.group_by("ck").aggregate(s=("sum", "amt")),
                                     materialize=True)
    return joinstate.Pipeline(store, name, graph)


def test_the_record_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        p = _agg_pipeline(store)
        p.push("sales", delta(SALES, [(1, 1, 10), (2, 2, 20), (3, 2, 5)]))
        p.push("sales", delta(SALES, [(3, 2, 5)], [-1]))  # the map exists from here on
    with joinstate.StateStore(path) as store:
        p = _agg_pipeline(store)
        refused(store, p, "sales", [(3, 2, 5)], [-1], "holds it 0 time")
        refused(store, p, "sales", [(1, 1, 11)], [-1], "amt=11")
        p.push("sales", delta(SALES, [(1, 1, 10)], [-1]))
        assert read(p, "by_ck") == [(2, 20)]
        assert p.verify()["row_records"][source_rows_cf("r", "sales")] == {
            "rows": 1, "entries": 5, "distinct": 1}


def test_warm_builds_the_multiset_before_the_first_retraction(tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    """After a reopen, ``warm`` builds what the first retraction would build (one scan of
    the record), so the retraction scans nothing; ``reload`` forgets it again."""
    path = tmp_path / "s"
    with joinstate.StateStore(path) as store:
        p = _agg_pipeline(store)
        p.push("sales", delta(SALES, [(1, 1, 10), (2, 2, 20), (3, 2, 5)]))
    scans: list[str] = []
    real = _source_rows.SourceRows.scan

    def counted(self: _source_rows.SourceRows) -> Any:
        scans.append(self.cf)
        return real(self)

    monkeypatch.setattr(_source_rows.SourceRows, "scan", counted)
    with joinstate.StateStore(path) as store:
        p = _agg_pipeline(store)
        seconds = p.warm()
        assert list(seconds) == ["sales"] and seconds["sales"] >= 0
        assert scans == [source_rows_cf("r", "sales")]
        refused(store, p, "sales", [(3, 2, 6)], [-1], "amt=6")
        p.push("sales", delta(SALES, [(3, 2, 5)], [-1]))
        assert len(scans) == 1  # decided from the multiset warm built
        p.reload()
        refused(store, p, "sales", [(3, 2, 5)], [-1], "holds it 0 time")
        assert len(scans) == 2  # rebuilt from the record after reload
        assert read(p, "by_ck") == [(1, 10), (2, 20)]


def test_state_bytes_are_sixteen_per_inserted_row(store: joinstate.StateStore) -> None:
    p = _agg_pipeline(store)
    n = 5000
    p.push("sales", delta(SALES, [(i, i % 7, i) for i in range(n)]))
    cf = source_rows_cf("r", "sales")
    stored = contents(store)[cf]
    assert len(stored) <= _source_rows.BUCKETS  # one value per bucket, not per row
    assert sum(len(v) for _, v in stored) == 16 * n + len(stored)  # a tag byte per value
    assert sum(len(k) for k, _ in stored) == 9 * len(stored)


def test_churn_keeps_the_record_bounded(store: joinstate.StateStore,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_source_rows, "_COMPACT_MIN", 8)
    monkeypatch.setattr(_source_rows, "_VALUES_MIN", 2)
    p = _agg_pipeline(store)
    live = [(i, i % 3, i) for i in range(200)]
    p.push("sales", delta(SALES, live))
    rng = random.Random(3)
    cf = source_rows_cf("r", "sales")
    for _ in range(60):
        batch = rng.sample(live, 20)
        p.push("sales", delta(SALES, batch, [-1] * 20))
        p.push("sales", delta(SALES, batch))
        entries = store.counter(cf, "entries")
        assert entries <= 2 * len(live) + 8 * _source_rows.BUCKETS + 40
    values = len(contents(store)[cf])
    assert values <= 4 * _source_rows.BUCKETS + store.counter(cf, "entries") // 16
    assert p.verify()["row_records"][cf]["rows"] == len(live)
    refused(store, p, "sales", [(0, 0, 1)], [-1], "amt=1")
    p.push("sales", delta(SALES, live, [-1] * len(live)))
    assert p.verify()["row_records"][cf] == {"rows": 0, "entries": store.counter(cf, "entries"),
                                             "distinct": 0}


def test_verify_finds_a_damaged_record(store: joinstate.StateStore) -> None:
    p = _agg_pipeline(store)
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    cf = source_rows_cf("r", "sales")
    key = next(iter(contents(store)[cf]))[0]
    store.cf(cf)[key] = b"\x01" + b"\x00" * 15  # 15 bytes: not a row hash
    with pytest.raises(joinstate.StateCorruptedError, match="not a row record"):
        p.verify()
    with pytest.raises(joinstate.StateCorruptedError, match="not a row record"):
        joinstate.inspect.verify_records(store, "r")
    key, _ = next(iter(contents(store)[cf]))
    store.cf(cf)[key] = b"\x01" + bytes(16)  # a row hash of bucket 0
    wrong = key[:8] + bytes((key[8] ^ 1,))
    store.cf(cf)[wrong] = b"\x01" + bytes(15) + b"\xff"  # bucket 63 under another key
    with pytest.raises(joinstate.StateCorruptedError, match="another bucket"):
        joinstate.inspect.verify_records(store, "r")


def test_verify_finds_a_record_that_lost_rows(store: joinstate.StateStore) -> None:
    p = _agg_pipeline(store)
    p.push("sales", delta(SALES, [(1, 1, 10)]))
    p.push("sales", delta(SALES, [(2, 1, 10)]))
    cf = source_rows_cf("r", "sales")
    del store.cf(cf)[next(iter(contents(store)[cf]))[0]]
    with pytest.raises(joinstate.StateCorruptedError, match="counter says"):
        p.verify()


def test_the_record_is_visible(store: joinstate.StateStore) -> None:
    p = _agg_pipeline(store)
    p.push("sales", delta(SALES, [(1, 1, 10), (2, 1, 10)]))
    cf = source_rows_cf("r", "sales")
    assert "source sales: retractions checked by its row record rows[r~sales]" in p.explain()
    assert cf in p.column_families()
    assert cf in pipeline_column_families(store.column_families(), "r")
    assert pipeline_column_families([cf, "rows[rr~sales]", "ix.r.left[k]"], "r") == [cf]
    facts = joinstate.inspect.describe(store, "r")
    (rec,) = facts["row_records"]
    assert (rec["source"], rec["rows"], rec["entries"]) == ("sales", 2, 2)
    assert facts["sources"][0]["checked_by"] == "its row record"
    assert any(line.split()[:4] == ["row", "record", "sales", "2"]
               for line in p.summary().splitlines())


# ---- random streams with bad retractions, against the oracle --------------------------------

S = Source("S", pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64())]))
C = Source("C", pa.schema([("b", pa.string()), ("x", pa.int64())]), unique_key=["b"])
VALUES: dict[str, dict[str, Callable[[random.Random], Any]]] = {
    "S": {"a": lambda r: r.choice([None, 0, 1, 2]), "b": lambda r: r.choice([None, "p", "q"]),
          "v": lambda r: r.choice([None, -1, 3, 7])},
    "C": {"x": lambda r: r.choice([None, 1, 2])},
}
SHAPES: dict[str, dict[str, Node]] = {
    "aggregate": {"g": S.group_by(["b"], n=("count", None), s=("sum", "v"))},
    "global": {"g": S.group_by([], n=("count", None), s=("sum", "v"), hi=("max", "a"))},
    "join": {"j": S.join(C, on="b").select({"a": col("a"), "x": col("x")})},
    "filter": {"f": S.filter(col("v") > 0)},
    "union": {"u": S.select(["b", "v"]).union_all(C.select({"b": col("b"), "v": col("x")}))},
}


def _bad(rng: random.Random, gen: ChangeGen, current: Counter[Row]) -> list[tuple[Row, int]]:
    """One retraction the source cannot take."""
    present = sorted((r for r, w in current.items() if w > 0), key=repr)
    kind = rng.random()
    if present and kind < 0.4:  # more copies than held
        r = rng.choice(present)
        return [(r, -(current[r] + rng.randint(1, 2)))]
    if present and kind < 0.8:  # a held row with one column changed
        cells = list(rng.choice(present))
        i = rng.randrange(len(cells))
        for _ in range(20):
            new = gen.row(rng, cells[gen.uk_idx[0]] if gen.uk_idx else None)[i]
            if new != cells[i]:
                cells[i] = new
                break
        bad = tuple(cells)
        if current.get(bad, 0) == 0:
            return [(bad, -1)]
    for _ in range(50):
        r = gen.row(rng, rng.choice(gen.key_domain) if gen.uk_idx else None)
        if current.get(r, 0) == 0:
            return [(r, -1)]
    msg = "no absent row found"
    raise AssertionError(msg)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("seed", [1, 2])
def test_random_streams_with_bad_retractions(tmp_path: Path, shape: str, seed: int) -> None:
    rng = random.Random(seed * 31 + len(shape))
    outputs = SHAPES[shape]
    gens = {"S": ChangeGen(S, VALUES["S"]), "C": ChangeGen(C, VALUES["C"], ["p", "q", "r"])}
    path = tmp_path / "s"
    store = joinstate.StateStore(path)
    try:
        h = PipelineHarness(store, f"rand_{shape}", outputs)
        refusals = 0
        for i in range(24):
            source = rng.choice(sorted(h.sources))
            legal = gens[source].delta(rng, h.inputs[source])
            if i % 3 == 2:
                after = Counter(h.inputs[source])
                for r, w in legal:  # the bad row is bad counting the legal part of the push
                    after[r] += w
                bad = _bad(rng, gens[source], after)
                mixed = legal + bad
                rng.shuffle(mixed)
                before = contents(store)
                with pytest.raises(joinstate.OverRetractionError,
                                   match=f"source '{source}'"):
                    h.pipeline.push(source, make_delta(h.sources[source].schema, mixed))
                assert contents(store) == before, f"push {i} changed the store"
                refusals += 1
            h.push(source, legal)
            if i == 12:
                store.close()
                store = joinstate.StateStore(path)
                h.rebuild(store)
        assert refusals == 8
        h.pipeline.verify()
    finally:
        store.close()


# ---- the row hash ---------------------------------------------------------------------------


def _h(table: pa.Table) -> list[tuple[int, int]]:
    lo, hi = _source_rows.row_hashes(table)
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def test_row_hash_follows_sql_equality() -> None:
    nan2 = float(np.array([0x7FF8000000000001], np.uint64).view(np.float64)[0])  # a payload
    t = pa.table({"f": pa.array([0.0, -0.0, float("nan"), nan2, None, 1.0]),
                  "g": pa.array([0.0, -0.0, float("nan"), -float("nan"), 0.0, 1.0],
                                pa.float32())})
    h = _h(t)
    assert h[0] == h[1] and h[2] == h[3]  # -0.0 = 0.0, one NaN
    assert len({h[0], h[2], h[4], h[5]}) == 4  # NULL is not 0.0
    nulls = pa.table({"a": pa.array([None, 0, 0], pa.int64()),
                      "b": pa.array([0, None, 0], pa.int64())})
    assert len(set(_h(nulls))) == 3  # which column is NULL matters
    swapped = pa.table({"a": [1, 2], "b": [2, 1]})
    assert len(set(_h(swapped))) == 2


def test_row_hash_of_every_storable_type_is_positional_and_slice_safe() -> None:
    import datetime as dt
    from decimal import Decimal

    n = 3 * 16384 + 7  # several hashing chunks
    rng = random.Random(4)

    def pick(values: list[Any]) -> list[Any]:
        return [rng.choice(values) for _ in range(n)]

    cols = {
        "i8": pa.array(pick([None, -1, 0, 127]), pa.int8()),
        "u64": pa.array(pick([None, 0, 2**64 - 1]), pa.uint64()),
        "f32": pa.array(pick([None, 1.5, -0.0]), pa.float32()),
        "b": pa.array(pick([None, True, False])),
        "s": pa.array(pick([None, "", "x", "xy"])),
        "ls": pa.array(pick([None, "q"]), pa.large_string()),
        "bin": pa.array(pick([None, b"\x00", b""]), pa.binary()),
        "lb": pa.array(pick([None, b"z"]), pa.large_binary()),
        "fsb": pa.array(pick([None, b"abc", b"abd"]), pa.binary(3)),
        "d32": pa.array(pick([None, dt.date(2000, 1, 1)]), pa.date32()),
        "d64": pa.array(pick([None, dt.date(2001, 1, 1)]), pa.date64()),
        "t32": pa.array(pick([None, 5]), pa.time32("s")),
        "t64": pa.array(pick([None, 7]), pa.time64("us")),
        "ts": pa.array(pick([None, 9]), pa.timestamp("ns")),
        "du": pa.array(pick([None, 3]), pa.duration("ms")),
        "dec": pa.array(pick([None, Decimal("1.25"), Decimal("-1.25")]), pa.decimal128(20, 2)),
        "d7": pa.array(pick([None, Decimal("0.01"), Decimal("-0.01"), Decimal("-99999.99")]),
                       pa.decimal128(7, 2)),
    }
    t = pa.table(cols)
    whole = _h(t)
    for start, length in ((0, 10), (16380, 9), (n - 5, 5)):
        assert _h(t.slice(start, length)) == whole[start:start + length]
    chunked = pa.Table.from_batches(t.to_batches(max_chunksize=1000))
    assert _h(chunked) == whole
    distinct = {tuple(r.values()) for r in t.to_pylist()}  # no NaN here: == is SQL's
    assert len(set(whole)) == len(distinct)
    by_row: dict[tuple[Any, ...], tuple[int, int]] = {}
    for r, h in zip(t.to_pylist(), whole, strict=True):
        assert by_row.setdefault(tuple(r.values()), h) == h


def test_row_hash_has_no_collisions_on_a_dense_grid() -> None:
    a, b = np.meshgrid(np.arange(600), np.arange(500))
    t = pa.table({"a": a.ravel(), "b": b.ravel(), "c": np.zeros(a.size, np.int64)})
    lo, hi = _source_rows.row_hashes(t)
    assert len(set(lo.tolist())) == len(set(hi.tolist())) == a.size  # each half alone too
