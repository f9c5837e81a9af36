"""Child process of ``tests/test_go_live_crash.py``: populate, SIGKILL at the n-th write.

Usage: ``python tests/go_live_child.py '<json>'`` with ``kind`` (``pipeline`` or
``join``), ``path``, ``resume`` and ``kill``: ``[point, n]``, point ``write-before`` /
``write`` (before / after the n-th durable write of the store: every ``WriteBatch`` and
every single metadata put, whatever code path makes it) or ``none``.  The kill is a
monkey patch of this process only.

A run that is not killed prints, as JSON, how many writes it made and what the store
holds: the phase, the progress markers left, and the state (the pipeline's materialized
output, or the join's two sides) as sorted rows.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).parent))

from test_population_pipeline import CS, DS, SS, data

import joinstate
import population
from joinstate.db import Database

if TYPE_CHECKING:
    import pyarrow as pa

JOIN_LEFT = joinstate.Side(CS, key=["ck"], unique_key=["ck"])
JOIN_RIGHT = joinstate.Side(SS, key=["sk"])


def build(store: joinstate.StateStore) -> joinstate.Pipeline:
    """Two unique-key sources (a second load of them is a unique-key violation)."""
    c = joinstate.source("customer", CS, unique_key="ck")
    d = joinstate.source("date_dim", DS, unique_key="dk")
    s = joinstate.source("sales", SS)
    per_year = (s.join(c, on=("sk", "ck")).join(d, on=("dsk", "dk"))
                .group_by(["name", "yr"]).aggregate(total=("sum", "amt"), n=("count", None)))
    graph = joinstate.Graph().output("per_year", per_year, materialize=True)
    return joinstate.Pipeline(store, "golive", graph)


def rows(t: pa.Table) -> list[list[Any]]:
    cols = [c for c in t.column_names if c != "_weight"]
    out = [[str(v) for v in r] for r in zip(*(t.column(c).to_pylist() for c in cols),
                                               strict=True)]
    if "_weight" in t.column_names:
        out = [[*r, str(w)] for r, w in zip(out, t.column("_weight").to_pylist(), strict=True)]
    return sorted(out)


def main(spec: dict[str, Any]) -> None:
    point, n = spec["kill"]
    count = {"writes": 0}

    def wrap(name: str) -> None:
        inner = getattr(Database, name)

        def wrapper(self: Database, *args: Any, **kw: Any) -> Any:
            count["writes"] += 1
            if point == "write-before" and count["writes"] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            result = inner(self, *args, **kw)
            if point == "write" and count["writes"] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(Database, name, wrapper)

    d = data(seed=11, n=3000)
    result: dict[str, Any]
    with joinstate.StateStore(spec["path"]) as store:
        # Counting starts once the definitions are stored: the points are population's.
        if spec["kind"] == "pipeline":
            p = build(store)
            p.compile()
            wrap("write")
            wrap("meta_put")
            if p.phase != "live":
                population.populate(p, sources=d, progress=False, batch_rows=700,
                                    strategy="symmetric", resume=spec["resume"])
            result = {"phase": p.phase,
                      "markers": [s for s in p.sources if p.progress(s) is not None],
                      "state": rows(p.read("per_year"))}
        else:
            j = store.join("cs", left=JOIN_LEFT, right=JOIN_RIGHT)
            wrap("write")
            wrap("meta_put")
            if j.phase != "live":
                population.populate(j, d["customer"], d["sales"], strategy="asymmetric",
                                    progress=False, batch_rows=700, resume=spec["resume"])
            result = {"phase": j.phase,
                      "markers": [s for s in ("left", "right") if j.progress(s) is not None],
                      "state": {s: rows(j.state(s)) for s in ("left", "right")}}
    print(json.dumps({"writes": count["writes"], **result}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
