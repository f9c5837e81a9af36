"""A change that cancels out before a join does not fan out through it.

A dimension row rewritten in a column a filter keeps true and a projection then drops
reaches the join as ``-X, +X``: nothing changed.  Probed as it came, it would read every
fact row of that key twice (a date holds thousands of sales) and send them downstream
to cancel there.  These tests pin that the join (and the N-way join) consolidates such a
change first: it looks up no key, and the answers stay those of a plain oracle when the
same updates do change what the join reads.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import joinstate
import population

if TYPE_CHECKING:
    from pathlib import Path

DIM = pa.schema([("d", pa.int64()), ("m", pa.int64()), ("name", pa.string())])
FACT = pa.schema([("fd", pa.int64()), ("amt", pa.int64())])
SALES_PER_DATE = 500


def _pipeline(store: joinstate.StateStore) -> joinstate.Pipeline:
    dim = joinstate.source("dim", DIM, unique_key=["d"])
    fact = joinstate.source("fact", FACT)
    kept = dim.filter(pc.field("m").isin([1, 2])).select(["d", "name"])
    joined = fact.join(kept, on=("fd", "d"))
    both = joinstate.join_all({"a": kept, "b": kept.select(["d"])}, on="d")
    graph = (joinstate.Graph().output("joined", joined)
             .output("by_name", joined.group_by(["name"]).aggregate(total=("sum", "amt")),
                     materialize=True)
             .output("both", both))
    return joinstate.Pipeline(store, "c", graph)


def _rows(schema: pa.Schema, rows: list[tuple[Any, ...]], w: int) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    return pa.table({**{f.name: pa.array(c, f.type) for f, c in zip(schema, cols, strict=True)},
                     joinstate.WEIGHT: pa.array([w] * len(rows), pa.int64())})


def _join_run(rep: population.ApplyReport, kind: str) -> Any:
    runs = [r for label, r in rep.operator_runs.items() if label.startswith(kind)]
    assert runs, f"no {kind} among {list(rep.operator_runs)}"
    return runs


def test_an_update_a_projection_drops_looks_nothing_up(tmp_path: Path) -> None:
    with joinstate.StateStore(tmp_path / "s") as store:
        p = _pipeline(store)
        p.push("dim", _rows(DIM, [(1, 1, "a"), (2, 1, "b")], 1))
        p.push("fact", pa.table({"fd": np.repeat([1, 2], SALES_PER_DATE),
                                 "amt": np.arange(2 * SALES_PER_DATE)}))
        # m: 1 -> 2 passes the filter both times and is projected away
        change = pa.concat_tables([_rows(DIM, [(1, 1, "a")], -1), _rows(DIM, [(1, 2, "a")], 1)])
        rep = population.apply_batch(p, "dim", change, strategy="incremental")
        assert all(t.num_rows == 0 for t in rep.output.values())
        for run in _join_run(rep, "join"):
            assert run.keys == 0 and run.found == 0 and run.rows_out == 0, run
        # a change the join does read still fans out, with the right answer
        change = pa.concat_tables([_rows(DIM, [(1, 2, "a")], -1), _rows(DIM, [(1, 2, "z")], 1)])
        rep = population.apply_batch(p, "dim", change, strategy="incremental")
        by_name = rep.output["by_name"]
        assert by_name.num_rows == 2 and sorted(by_name["name"].to_pylist()) == ["a", "z"]
        p.verify()


def test_random_updates_match_an_oracle(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    names: list[str | None] = ["x", "y", None]
    dims: dict[int, tuple[int, str | None]] = {
        d: (int(rng.integers(0, 4)), names[int(rng.integers(0, 3))]) for d in range(8)}
    facts: Counter[tuple[int, int]] = Counter()
    with joinstate.StateStore(tmp_path / "s") as store:
        p = _pipeline(store)
        p.push("dim", _rows(DIM, [(d, m, n) for d, (m, n) in dims.items()], 1))
        fd = rng.integers(0, 10, 300)
        amt = rng.integers(0, 5, 300)
        p.push("fact", pa.table({"fd": pa.array(fd, pa.int64()), "amt": pa.array(amt)}))
        facts.update(zip(fd.tolist(), amt.tolist(), strict=True))
        for _ in range(30):
            picked = [int(d) for d in rng.choice(8, 3, replace=False)]
            old = [(d, *dims[d]) for d in picked]
            for d in picked:
                m, n = dims[d]
                if rng.random() < 0.6:
                    m = int(rng.integers(0, 4))
                else:
                    n = names[int(rng.integers(0, 3))]
                dims[d] = (m, n)
            new = [(d, *dims[d]) for d in picked]
            p.push("dim", pa.concat_tables([_rows(DIM, old, -1), _rows(DIM, new, 1)]))
        got: Counter[Any] = Counter()
        for row in p.read("by_name").to_pylist():
            got[row["name"]] = row["total"]
        want: Counter[Any] = Counter()
        seen: set[Any] = set()
        for (d, a), k in facts.items():
            if d in dims and dims[d][0] in (1, 2):
                want[dims[d][1]] += a * k
                seen.add(dims[d][1])
        assert dict(got) == {n: want[n] for n in seen}
        p.verify()
