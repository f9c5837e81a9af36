"""A second Python worker for the store keeper's tests: keeps a view's stores open.

``python keeper_child.py ROOT`` populates nothing; it applies the orders ``FIRST..`` given
by each ``apply OP FIRST N`` line on stdin (so it keeps every store it touched), and
answers:

* ``kept`` -> ``KEPT <json list of the store directories it keeps>``;
* ``hold SECONDS`` -> holds every kept store busy (as a running task would) that long,
  printing ``HOLDING`` first;
* ``exit``.

Each answer is one line; ``READY`` once started.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _release_later(seconds: float, entries: list[Any]) -> None:
    time.sleep(seconds)
    for e in entries:
        e.busy.release()


def main(root: Path) -> None:
    from keeperdata import View, orders

    from spark_io import storekeeper

    view = View(root)
    print(f"READY {os.getpid()}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "apply":
            reports = view.apply(words[1], "orders", orders(int(words[2]), int(words[3])))
            print("APPLIED " + json.dumps([r.get("kept") for r in reports]), flush=True)
        elif words[0] == "kept":
            print("KEPT " + json.dumps(storekeeper.kept_paths()), flush=True)
        elif words[0] == "hold":
            seconds = float(words[1])
            entries = list(storekeeper._KEPT.values())  # noqa: SLF001 - a test's worker
            for e in entries:
                e.busy.acquire()
            print("HOLDING", flush=True)

            threading.Thread(target=_release_later, args=(seconds, entries),
                             daemon=True).start()
        elif words[0] == "exit":
            return


if __name__ == "__main__":
    main(Path(sys.argv[1]))
