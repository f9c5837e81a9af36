"""One writer per store directory: what a second opener and a restore over it are told.

* A second read-write open raises :class:`~joinstate.StateLockedError` whose message names
  the path, says whether this process or another one holds it and what to do; RocksDB's
  own lock text is only the chained cause.
* ``StateStore.restore(..., replace=True)`` over a store that is open for writing (in
  this process, or in another process that keeps committing) is refused with
  ``StateLockedError`` and changes nothing: the writer goes on, and the directory opens
  afterwards with every one of its commits.  While a restore runs, the directory it
  replaces cannot be opened for writing.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

import joinstate
from joinstate import checkpoint as ck
from joinstate.checkpoint import restoring

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
SIDE = joinstate.Side(SCHEMA, key=["k"])
RAW_LOCK_TEXT = ("lock hold", "Resource temporarily unavailable", "No locks available",
                 "IO error")


def delta(keys: range) -> pa.Table:
    return pa.table({"k": pa.array(list(keys), pa.int64()),
                     "v": pa.array([f"v{k}" for k in keys])})


def make_store(path: Path, rows: int = 50) -> None:
    with joinstate.StateStore(path) as store:
        store.join("j", left=SIDE, right=SIDE).push("left", delta(range(rows)))


def left_rows(path: Path) -> int:
    with joinstate.StateStore(path, read_only=True) as store:
        return store.join("j").rows("left")


def assert_clean_lock_message(exc: BaseException, path: Path, who: str) -> None:
    msg = str(exc)
    assert isinstance(exc, joinstate.StateLockedError), repr(exc)
    assert str(path) in msg, msg
    assert who in msg, msg
    assert "read_only=True" in msg, msg
    for raw in RAW_LOCK_TEXT:
        assert raw not in msg, msg
    # RocksDB's own words, when it was RocksDB that refused, only as the cause (a holder
    # in this process is known without asking RocksDB).
    if who == "another process":
        assert exc.__cause__ is not None


# ---- the message ------------------------------------------------------------------------


def test_second_open_in_this_process_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with joinstate.StateStore(path):
        with pytest.raises(joinstate.StateLockedError) as info:
            joinstate.StateStore(path)
        assert_clean_lock_message(info.value, path, "this process")
        assert "another process" not in str(info.value)
    with joinstate.StateStore(path):  # released on close
        pass


HOLD = """
import sys, time
import joinstate
store = joinstate.StateStore(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
store.close()
"""


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A store held open for writing by another process until the test ends."""
    path = tmp_path / "held"
    make_store(path)
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "open"
        yield path
        child.communicate("\n", timeout=60)
        assert child.returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def test_second_open_from_another_process_says_so(held: Path) -> None:
    with pytest.raises(joinstate.StateLockedError) as info:
        joinstate.StateStore(held)
    assert_clean_lock_message(info.value, held, "another process")
    with joinstate.StateStore(held, read_only=True) as ro:  # the advertised remedy works
        assert ro.join("j").rows("left") == 50


# ---- restore over a store that is open -----------------------------------------------------


WRITER = """
import sys, time
from pathlib import Path
import pyarrow as pa
import joinstate
path, stop = sys.argv[1], Path(sys.argv[2])
side = joinstate.Side(pa.schema([("k", pa.int64()), ("v", pa.string())]), key=["k"])
n = 0
with joinstate.StateStore(path) as store:
    j = store.join("j", left=side, right=side)
    print("open", flush=True)
    while not stop.exists():
        k = 10_000 + n
        j.push("left", pa.table({"k": pa.array([k], pa.int64()), "v": [f"w{k}"]}))
        store.flush()
        n += 1
        time.sleep(0.005)
print(n, flush=True)
"""


def test_restore_over_a_store_another_process_writes_is_refused(tmp_path: Path) -> None:
    path, remote, stop = tmp_path / "s", tmp_path / "remote", tmp_path / "stop"
    make_store(path)
    with joinstate.StateStore(path) as store:
        store.checkpoint(str(remote))
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(stop)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        time.sleep(0.2)  # the writer is committing (and flushing SST files)
        with pytest.raises(joinstate.StateLockedError) as info:
            joinstate.StateStore.restore(str(remote), path, replace=True)
        assert_clean_lock_message(info.value, path, "another process")
        assert "restore" in str(info.value)
        time.sleep(0.2)  # the writer keeps committing after the refused restore
        stop.touch()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    pushes = int(out.strip().splitlines()[-1])
    assert pushes > 0
    # Nothing was replaced under the writer: the directory opens with all its commits.
    with joinstate.StateStore(path) as store:
        assert store.join("j").rows("left") == 50 + pushes
        store.verify()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".s.")]
    # With the writer gone the same restore goes through and gives the checkpoint.
    with joinstate.StateStore.restore(str(remote), path, replace=True) as restored:
        assert restored.join("j").rows("left") == 50


def test_restore_over_a_store_open_in_this_process_is_refused(tmp_path: Path) -> None:
    path, remote = tmp_path / "s", tmp_path / "remote"
    make_store(path)
    with joinstate.StateStore(path) as store:
        store.checkpoint(str(remote))
        store.join("j").push("left", delta(range(100, 110)))
        with pytest.raises(joinstate.StateLockedError) as info:
            joinstate.StateStore.restore(str(remote), path, replace=True)
        assert_clean_lock_message(info.value, path, "this process")
        # The open store is untouched and goes on.
        store.join("j").push("left", delta(range(110, 120)))
        assert store.join("j").rows("left") == 70
    assert left_rows(path) == 70
    ck.restore(str(remote), path, replace=True)
    assert left_rows(path) == 50


def test_a_running_restore_holds_the_directory(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """While the files download, the store being replaced cannot be opened for writing."""
    path, remote = tmp_path / "s", tmp_path / "remote"
    make_store(path)
    with joinstate.StateStore(path) as store:
        store.checkpoint(str(remote))
        store.join("j").push("left", delta(range(100, 130)))  # the target differs
    seen: list[str] = []
    once = threading.Lock()
    original = restoring._get_file  # noqa: SLF001 - the download step: act in the middle of it

    def get_file(*args: object) -> None:
        with once:  # downloads run on several threads: look once, from the first
            if not seen:
                check()
        original(*args)  # type: ignore[arg-type]

    def check() -> None:
        with pytest.raises(joinstate.StateLockedError) as here:
            joinstate.StateStore(path)
        seen.append(str(here.value))
        child = subprocess.run(
            [sys.executable, "-c", "import sys, joinstate\n"
             "try:\n    joinstate.StateStore(sys.argv[1])\n"
             "except joinstate.StateLockedError as e:\n    print(e); sys.exit(3)\n",
             str(path)], cwd=REPO, capture_output=True, text=True, check=False,
            timeout=120)
        assert child.returncode == 3, (child.stdout, child.stderr)
        seen.append(child.stdout)

    monkeypatch.setattr(restoring, "_get_file", get_file)
    ck.restore(str(remote), path, replace=True)
    assert len(seen) == 2 and all(str(path) in s for s in seen), seen
    assert "restor" in seen[0]
    assert left_rows(path) == 50


def test_a_store_dropped_without_close_does_not_hold_the_directory(tmp_path: Path) -> None:
    """Once RocksDB let go of a store nobody closed, this process may open it again."""
    path = tmp_path / "s"
    make_store(path)
    store = joinstate.StateStore(path)
    store.join("j").push("left", delta(range(100, 105)))
    del store
    gc.collect()
    with joinstate.StateStore(path) as again:
        assert again.join("j").rows("left") == 55


RESTORE_CHILD = """
import os, signal, sys
from joinstate import checkpoint as ck
from joinstate.checkpoint import restoring
remote, path, point = sys.argv[1:4]
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if point == "download":
    restoring._get_file = die
else:  # just after the new directory took the old one's place
    inner = restoring._exchange
    def exchange(a, b):
        done = inner(a, b)
        die()
        return done
    restoring._exchange = exchange
ck.restore(remote, path, replace=True)
"""


@pytest.mark.parametrize("point", ["download", "swapped"])
def test_kill_9_during_a_restore_leaves_a_store_that_opens(tmp_path: Path, point: str) -> None:
    path, remote = tmp_path / "s", tmp_path / "remote"
    make_store(path)
    with joinstate.StateStore(path) as store:
        store.checkpoint(str(remote))
        store.join("j").push("left", delta(range(100, 130)))  # the target differs: 80 rows
    child = subprocess.run([sys.executable, "-c", RESTORE_CHILD, str(remote), str(path), point],
                           cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert child.returncode == -9, child.stderr
    assert left_rows(path) == (80 if point == "download" else 50)
    ck.restore(str(remote), path, replace=True)  # cleans what the killed restore left
    assert left_rows(path) == 50
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".s.")]
