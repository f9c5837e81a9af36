"""Child process of ``tests/test_window.py``'s crash test: push a window pipeline's
change stream with commit ids and SIGKILL itself at the ``n``-th transaction commit.

Usage: ``python tests/window_crash_child.py '<json>'`` with ``path`` (the store),
``out`` (where ``read()`` is written, as Arrow IPC, when every push is done), ``seed``
and ``kill``: ``[point, n]``, point ``commit-before`` / ``commit`` (before / after a
``Transaction.commit``) or ``none``.  A rerun pushes every batch again with the same
commit ids: those that committed are replayed from their records, the rest applied.
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

from test_window import SCHEMA, changes, table_of

import joinstate as js
from joinstate.transaction import Transaction


def graph() -> js.Graph:
    t = js.source("t", SCHEMA)
    w = t.window(["g"], [("x", "descending")], top={"rk": 2}, rk=("rank",),
                 s=("sum", "y"))
    return js.Graph().output("out", w, materialize=True)


def main(spec: dict[str, Any]) -> None:
    point, n = spec["kill"]
    counts = {"commit-before": 0, "commit": 0}
    original = Transaction.commit

    def commit(self: Transaction, *args: Any, **kwargs: Any) -> None:
        counts["commit-before"] += 1
        if point == "commit-before" and counts["commit-before"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, *args, **kwargs)
        counts["commit"] += 1
        if point == "commit" and counts["commit"] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    Transaction.commit = commit  # type: ignore[method-assign]
    with js.StateStore(spec["path"]) as store:
        p = js.Pipeline(store, "w", graph())
        for i, batch in enumerate(changes(spec["seed"])):
            p.push("t", table_of([r for r, _ in batch], [w for _, w in batch]),
                   commit_id=f"b{i}")
        p.verify()
        table = p.read("out")
    with pa.OSFile(spec["out"], "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    print(json.dumps({"commit": counts["commit"]}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
