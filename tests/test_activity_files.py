"""Reading RocksDB's OPTIONS files never fails a load over files it does not own.

RocksDB writes a new options file as ``OPTIONS-<n>.dbtmp``, renames it to
``OPTIONS-<n>`` and deletes older ones, at any time (every ``SetOptions``, which the
compaction policies call during a load).  The auto-compaction reading must ignore names
that are not RocksDB's finished options files and survive a file vanishing under it.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

import pyarrow as pa

import joinstate
from joinstate.activity import auto_compaction_flags, rocksdb_activity

if TYPE_CHECKING:
    from pathlib import Path

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
SIDE = joinstate.Side(SCHEMA, key=["k"])


def make(path: Path) -> tuple[joinstate.StateStore, str]:
    store = joinstate.StateStore(path)
    j = store.join("j", left=SIDE, right=SIDE)
    j.push("left", pa.table({"k": pa.array(range(100), pa.int64()),
                             "v": [str(i) for i in range(100)]}))
    cf = j.index("left").column_family
    store.set_cf_options(cf, {"disable_auto_compactions": "true"})
    return store, cf


def newest_options(path: Path) -> tuple[int, Path]:
    found = [(int(m.group(1)), p) for p in path.iterdir()
             if (m := re.fullmatch(r"OPTIONS-(\d+)", p.name))]
    return max(found)


def test_foreign_and_temporary_names_are_ignored(tmp_path: Path) -> None:
    store, cf = make(tmp_path / "s")
    try:
        want = auto_compaction_flags(store.path)
        assert want[cf] is True
        _, real = newest_options(store.path)
        # RocksDB's temporary file (a newer number, half written), and names that only
        # look like options files.
        (store.path / "OPTIONS-999999.dbtmp").write_text("[CFOptions \"")
        (store.path / "OPTIONS-").write_text("")
        (store.path / "OPTIONS-abc").write_text("junk")
        (store.path / "OPTIONS-000001.bak").write_text(real.read_text())
        assert auto_compaction_flags(store.path) == want
        assert rocksdb_activity(store)["cf"][cf]["auto_compaction_disabled"] is True
        assert store.join("j").stats()["left"]["rows"] == 100
    finally:
        store.close()


def test_options_files_replaced_while_reading(tmp_path: Path) -> None:
    """A writer that keeps publishing and deleting options files, as RocksDB does."""
    store, cf = make(tmp_path / "s")
    stop = threading.Event()
    errors: list[BaseException] = []
    n0, real = newest_options(store.path)
    text = real.read_text()

    def churn() -> None:
        n = n0 + 1000
        try:
            while not stop.is_set():
                tmp = store.path / f"OPTIONS-{n:06d}.dbtmp"
                tmp.write_text(text)
                tmp.rename(store.path / f"OPTIONS-{n:06d}")
                old = store.path / f"OPTIONS-{n - 1:06d}"
                old.unlink(missing_ok=True)
                n += 1
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        want = {cf: True}
        for _ in range(3000):
            got = auto_compaction_flags(store.path)
            assert got.get(cf) is True, got
        for _ in range(200):
            assert rocksdb_activity(store, [cf])["cf"][cf]["auto_compaction_disabled"] \
                == want[cf]
    finally:
        stop.set()
        worker.join()
        store.close()
    assert not errors, errors
