"""Stage stores kept open in a Python worker between tasks (``spark_io.storekeeper``).

Without a JVM: a view's operations run stage by stage through the same
:class:`spark_io.dag.StageTask` Spark runs (``keeperdata.View``), in this process and in a
second worker process (``keeper_child.py``), so the hand-over between two workers is
real: two processes, one RocksDB LOCK.

* a task uses the store its worker kept, with the same outputs as opening it afresh;
* a task whose store another worker keeps runs in that worker (same host);
* a task that takes a store over (no delegation) gets it handed over by the keeper;
* a keeper busy past the bound: ``ShardBusyError`` naming the store and the setting;
* a store held open by hand (not a keeper): refused at once, as before;
* a store directory replaced behind its keeper: the kept handle is not used;
* an operation rolled back in a kept store: the kept pipeline is not reused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from keeperdata import NAME, View, customers, expected, orders, source_orders

import joinstate
import spark_io
from spark_io import storekeeper

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.spark

CHILD = Path(__file__).resolve().parent / "keeper_child.py"


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    storekeeper.release_all()
    yield
    storekeeper.release_all()


def busy(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in reports if not r.get("idle")]


class Child:
    """The second worker: ``keeper_child.py`` over the same view."""

    def __init__(self, root: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(root)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.pid = int(self.ask(None, "READY").split()[1])

    def ask(self, line: str | None, answer: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        got = self.proc.stdout.readline()
        if not got.startswith(answer):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"child said {got!r}, not {answer}: {err[-3000:]}")
        return got

    def kept(self) -> list[str]:
        return list(json.loads(self.ask("kept", "KEPT")[len("KEPT "):]))

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
            self.proc.communicate(timeout=30)
        elif self.proc.poll() is None:
            self.proc.communicate("exit\n", timeout=30)


@pytest.fixture
def view(tmp_path: Path) -> View:
    v = View(tmp_path)
    v.populate(source_orders(0, 40), customers())
    return v


def test_a_task_uses_the_store_its_worker_kept(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    kept, fresh = View(tmp_path / "kept"), View(tmp_path / "fresh")
    for v, keep in ((kept, "8"), (fresh, "0")):
        monkeypatch.setenv(storekeeper.KEEP_ENV, keep)
        v.populate(source_orders(0, 40), customers())
        first = v.apply("a", "orders", orders(40, 6))
        second = v.apply("b", "orders", orders(3, 4, w=-1))
        if keep == "8":
            assert {r["kept"] for r in busy(first)} == {"kept"}  # population's stores
            assert {r["kept"] for r in busy(second)} == {"kept"}
            assert len(storekeeper.kept_paths()) == len(kept.store_paths())
        else:
            assert {r["kept"] for r in busy(second)} == {"opened"}
            assert not any(str(fresh.root) in p for p in storekeeper.kept_paths())
    want = expected(pa.concat_tables([source_orders(0, 3), source_orders(7, 39)]),
                    customers())
    assert kept.answer() == fresh.answer() == want


def test_a_task_runs_in_the_worker_keeping_its_store(view: View) -> None:
    storekeeper.release_all()
    child = Child(view.root)
    try:
        assert json.loads(child.ask("apply a 40 5", "APPLIED")[len("APPLIED "):])
        assert len(child.kept()) == len(view.store_paths())
        reports = busy(view.apply("b", "orders", orders(45, 5)))
        assert {r["pid"] for r in reports} == {child.pid}  # ran there, on its open stores
        assert {r["kept"] for r in reports} == {"kept"}
        assert storekeeper.kept_paths() == []
        assert len(child.kept()) == len(view.store_paths())
    finally:
        child.close()
    assert view.answer() == expected(source_orders(0, 50), customers())


def test_a_store_another_worker_keeps_is_handed_over(view: View) -> None:
    storekeeper.release_all()
    child = Child(view.root)
    try:
        child.ask("apply a 40 5", "APPLIED")
        assert len(child.kept()) == len(view.store_paths())
        t0 = time.perf_counter()
        reports = busy(view.apply("b", "orders", orders(45, 5), delegate=False))
        assert time.perf_counter() - t0 < 10
        assert {r["pid"] for r in reports} == {os.getpid()}
        assert {r["kept"] for r in reports} == {"opened"}
        taken = {str(p.resolve()) for p in view.store_paths()
                 if any(str(p.resolve()) == k for k in storekeeper.kept_paths())}
        assert taken and not taken & set(child.kept())  # handed over, not shared
        assert not list(view.root.glob("state/stage*/.shard-*.release-*"))
    finally:
        child.close()
    assert view.answer() == expected(source_orders(0, 50), customers())


def test_a_busy_keeper_is_refused_after_the_bound(view: View,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    storekeeper.release_all()
    child = Child(view.root)
    try:
        child.ask("apply a 40 5", "APPLIED")
        child.ask("hold 20", "HOLDING")
        monkeypatch.setenv("JOINSTATE_SPARK_RELEASE_WAIT", "0.5")
        t0 = time.perf_counter()
        with pytest.raises(spark_io.ShardBusyError,
                           match=r"stage 0, shard 0 of pipeline 'per_region' \(.*stage0/"
                                 r"shard-00000\) is already open .* within 0.5 s.*"
                                 r"JOINSTATE_SPARK_RELEASE_WAIT"):
            view.apply("b", "orders", orders(45, 5), delegate=False)
        assert time.perf_counter() - t0 < 5
        assert not (view.outputs / "b").exists()
        assert len(child.kept()) == len(view.store_paths())  # still the child's
    finally:
        child.close(kill=True)
    assert view.answer() == expected(source_orders(0, 45), customers())


def test_a_store_held_open_by_hand_is_refused_at_once(view: View) -> None:
    storekeeper.release_all()
    path = view.store_paths()[0]
    with joinstate.StateStore(path):
        t0 = time.perf_counter()
        with pytest.raises(spark_io.ShardBusyError, match=r"already open .* within 0 s"):
            view.apply("a", "orders", orders(40, 50), delegate=False)
        assert time.perf_counter() - t0 < 5


def test_a_directory_replaced_behind_its_keeper_is_refused_not_used(view: View) -> None:
    storekeeper.release_all()
    saved = view.root / "saved"
    shutil.copytree(view.root / "state", saved)  # closed stores: a consistent copy
    view.apply("a", "orders", orders(40, 5))
    assert {r["kept"] for r in busy(view.apply("b", "orders", orders(45, 5)))} == {"kept"}
    # Every store restored behind the keeper's back (a copy: same IDENTITY, new files).
    for p in view.store_paths():
        shutil.rmtree(p)
        shutil.copytree(saved / p.relative_to(view.root / "state"), p)
    for p in view.outputs.glob("[ab]"):
        shutil.rmtree(p)  # the restored state never saw them
    with pytest.raises(spark_io.SparkIOError, match=r"stage0/shard-00000 was replaced .* "
                       r"did not take its LOCK"):
        view.apply("c", "orders", orders(50, 5))
    assert not (view.outputs / "c").exists()
    storekeeper.release_all()  # the stores not replaced yet when c failed
    # The restored directories are whole (the old handle deleted nothing there): another
    # worker applies to them.
    child = Child(view.root)
    try:
        kept = json.loads(child.ask("apply c 50 5", "APPLIED")[len("APPLIED "):])
        assert set(kept) <= {"opened", None}
    finally:
        child.close()
    assert view.answer() == expected(pa.concat_tables([source_orders(0, 40),
                                                       source_orders(50, 5)]), customers())


def test_a_rollback_in_a_kept_store_is_not_hidden_by_its_pipeline(view: View) -> None:
    view.apply("a", "orders", orders(40, 5))  # kept; its undo recorded
    shutil.rmtree(view.outputs / "a")  # the driver says: a was not committed
    # The same orders again under b, which rolls a back first in every store.
    reports = busy(view.apply("b", "orders", orders(40, 5), rollback=("a",)))
    assert sum(r["undone"] for r in reports) >= 1
    assert all(r["kept"] == "opened" for r in reports if r["undone"])
    assert view.answer() == expected(source_orders(0, 45), customers())
    view.apply("c", "orders", orders(45, 1))
    assert view.answer() == expected(source_orders(0, 46), customers())


def test_a_kept_working_copy_behind_the_committed_checkpoint_is_restored(
        tmp_path: Path) -> None:
    uri = str(tmp_path / "checkpoints")
    here = View(tmp_path, checkpoint_uri=uri, local_dir=str(tmp_path / "executor-a"))
    here.commit(here.populate(source_orders(0, 40), customers()))
    here.commit(here.apply("a", "orders", orders(40, 5)))  # kept here, at a's checkpoints
    reports = here.apply("a2", "orders", orders(45, 1))
    here.commit(reports)
    assert {r["kept"] for r in busy(reports)} == {"kept"}
    # The shards move: another executor (its own working copies) applies b, committed.
    there = View(tmp_path, checkpoint_uri=uri, local_dir=str(tmp_path / "executor-b"))
    there.storage = dataclasses.replace(there.storage, checkpoints=here.storage.checkpoints)
    there.commit(there.apply("b", "orders", orders(46, 5)))
    here.storage = dataclasses.replace(here.storage, checkpoints=there.storage.checkpoints)
    # Back here: the kept copies are behind the committed checkpoints, so not used.
    reports = busy(here.apply("c", "orders", orders(51, 2)))
    assert {r["kept"] for r in reports} == {"opened"}
    assert {r["checkpoint"]["sync"] for r in reports} == {"restored"}
    here.commit(reports)
    assert here.answer() == expected(source_orders(0, 53), customers())
    # Every working copy lost (a disk): the kept handles are closed, the copies restored.
    shutil.rmtree(tmp_path / "executor-a")
    reports = busy(here.apply("d", "orders", orders(53, 2)))
    assert {(r["kept"], r["checkpoint"]["sync"]) for r in reports} == {("opened", "restored")}
    assert here.answer() == expected(source_orders(0, 55), customers())


def test_keeping_is_off_with_zero(view: View, monkeypatch: pytest.MonkeyPatch) -> None:
    storekeeper.release_all()
    monkeypatch.setenv(storekeeper.KEEP_ENV, "0")
    reports = busy(view.apply("a", "orders", orders(40, 5)))
    assert {r["kept"] for r in reports} == {"opened"}
    assert storekeeper.kept_paths() == []
    assert not list(view.root.glob("state/stage*/.shard-*.kept"))
    assert NAME in view.graph.outputs


def test_a_keeper_closing_its_listener_before_accepting_leaves_the_task_to_its_caller(
        tmp_path: Path) -> None:
    """A connection still waiting in the backlog of a keeper that closes its listener
    (it is handing the store over) never reached the keeper: the caller runs the task
    itself, and nothing runs twice."""
    import socket

    store = tmp_path / "shard-00000"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(storekeeper.keeper_address(store))
    listener.listen(1)
    ran: list[int] = []

    def work(n: int) -> list[int]:
        ran.append(n)
        return [n]

    import threading

    def close_soon() -> None:
        time.sleep(0.2)
        listener.close()  # never accepted

    closer = threading.Thread(target=close_soon)
    closer.start()
    try:
        assert storekeeper.delegate(store, work, 7) is None
    finally:
        closer.join()
    assert ran == []
