"""Child process of ``tests/test_pipeline_crash.py``: populate a pipeline, then push live
changes, and SIGKILL itself at the ``n``-th arrival at a point.

Usage: ``python tests/pipeline_crash_child.py '<json>'`` with ``path``, ``out`` (a
directory: every delivered output is written there as ``<source>-<index>.arrow`` before
the sink returns, and every committed live push as ``live-<i>.arrow``), ``resume`` and
``kill``: ``[point, n]`` with point ``commit-before`` / ``commit`` (before / after a
``Transaction.commit``), ``ingest-intent`` / ``ingest-done`` (a push whose blind inserts
went to SST files: its batch, holding the intent, written and no file ingested yet /
every file ingested and the intent removed) or ``none``.  ``ingest_min_rows`` (optional)
lowers the rows a family needs for its inserts to go to an SST file, so that this small
population's pushes take that path.  The points are monkey patches of this process only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))

from test_population_pipeline import build, data, live_batches

import joinstate
import joinstate.intents
import joinstate.transaction
import population
from joinstate.transaction import Transaction


def main(spec: dict[str, Any]) -> None:
    point, n = spec["kill"]
    counts = {"commit-before": 0, "commit": 0, "ingest-intent": 0, "ingest-done": 0}
    original = Transaction.commit
    if spec.get("ingest_min_rows") is not None:
        joinstate.transaction.INGEST_MIN_ROWS = spec["ingest_min_rows"]
    complete = joinstate.intents._complete_ingest  # noqa: SLF001 (a kill point)

    def complete_ingest(*args: Any) -> None:
        counts["ingest-intent"] += 1
        if point == "ingest-intent" and counts["ingest-intent"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        complete(*args)
        counts["ingest-done"] += 1
        if point == "ingest-done" and counts["ingest-done"] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    joinstate.intents._complete_ingest = complete_ingest  # noqa: SLF001

    def commit(self: Transaction, sink: Any = None) -> None:
        counts["commit-before"] += 1
        if point == "commit-before" and counts["commit-before"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, sink)
        counts["commit"] += 1
        if point == "commit" and counts["commit"] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    Transaction.commit = commit  # type: ignore[method-assign]
    out = Path(spec["out"])
    out.mkdir(exist_ok=True)

    def save(name: str, table: pa.Table) -> None:
        tmp = out / f".{name}.tmp"
        with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        os.replace(tmp, out / f"{name}.arrow")

    d = data(seed=7)
    with joinstate.StateStore(spec["path"]) as store:
        p = build(store)
        if p.phase != "live":
            population.populate(
                p, sources=d, progress=False, batch_rows=800, resume=spec["resume"],
                sink=lambda o, b: save(f"{b.side}-{b.index}", o["per_year"]),
            )
        for i, (source, delta) in enumerate(live_batches(d)):
            outs = p.push(source, delta, commit_id=f"live-{i}")
            save(f"live-{i}", outs["per_year"])
    print(json.dumps(counts))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
