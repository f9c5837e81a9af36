"""Population pushes that write their blind inserts as ingested SST files.

The path exists to save the memtable insert, flush and compactions of rows written
once; it must leave exactly the store the WriteBatch path leaves, fall back to the
WriteBatch where it cannot apply (deletes, undo capture, small writes), and a failure
must leave nothing behind.  (Crash points around it: tests/test_pipeline_crash.py.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from faults import dump_store
from test_population_pipeline import build, data, live_batches

import joinstate
import joinstate.transaction
import population
from joinstate.db import Database
from joinstate.intents import STAGING

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa


def _populate(path: Path, min_rows: int | None, monkeypatch: pytest.MonkeyPatch,
              calls: list[int] | None = None) -> dict[str, pa.Table]:
    with monkeypatch.context() as m:
        if min_rows is None:  # the WriteBatch path only
            m.setattr(joinstate.transaction.Transaction, "ingest_into",
                      lambda self, *a, **k: None)
        else:
            m.setattr(joinstate.transaction, "INGEST_MIN_ROWS", min_rows)
        if calls is not None:
            inner = Database.write_then_ingest

            def counted(self: Database, wb: Any, files: Any) -> None:
                calls.append(sum(len(v) for v in files.values()))
                inner(self, wb, files)

            m.setattr(Database, "write_then_ingest", counted)
        with joinstate.StateStore(path) as store:
            p = build(store)
            population.populate(p, sources=data(seed=3), progress=False, batch_rows=700)
            outs = {}
            for i, (s, d) in enumerate(live_batches(data(seed=3))):
                outs[f"{i}"] = p.push(s, d)["per_year"]
            return outs


def test_sst_pushes_leave_the_store_the_write_batch_leaves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    a = _populate(tmp_path / "files", 1, monkeypatch, calls)
    b = _populate(tmp_path / "batch", None, monkeypatch)
    assert len(calls) >= 6 and all(n >= 2 for n in calls), calls  # the path was taken
    assert a == b  # live pushes afterwards see the same state
    assert _state(tmp_path / "files") == _state(tmp_path / "batch")
    assert not (tmp_path / "files" / STAGING).exists() or \
        not any((tmp_path / "files" / STAGING).iterdir())


def _state(path: Path) -> dict[str, dict[bytes, bytes]]:
    """The store's bytes but the planner's timing records (measured, so never equal)."""
    out = dump_store(path)
    out["__meta__"] = {k: v for k, v in out["__meta__"].items() if b'"updated"' not in v}
    return out


def test_small_writes_stay_in_the_write_batch(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    _populate(tmp_path / "s", 10**9, monkeypatch, calls)
    assert calls == []


def test_live_pushes_and_undo_capture_never_ingest(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    with monkeypatch.context() as m:
        m.setattr(joinstate.transaction, "INGEST_MIN_ROWS", 1)
        inner = Database.write_then_ingest

        def counted(self: Database, wb: Any, files: Any) -> None:
            calls.append(1)
            inner(self, wb, files)

        m.setattr(Database, "write_then_ingest", counted)
        with joinstate.StateStore(tmp_path / "s") as store:
            p = build(store)
            d = data(seed=4)
            p.push("customer", d["customer"])
            p.push("date_dim", d["date_dim"])
            p.push("sales", d["sales"])  # a live push: no ingest= given
            assert calls == []
            s = d["sales"].slice(0, 100)
            with store.capturing_undo(b"t", b"note"):
                p.push("sales", s, ingest=p.column_families())
            assert calls == []  # undo needs a WriteBatch
            p.push("sales", s, ingest=p.column_families())
            assert calls == [1]


def test_a_failed_file_write_leaves_nothing(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import joinstate.sstfiles

    path = tmp_path / "s"
    d = data(seed=5)
    with joinstate.StateStore(path) as store:
        p = build(store)
        for s in ("customer", "date_dim"):
            p.push(s, d[s])
    before = dump_store(path)

    def full(*_: Any) -> int:
        raise OSError(28, "No space left on device")

    with joinstate.StateStore(path) as store:
        p = build(store)
        with monkeypatch.context() as m:
            m.setattr(joinstate.transaction, "INGEST_MIN_ROWS", 1)
            m.setattr(joinstate.sstfiles, "write_sst", full)
            with pytest.raises(joinstate.JoinStateError, match="No space left"):
                p.push("sales", d["sales"], ingest=p.column_families())
    assert dump_store(path) == before
    assert not any((path / STAGING).glob("*.sst"))
    with joinstate.StateStore(path) as store:
        p = build(store)
        p.push("sales", d["sales"], ingest=p.column_families())  # then it applies
