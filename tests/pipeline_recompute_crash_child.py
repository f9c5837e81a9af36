"""Child process of ``tests/test_pipeline_recompute.py``'s kill -9 test: one pipeline recompute.

Usage: ``python tests/pipeline_recompute_crash_child.py '<json>'`` with keys ``path`` (a
store holding the window pipeline of :func:`test_pipeline_recompute.window_graph`,
loaded by the parent), ``kill`` (``[point, n]``) and ``out`` (a JSON file for the outputs,
written once ``apply`` returns).  It applies :func:`test_pipeline_recompute.crash_batch`
to ``sales`` with ``population.apply(strategy="recompute", commit_id="c1")`` and SIGKILLs
itself at the ``n``-th (1-based) arrival at ``point``:

* ``scan``: after a whole-index scan of the recompute path (``scan_probe``);
* ``commit-before`` / ``commit``: around ``Transaction.commit``;
* ``write``: after RocksDB wrote the batch, before the process updated its counters;
* ``record-before`` / ``meta-put``: before the executor records the operators' costs,
  after a cost record is written.

Exits 0 if the point was not reached ``n`` times, printing how often each point was
reached as JSON (``["none", 0]`` gives the parent the menu).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from crash_child import Killer  # the kill-at-the-n-th-arrival harness of the crash tests
from test_pipeline_recompute import crash_batch, window_graph, zset_json

import joinstate
import joinstate.ops.base
from population.apply import apply


def main(spec: dict[str, Any]) -> int:
    killer = Killer(*spec["kill"])
    killer.wrap(joinstate.ops.base, "scan_probe", None, "scan")
    killer.wrap(joinstate.Transaction, "commit", "commit-before", "commit")
    killer.wrap(joinstate.StateStore, "write", None, "write")
    killer.wrap(sys.modules["population.apply"], "record_operators", "record-before", None)
    killer.wrap(joinstate.StateStore, "meta_put", None, "meta-put")
    with joinstate.StateStore(spec["path"]) as store:
        p = joinstate.Pipeline(store, "w", window_graph())
        out = apply(p, "sales", crash_batch(), strategy="recompute", commit_id="c1")
        assert isinstance(out, dict)
        Path(spec["out"]).write_text(json.dumps(zset_json(out)))
    print(json.dumps(killer.seen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
