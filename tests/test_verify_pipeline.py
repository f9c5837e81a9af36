"""``StateStore.verify`` and ``joinstate verify`` check pipelines, not only joins.

Per pipeline, from the store alone (no definition needed): every index's ``rows`` and
``entries`` counters against its stored entries (NULL-key families included), every
aggregate's group counter (and min/max multiset), every source's row record, and the
derived entry maps saved beside the store against the entries they describe.  The
command says what it verified; a damaged counter, block or derived file exits 1 with a
named error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from cli_runner import assert_one_line_error, run
from faults import flip_bytes, sst_files
from test_population_pipeline import CS, DS, SS, data

import joinstate
import population
from joinstate.names import counter_key

if TYPE_CHECKING:
    from pathlib import Path


def build(store: joinstate.StateStore) -> joinstate.Pipeline:
    """Unique and bag indexes, NULL keys, a filtered stream's index, sum/count/max."""
    c = joinstate.source("customer", CS, unique_key="ck")
    d = joinstate.source("date_dim", DS, unique_key="dk")
    s = joinstate.source("sales", SS)
    joined = s.join(c, on=("sk", "ck"))
    graph = joinstate.Graph().output(
        "per_year", joined.join(d, on=("dsk", "dk")).group_by(["name", "yr"]).aggregate(
            total=("sum", "amt"), n=("count", None), top=("max", "amt")))
    big = joined.filter(pc.field("dsk") > 15).select(["sk", "name", "amt"])
    graph = graph.output("pairs", big.join(c, on=("sk", "ck"), suffixes=("", "_c")))
    return joinstate.Pipeline(store, "mini", graph)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "s"
    d = data(seed=2)
    with joinstate.StateStore(path) as store:
        p = build(store)
        population.populate(p, sources=d, progress=False, batch_rows=900)
        # Retractions (bag entries rewritten), so the saved entry maps are not trivial.
        gone = d["sales"].slice(0, 300)
        p.push("sales", gone.append_column("_weight", pa.array([-1] * 300, pa.int64())))
        for cf in store.column_families():
            if cf != "default":
                store.flush(cf)
    return path


def test_verify_checks_every_index_and_aggregate(store_path: Path) -> None:
    with joinstate.StateStore(store_path) as store:
        p = build(store)
        infos = {ix.column_family: ix for ix in p.indexes()}
        got = store.verify()
        mine = got["pipelines"]["mini"]
        assert set(mine["indexes"]) == set(infos)
        for cf, ix in infos.items():
            counted = mine["indexes"][cf]
            assert counted["rows"] + counted["null_rows"] == ix.rows
            assert counted["entries"] == ix.entries
        assert any(c["null_rows"] for c in mine["indexes"].values())  # NULL keys covered
        (agg,) = mine["aggregates"].values()
        assert agg["groups"] > 0 and agg["values"] > 0  # max's multiset too


def test_the_command_says_what_it_verified(store_path: Path) -> None:
    result = run("verify", store_path)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert any(line.startswith("pipeline mini:") and "indexes" in line
               and "aggregates" in line for line in lines), lines
    assert "1 pipeline(s)" in lines[-1] and "index" in lines[-1], lines[-1]
    as_json = run("verify", store_path, "--json")
    assert as_json.exit_code == 0
    assert "mini" in as_json.output and '"pipelines"' in as_json.output


def test_a_wrong_index_counter_is_found(store_path: Path) -> None:
    with joinstate.StateStore(store_path) as store:
        cf = next(ix.column_family for ix in build(store).indexes() if ix.layout == "bag")
        store.meta_put(counter_key(cf, "rows"), (store.counter(cf, "rows") + 1).to_bytes(
            8, "big", signed=True))
    with joinstate.StateStore(store_path, read_only=True) as store, \
            pytest.raises(joinstate.StateCorruptedError, match=r"pipeline 'mini'.*rows"):
        store.verify()
    assert_one_line_error(run("verify", store_path), 1, "pipeline 'mini'", cf)


def test_a_wrong_aggregate_counter_is_found(store_path: Path) -> None:
    with joinstate.StateStore(store_path) as store:
        agg = next(cf for cf in store.column_families()
                   if cf.startswith("agg[mini~") and cf.endswith("]"))
        store.meta_put(counter_key(agg, "entries"), (store.counter(agg, "entries") - 1)
                       .to_bytes(8, "big", signed=True))
    assert_one_line_error(run("verify", store_path), 1, "pipeline 'mini'", agg, "groups")


def test_a_flipped_sst_byte_is_found(store_path: Path) -> None:
    flip_bytes(sst_files(store_path)[0], 64)
    assert_one_line_error(run("verify", store_path), 1, "corrupt")


def test_a_wrong_saved_entry_map_is_found(store_path: Path) -> None:
    """A derived file that passes every check of its stamp but lists other entries."""
    maps = sorted((store_path / "derived").glob("entry-map-ix.mini*.npz"),
                  key=lambda f: f.stat().st_size)
    assert maps, list((store_path / "derived").iterdir())
    target = maps[-1]
    with np.load(target) as saved:
        arrays = {k: saved[k].copy() for k in saved.files}
    arrays["hi"][0] ^= np.uint64(1)  # another row hash: same counts, same sort order
    np.savez(target, **arrays)
    with joinstate.StateStore(store_path, read_only=True) as store, \
            pytest.raises(joinstate.StateCorruptedError, match="entry map") as info:
        store.verify()
    assert target.name in str(info.value)
