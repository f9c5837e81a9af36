"""Child process of ``tests/test_recompute_crash.py``: one recompute, kill -9 at a chosen point.

Usage: ``python tests/recompute_crash_child.py '<json>'`` with keys ``path`` (a store the
parent populated with :func:`initial`), ``how``, ``side``, ``kill`` (``[point, n]``) and
``out`` (where the output goes, as an Arrow IPC file, once ``apply`` returns).  It applies
:func:`batch` to ``side`` with ``population.apply(strategy="recompute",
commit_id="c1")`` and SIGKILLs itself at the ``n``-th (1-based) arrival at ``point``.
The points are wrappers installed here only (monkey patches of this process):

* ``scan-before`` / ``scan``: around ``Join.scan`` (the batch, then each snapshot);
* ``output``: after ``population.recompute.output_from_scans`` (nothing written yet);
* ``commit-before`` / ``commit``: around ``Transaction.commit``;
* ``write``: after the RocksDB ``WriteBatch`` is written, inside the commit, before the
  in-memory counters and derived structures are updated;
* ``record-before`` / ``meta-put``: before the executor records the batch's cost, after
  the record is written.

Exits 0 if the point was not reached ``n`` times, printing how often each point was
reached as JSON (``["none", 0]`` gives the parent the menu).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from crash_child import Killer  # the kill-at-the-n-th-arrival harness of the join crash tests

import joinstate
import population.recompute
from population.apply import apply

JOIN = "j"
CUSTOMER = pa.schema([("c_id", pa.int64()), ("c_name", pa.string())])
SALES = pa.schema([("s_customer", pa.int64()), ("s_item", pa.int32()), ("s_paid", pa.float64())])


def sides() -> tuple[joinstate.Side, joinstate.Side]:
    return (joinstate.Side(CUSTOMER, ["c_id"], ["c_id"]), joinstate.Side(SALES, ["s_customer"]))


def initial() -> tuple[pa.Table, pa.Table]:
    """300 customers (one with a NULL id) and 3,000 sales over 330 ids (some NULL)."""
    ids = [*range(299), None]
    customers = pa.table({"c_id": pa.array(ids, pa.int64()),
                          "c_name": [f"n{i}" for i in range(300)]}, schema=CUSTOMER)
    cust = [None if i % 97 == 0 else (i * 7) % 330 for i in range(3000)]
    sales = pa.table({"s_customer": pa.array(cust, pa.int64()),
                      "s_item": pa.array([i % 13 for i in range(3000)], pa.int32()),
                      "s_paid": [float(i % 50) for i in range(3000)]}, schema=SALES)
    return customers, sales


def batch(side: str) -> pa.Table:
    """A valid batch to ``side``: deletes of stored rows, inserts (duplicates, NULL keys)."""
    customers, sales = initial()
    if side == "left":  # 40 updates (-old, +new), 20 deletes, 30 new customers
        old = customers.slice(0, 60)
        new = pa.table({"c_id": pa.array(list(range(40)) + list(range(400, 430)), pa.int64()),
                        "c_name": [f"m{i}" for i in range(70)]}, schema=CUSTOMER)
        rows = pa.concat_tables([old, new])
        w = [-1] * 60 + [1] * 70
    else:  # 500 deletes, 600 inserts (200 of them duplicates of one another)
        gone = sales.slice(1000, 500)
        cust = [None if i % 50 == 0 else (i * 11) % 350 for i in range(400)]
        new = pa.table({"s_customer": pa.array(cust + cust[:200], pa.int64()),
                        "s_item": pa.array([99] * 600, pa.int32()),
                        "s_paid": [1.5] * 600}, schema=SALES)
        rows = pa.concat_tables([gone, new])
        w = [-1] * 500 + [1] * 600
    return rows.append_column("_weight", pa.array(w, pa.int64()))


def main(spec: dict[str, Any]) -> int:
    killer = Killer(*spec["kill"])
    killer.wrap(joinstate.Join, "scan", "scan-before", "scan")
    killer.wrap(population.recompute, "output_from_scans", None, "output")
    killer.wrap(joinstate.Transaction, "commit", "commit-before", "commit")
    killer.wrap(joinstate.StateStore, "write", None, "write")
    executor = sys.modules["population.apply"]
    killer.wrap(executor, "record_batch", "record-before", None)
    killer.wrap(joinstate.StateStore, "meta_put", None, "meta-put")
    with joinstate.StateStore(spec["path"]) as store:
        join = store.join(JOIN)
        out = apply(join, spec["side"], batch(spec["side"]), strategy="recompute",
                    commit_id="c1")
        assert isinstance(out, pa.Table)
        with pa.OSFile(str(Path(spec["out"])), "wb") as f, pa.ipc.new_file(f, out.schema) as w:
            w.write_table(out)
    print(json.dumps(killer.seen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
