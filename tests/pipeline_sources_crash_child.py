"""Child process of ``tests/test_pipeline_sources_crash.py``: push a seeded stream of
changes (inserts, deletes, and retractions the source must refuse) into a pipeline whose
sources keep row records, and SIGKILL itself at the ``n``-th arrival at a point.

Usage: ``python tests/pipeline_sources_crash_child.py '<json>'`` with ``path``,
``compact_min`` (the record's rewrite threshold, small to make rewrites frequent) and
``kill``: ``[point, n]`` with point ``commit-before`` / ``commit`` (before / after a
``Transaction.commit``) or ``none``.  Every push has a commit id, so a rerun replays what
was committed and applies the rest.  Prints the commit counts and the refusals as JSON.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from collections import Counter
from typing import Any

import pyarrow as pa

import joinstate
from joinstate import _source_rows
from joinstate.transaction import Transaction

SALES = pa.schema([("sk", pa.int64()), ("ck", pa.int64()), ("amt", pa.int64())])
CUSTOMERS = pa.schema([("ck", pa.int64()), ("name", pa.string())])
Row = tuple[Any, ...]
Push = tuple[str, list[tuple[Row, int]], bool]  # source, entries, whether it is legal


def build(store: joinstate.StateStore) -> joinstate.Pipeline:
    """by_ck (sales alone: no index), names (sales' index keeps ck, amt), total (global)."""
    sales = joinstate.source("sales", SALES)
    customers = joinstate.source("customers", CUSTOMERS, unique_key="ck")
    graph = (joinstate.Graph()
             .output("by_ck", sales.group_by("ck").aggregate(s=("sum", "amt"),
                                                              n=("count", None)),
                     materialize=True)
             .output("names", sales.join(customers, on="ck").select(["name", "amt"]),
                     materialize=True)
             .output("total", sales.group_by([]).aggregate(n=("count", None),
                                                            s=("sum", "amt")),
                     materialize=True))
    return joinstate.Pipeline(store, "q", graph)


def stream(seed: int = 5, pushes: int = 60) -> list[Push]:
    """Legal changes and, every fourth push, one the sales source must refuse."""
    rng = random.Random(seed)
    held: Counter[Row] = Counter()
    out: list[Push] = [("customers", [((c, f"c{c}"), 1) for c in range(4)], True)]
    for i in range(pushes):
        entries: list[tuple[Row, int]] = []
        for _ in range(rng.randint(1, 12)):
            present = sorted((r for r, w in held.items() if w > 0), key=repr)
            if present and rng.random() < 0.45:
                r = rng.choice(present)
                entries.append((r, -1))
                held[r] -= 1
            else:
                r = (rng.randint(0, 40), rng.randint(0, 5), rng.choice([None, 1, 2, 5]))
                entries.append((r, 1))
                held[r] += 1
        out.append(("sales", entries, True))
        if i % 4 == 3:
            present = sorted((r for r, w in held.items() if w > 0), key=repr)
            r = rng.choice(present)
            bad = (r[0] + 100, r[1], r[2]) if rng.random() < 0.5 else r
            out.append(("sales", [(bad, -(held[bad] + 1))], False))
    return out


def delta(source: str, entries: list[tuple[Row, int]]) -> pa.Table:
    schema = SALES if source == "sales" else CUSTOMERS
    cols = {f.name: pa.array([r[i] for r, _ in entries], f.type) for i, f in enumerate(schema)}
    cols["_weight"] = pa.array([w for _, w in entries], pa.int64())
    return pa.table(cols)


def main(spec: dict[str, Any]) -> None:
    point, n = spec["kill"]
    _source_rows._COMPACT_MIN = spec["compact_min"]  # noqa: SLF001 (frequent rewrites)
    counts = {"commit-before": 0, "commit": 0, "refused": 0}
    original = Transaction.commit

    def commit(self: Transaction, sink: Any = None) -> None:
        counts["commit-before"] += 1
        if point == "commit-before" and counts["commit-before"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, sink)
        counts["commit"] += 1
        if point == "commit" and counts["commit"] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    Transaction.commit = commit  # type: ignore[method-assign]
    with joinstate.StateStore(spec["path"]) as store:
        p = build(store)
        for i, (source, entries, legal) in enumerate(stream()):
            try:
                p.push(source, delta(source, entries), commit_id=f"c{i}")
            except joinstate.OverRetractionError:
                if legal:
                    raise
                counts["refused"] += 1
            else:
                if not legal:
                    msg = f"push {i} retracts a row the source does not hold, yet was taken"
                    raise AssertionError(msg)
    print(json.dumps(counts))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
