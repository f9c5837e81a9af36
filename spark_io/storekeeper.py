"""Stage stores kept open in an executor's Python worker, from one task to the next.

PySpark reuses its Python workers (``spark.python.worker.reuse``, the default), so a
worker runs many tasks.  Opening a stage store costs far more than a small operation's
work: RocksDB opens the directory twice (a read-only check of its files, then the
writer), the pipeline rebuilds what it keeps in memory (probe caches, entry maps), and
closing saves that again.  A worker therefore keeps each store it opened, with its
compiled :class:`joinstate.Pipeline`, and the next task on that store uses them as
they are (:func:`stage_store`).

**When a kept store is used.**  Only when it is exactly the state the operation
expects, which is decided by durable facts, never by time:

* the worker holds the directory's RocksDB LOCK all along, so no other process wrote
  to it;
* the directory is still the one it opened: its ``IDENTITY`` (written by RocksDB when
  the store was created) and its ``LOCK`` file are the same.  A directory replaced
  behind the worker's back (by something that ignored its LOCK) is refused with a
  :class:`~spark_io.errors.SparkIOError`: the old handle is never used again, nor
  closed (RocksDB's close would delete the new store's files), so this worker cannot
  open that store again, and Spark retries the task in another.  A directory that is
  simply gone (a lost disk) is closed and opened afresh (restored from its checkpoint);
* with checkpoints, the working copy is at the checkpoint the driver's manifest
  commits for it (the id the worker's last task reported); else it is closed and
  opened as that checkpoint (restored);
* an operation whose undo plan rolls something back in this store gets it freshly
  opened (the rollback rewrites state the kept pipeline holds in memory);
* any error inside a task closes the store.

**Hand-over** (:mod:`spark_io.handover`).  A task in another process that needs a kept
store asks for it; the worker's keeper thread closes it as soon as it is idle.  On the
same host (Linux), a task first offers its work to the worker keeping its store
(:func:`delegate`): the keeper thread runs the task there, on the open store, and sends
back what it yields, so a store stays where it is whichever worker Spark picks for the
task.  The socket is an abstract Unix socket named from the store's path; only
processes of the same user are served.

A killed worker loses what it kept: RocksDB reopens from its write-ahead log, and the
derived state is rebuilt.  ``$JOINSTATE_SPARK_KEEP_STORES`` bounds how many stores one
worker keeps (default :data:`KEEP_DEFAULT`; ``0`` keeps none, every task opens and
closes its store as before); a worker Spark does not reuse keeps none.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import cloudpickle

from joinstate import Pipeline, StateStore
from joinstate.transaction import undo_tags
from spark_io import handover
from spark_io._worker import OpenShard, UndoPlan, in_operation, open_raw
from spark_io.errors import ShardBusyError, SparkIOError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from joinstate import Graph, StoreOptions
    from spark_io.manifest import ShardStorage

__all__ = [
    "KEEP_DEFAULT",
    "KEEP_ENV",
    "TICK",
    "delegate",
    "keeper_address",
    "kept_paths",
    "release_all",
    "stage_store",
]

log = logging.getLogger(__name__)

KEEP_ENV = "JOINSTATE_SPARK_KEEP_STORES"
KEEP_DEFAULT = 8
"""Stores one Python worker keeps open at most (the least recently used one goes).

A kept store keeps its memory: its block cache (``StoreOptions.block_cache_size``) and
memtables, and what its pipelines hold in memory."""
TICK = 0.05
"""Seconds between two looks of the keeper thread at release requests."""
_HEADER = struct.Struct(">Q")
_ACK = b"\x06"
"""Sent by a keeper once it holds a delegated task whole, before it runs it."""


def _capacity() -> int:
    """How many stores this process keeps (0: none).

    None in a Spark task whose Python worker is not reused (``SPARK_REUSE_WORKER``
    unset): it exits after the task, without closing what it kept.
    """
    if os.environ.get("SPARK_REUSE_WORKER") is None and _in_spark_task():
        return 0
    raw = os.environ.get(KEEP_ENV)
    if raw is None:
        return KEEP_DEFAULT
    try:
        return max(0, int(raw))
    except ValueError:
        return KEEP_DEFAULT


@dataclass(eq=False)
class _Kept:
    """One store kept open, with the pipelines compiled on it."""

    path: Path
    key: str
    store: StateStore
    identity: tuple[bytes, int]
    checkpoint: str | None
    pipelines: dict[tuple[str, str], Pipeline] = field(default_factory=dict)
    busy: threading.Lock = field(default_factory=threading.Lock)
    listener: socket.socket | None = None
    used: float = 0.0
    closed: bool = False


_KEPT: dict[str, _Kept] = {}
_GUARD = threading.Lock()
_ABANDONED: list[StateStore] = []
"""Handles on directories replaced behind this process: never used or closed again."""
_keeper: threading.Thread | None = None


def _name(path: Path) -> str:
    return str(path.resolve())


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def _identity(path: Path) -> tuple[bytes, int] | None:
    """What makes ``path`` the directory a store was opened on: IDENTITY, LOCK's inode."""
    try:
        return (path / "IDENTITY").read_bytes(), os.stat(path / "LOCK").st_ino
    except OSError:
        return None


def kept_paths() -> list[str]:
    """The store directories this process keeps open (for tests and diagnosis)."""
    with _GUARD:
        return sorted(_KEPT)


# ---- closing --------------------------------------------------------------------------------

def _close(entry: _Kept) -> None:
    """Close a kept store (the caller holds ``entry.busy`` or owns the entry alone)."""
    with _GUARD:
        if _KEPT.get(_name(entry.path)) is entry:
            del _KEPT[_name(entry.path)]
    if entry.closed:
        return
    if _identity(entry.path) != entry.identity and entry.path.exists():
        _abandon(entry)  # closing it would delete files of the directory now there
        return
    entry.closed = True
    _stop_listening(entry)
    entry.pipelines.clear()
    try:
        entry.store.close()  # detaches the pipelines: their derived state is saved
    finally:
        handover.withdraw(entry.path)


def _abandon(entry: _Kept) -> SparkIOError:
    """Drop a store whose directory was replaced behind this process; the error to raise.

    The old handle is never used, and never closed: RocksDB's close deletes the files of
    its directory it does not know, which are now the new store's.  So it stays open,
    unreferenced by anything that could drop it, until the process exits, and this
    process cannot open the new directory (RocksDB refuses a second handle on one path
    in a process); other processes can.
    """
    with _GUARD:
        if _KEPT.get(_name(entry.path)) is entry:
            del _KEPT[_name(entry.path)]
    entry.closed = True
    _stop_listening(entry)
    entry.pipelines.clear()
    _ABANDONED.append(entry.store)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(entry.store))  # never freed: never closed
    log.warning("store %s was replaced while this process kept it open; its old handle "
                "is left open and unused", entry.path)
    return SparkIOError(
        f"store {entry.path} was replaced (its RocksDB IDENTITY or LOCK file changed) while "
        f"this Python worker (pid {os.getpid()}) kept it open, by something that did not "
        "take its LOCK; this worker leaves its old handle unused and cannot open the new "
        "directory (closing the old handle would delete the new store's files). Spark "
        "retries the task in another worker; replace store directories only while no "
        "Spark application uses them")


def _release_local(path: Path) -> None:
    """Close the store at ``path`` if this process keeps it (another needs it)."""
    with _GUARD:
        entry = _KEPT.get(_name(path))
    if entry is None:
        return
    if not entry.busy.acquire(timeout=handover.release_wait()):
        raise ShardBusyError(
            f"store {path} is in use by another task of this Python worker for over "
            f"{handover.release_wait():g} s; run one operation at a time per state_dir")
    try:
        _close(entry)
    finally:
        entry.busy.release()


def release_all() -> None:
    """Close every store this process keeps (tests; a worker about to stop)."""
    with _GUARD:
        entries = list(_KEPT.values())
    for entry in entries:
        with entry.busy:
            _close(entry)


handover.set_local_release(_release_local)


# ---- using a kept store ---------------------------------------------------------------------

def _take(storage: ShardStorage, key: str, path: Path) -> _Kept | None:
    """The kept store at ``path``, busy for the caller, if it is valid (module docstring)."""
    with _GUARD:
        entry = _KEPT.get(_name(path))
    if entry is None:
        return None
    if not entry.busy.acquire(timeout=handover.release_wait()):
        raise ShardBusyError(
            f"store {path} is in use by another task of this Python worker for over "
            f"{handover.release_wait():g} s; run one operation at a time per state_dir")
    try:
        if entry.closed:
            entry.busy.release()
            return None
        if _identity(path) != entry.identity:
            if not path.exists():  # gone (a lost disk): closing the handle harms nothing
                _close(entry)
                entry.busy.release()
                return None
            raise _abandon(entry)
        if storage.checkpoint_uri is not None and \
                storage.checkpoints.get(key) != entry.checkpoint:
            _close(entry)  # the driver committed another checkpoint: open that one
            entry.busy.release()
            return None
    except BaseException:
        if entry.busy.locked():
            entry.busy.release()
        raise
    return entry


def _rolls_back(store: StateStore, undo: UndoPlan | None) -> bool:
    """Whether settling ``undo`` in ``store`` rolls an operation back."""
    if undo is None or not undo.rollback:
        return False
    for tag in undo_tags(store):
        owner, _, op = tag.partition(":")
        if owner == undo.owner and op in undo.rollback:
            return True
    return False


def _keep(entry: _Kept) -> None:
    """Register ``entry`` (busy, held by the caller) as kept; the LRU store beyond goes."""
    with _GUARD:
        _KEPT[_name(entry.path)] = entry
        idle = sorted((e for e in _KEPT.values() if e is not entry), key=lambda e: e.used)
        excess = len(_KEPT) - _capacity()
    for old in idle[:max(0, excess)]:
        if old.busy.acquire(blocking=False):
            try:
                _close(old)
            finally:
                old.busy.release()
    handover.advertise(entry.path)
    _listen(entry)
    _start_keeper()


@contextmanager
def stage_store(storage: ShardStorage, key: str, options: StoreOptions | None, *,
                pipeline: str, graph: Graph, undo: UndoPlan | None = None,
                owner: str = "", hint: str = "", fresh: bool = False,
                report: dict[str, Any] | None = None) -> Iterator[tuple[OpenShard, Pipeline]]:
    """Store ``key`` and pipeline ``pipeline`` (``graph``) compiled on it, for a task.

    A store this process keeps is used when valid (module docstring), else it is
    opened (:func:`spark_io._worker.open_raw`: handed over by another process if need
    be).  The block runs as the task's work (:func:`spark_io._worker.in_operation`:
    ``undo`` settled and captured, a checkpoint after writes).  After a clean exit the
    store stays open in this process (unless keeping is off); after an error it is
    closed.  A kept pipeline is used for the same definition only (``graph.spec()``);
    ``fresh`` opens anew (a population, which starts from a wiped directory).
    ``report["kept"]`` says ``"kept"`` (used as it was) or ``"opened"``.
    """
    path = storage.local_path(key)
    keep = _capacity() > 0
    graph_key = (pipeline, hashlib.sha1(json.dumps(graph.spec(), sort_keys=True,
                                                   default=str).encode()).hexdigest())
    entry = None if fresh or not keep else _take(storage, key, path)
    if entry is not None:
        try:
            stale = _rolls_back(entry.store, undo) or any(
                k != graph_key and k[0] == pipeline for k in entry.pipelines)
            if stale:  # its pipelines' memory would not match the state: open anew
                _close(entry)
        except BaseException:
            entry.busy.release()
            raise
        if entry.closed:
            entry.busy.release()
            entry = None
    if report is not None:
        report["kept"] = "kept" if entry is not None else "opened"
    if entry is None:
        shard = open_raw(storage, key, options, owner=owner, hint=hint)
        identity = _identity(path)
        if not keep or identity is None:
            with shard.store, in_operation(storage, shard, undo, False, owner), \
                    shard.store.families_together():
                pipe = Pipeline(shard.store, pipeline, graph)
                pipe.compile()
                yield shard, pipe
            return
        entry = _Kept(path, key, shard.store, identity, shard.checkpoint)
        entry.busy.acquire()
    else:
        shard = OpenShard(entry.store, key, "kept", entry.checkpoint)
    try:
        # A new store's families are created together, with the options the task's
        # population gives them before its first write (Database.families_together).
        with in_operation(storage, shard, undo, False, owner), \
                entry.store.families_together():
            compiled = entry.pipelines.get(graph_key)
            if compiled is None:
                compiled = Pipeline(entry.store, pipeline, graph)
                compiled.compile()
                entry.pipelines[graph_key] = compiled
            yield shard, compiled
    except BaseException:
        try:
            _close(entry)
        finally:
            entry.busy.release()
        raise
    entry.checkpoint = shard.checkpoint
    entry.used = time.monotonic()
    try:
        with _GUARD:
            known = _KEPT.get(_name(path)) is entry
        if not known and not entry.closed:
            _keep(entry)
    finally:
        entry.busy.release()


# ---- the keeper thread: release requests, delegated tasks ---------------------------------

def _start_keeper() -> None:
    global _keeper
    with _GUARD:
        if _keeper is not None and _keeper.is_alive():
            return
        _keeper = threading.Thread(target=_keeper_loop, name="joinstate-store-keeper",
                                   daemon=True)
        _keeper.start()


def _keeper_loop() -> None:
    while True:
        with _GUARD:
            entries = list(_KEPT.values())
        listeners = [e.listener for e in entries if e.listener is not None]
        ready: list[Any] = []
        if listeners:
            try:
                ready, _, _ = select.select(listeners, [], [], TICK)
            except (OSError, ValueError):  # a listener closed meanwhile
                ready = []
        else:
            time.sleep(TICK)
        for sock in ready:
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            threading.Thread(target=_serve, args=(conn,), name="joinstate-delegated",
                             daemon=True).start()
        wanted: dict[Path, set[str]] = {}
        for entry in entries:
            folder = entry.path.parent
            if folder not in wanted:  # one listing per directory of stores
                wanted[folder] = handover.requested(folder)
            if entry.closed or entry.path.name not in wanted[folder]:
                continue
            if entry.busy.acquire(blocking=False):
                try:
                    _close(entry)
                except Exception as exc:  # the requester opens it from its WAL anyway
                    log.warning("closing kept store %s for another process: %s",
                                entry.path, exc)
                finally:
                    entry.busy.release()


def keeper_address(path: Path) -> str:
    """The abstract Unix socket on which the worker keeping store ``path`` takes tasks."""
    digest = hashlib.sha1(f"{os.getuid()}:{_name(path)}".encode()).hexdigest()[:32]
    return f"\0joinstate-store-{digest}"


def _can_delegate() -> bool:
    return sys.platform.startswith("linux")


def _listen(entry: _Kept) -> None:
    if not _can_delegate():
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(keeper_address(entry.path))
        sock.listen(8)
        sock.setblocking(False)
    except OSError:  # another process still listens for it (handing it over): no matter
        sock.close()
        return
    entry.listener = sock


def _stop_listening(entry: _Kept) -> None:
    sock, entry.listener = entry.listener, None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


def _send(conn: socket.socket, obj: Any) -> None:
    # cloudpickle, as Spark ships tasks: a task whose class Spark sent by value goes too.
    blob = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(_HEADER.pack(len(blob)) + blob)


def _recv(conn: socket.socket) -> Any:
    head = _recv_exactly(conn, _HEADER.size)
    (n,) = _HEADER.unpack(head)
    return pickle.loads(_recv_exactly(conn, n))  # a process of this user (checked)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    parts = bytearray()
    while len(parts) < n:
        chunk = conn.recv(min(n - len(parts), 1 << 20))
        if not chunk:
            msg = "connection closed"
            raise EOFError(msg)
        parts += chunk
    return bytes(parts)


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def _serve(conn: socket.socket) -> None:
    """Run one delegated call: ``(work, args)`` in, ``("ok", results)`` or an error out."""
    with conn:
        conn.setblocking(True)
        try:
            if not _same_user(conn):
                return
            work, args = _recv(conn)
            conn.sendall(_ACK)  # from here on the caller must not run the work itself
        except (OSError, EOFError, pickle.UnpicklingError):
            return
        try:
            reply: tuple[Any, ...] = ("ok", list(work(*args)))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            _send(conn, reply)


def delegate(path: Path, work: Callable[..., Any], *args: Any) -> list[Any] | None:
    """``list(work(*args))`` run by the worker of this host keeping store ``path``.

    None if no worker of this host keeps it (the caller runs ``work`` itself).  An
    error in the other worker, or its death midway, raises :class:`SparkIOError` (not
    a reported error: Spark retries the task, which replays what was committed).
    """
    if not _can_delegate() or _capacity() == 0:
        return None
    with _GUARD:
        if _name(path) in _KEPT:
            return None  # kept here: run it here
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with conn:
        try:
            conn.connect(keeper_address(path))
        except OSError:
            return None
        try:
            _send(conn, (work, args))
            acked = _recv_exactly(conn, len(_ACK)) == _ACK
        except (OSError, EOFError):
            # The keeper closed its listener while this connection waited to be accepted
            # (it is handing the store over): the work never started there, so it runs
            # here, after the hand-over.
            return None
        if not acked:
            return None
        try:
            status, value = _recv(conn)
        except (OSError, EOFError) as exc:
            msg = (f"the Python worker keeping store {path} stopped while running this "
                   f"task for it ({type(exc).__name__}: {exc}); a retry opens the store "
                   "from its log")
            raise SparkIOError(msg) from exc
    if status != "ok":
        msg = f"the Python worker keeping store {path} failed running this task: {value}"
        raise SparkIOError(msg)
    result: list[Any] = value
    return result
