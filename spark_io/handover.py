"""Handing a shard store from the process that holds it open to one that needs it.

Executor Python workers keep the stores they opened (:mod:`spark_io.storekeeper`), so a
store's RocksDB LOCK may be held by an idle worker when a task in another process (or
the driver, wiping stores before a population) needs it.  The protocol, over the file
system every process sees:

* the process that needs store directory ``P`` writes a **release request** beside it,
  ``<P's parent>/.<P's name>.release-<token>`` (JSON: who asks, until when), then tries
  to take the store again every :data:`POLL` seconds;
* a holder's keeper thread looks for requests of the stores it keeps on every tick and,
  as soon as a store is idle (no task of the holder is using it), closes it: the LOCK
  is free, the requester's next try succeeds;
* a holder that hands stores over marks each one it keeps, ``<P's parent>/.<P's
  name>.kept``; a store held without that mark (a ``StateStore`` opened by hand, a
  task of an older version) is refused at once, as nobody would answer the request;
* the requester removes its request once it holds the store or gives up.  A request is
  valid until the time it names (the requester's deadline): one left by a requester
  that died stops being honoured then, and is removed by the next holder that sees it.

The wait is bounded (:data:`RELEASE_WAIT`, or ``$JOINSTATE_SPARK_RELEASE_WAIT``): past it
the requester raises :class:`~spark_io.errors.ShardBusyError` naming the store, what
holds it and what to do.  A process never waits for itself: stores this process keeps
are given up first (:func:`set_local_release`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from joinstate import StateLockedError
from joinstate.directory import hold_directory
from spark_io.errors import ShardBusyError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "POLL",
    "advertise",
    "RELEASE_WAIT",
    "RELEASE_WAIT_ENV",
    "pending",
    "release_wait",
    "requested",
    "requesting",
    "set_local_release",
    "take",
    "wipe",
    "withdraw",
]

RELEASE_WAIT = 30.0
"""Seconds a process waits for a store's holder to close it before refusing."""
RELEASE_WAIT_ENV = "JOINSTATE_SPARK_RELEASE_WAIT"
POLL = 0.02
"""Seconds between two tries to take a store whose release was requested."""

T = TypeVar("T")

_local_release: Callable[[Path], None] | None = None


def set_local_release(release: Callable[[Path], None] | None) -> None:
    """Register how this process gives up a store it keeps open (the store keeper's)."""
    global _local_release
    _local_release = release


def release_wait() -> float:
    """The bound on a wait for a holder, in seconds (the environment may lower it)."""
    raw = os.environ.get(RELEASE_WAIT_ENV)
    if raw is None:
        return RELEASE_WAIT
    try:
        value = float(raw)
    except ValueError:
        return RELEASE_WAIT
    return value if value >= 0 else RELEASE_WAIT


def _mark(path: Path) -> Path:
    return path.parent / f".{path.name}.kept"


def _me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def advertise(path: Path) -> None:
    """Mark store ``path`` as kept open by this process, which hands it over on request."""
    mark = _mark(path)
    tmp = mark.with_name(f"{mark.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(_me())
        os.replace(tmp, mark)


def withdraw(path: Path) -> None:
    """Remove this process's mark of store ``path`` (it no longer keeps it)."""
    mark = _mark(path)
    with contextlib.suppress(OSError):
        if mark.read_text() == _me():
            mark.unlink()


def _prefix(path: Path) -> str:
    return f".{path.name}.release-"


def pending(path: Path) -> bool:
    """Whether some process has asked for store ``path`` and is still waiting for it."""
    return path.name in requested(path.parent)


def requested(folder: Path) -> set[str]:
    """The names of the stores in ``folder`` some process is waiting for (one listing).

    Expired requests (their requester gave up or died) are removed on the way.
    """
    try:
        entries = [e for e in os.scandir(folder)
                   if e.name.startswith(".") and ".release-" in e.name]
    except FileNotFoundError:
        return set()
    now = time.time()
    found: set[str] = set()
    for entry in entries:
        name = entry.name[1:entry.name.index(".release-")]
        try:
            until = float(json.loads(Path(entry.path).read_text())["until"])
        except FileNotFoundError:
            continue  # its requester just took the store and removed it
        except (OSError, ValueError, KeyError, TypeError):
            found.add(name)  # being written: live, as its writer is
            continue
        if until >= now:
            found.add(name)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return found


@contextlib.contextmanager
def requesting(path: Path, wait: float) -> Iterator[None]:
    """A release request for store ``path`` stands for the ``with`` block (``wait`` s)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    request = path.parent / f"{_prefix(path)}{uuid.uuid4().hex}"
    tmp = request.with_name(f"{request.name}.tmp")
    tmp.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "until": time.time() + wait + 1.0}))
    os.replace(tmp, request)  # whole, or absent
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            request.unlink()


def take(path: Path, attempt: Callable[[], T], what: str, hint: str) -> T:
    """``attempt()`` (which opens or locks store ``path``), handed over if another holds it.

    A store this process keeps is given up first.  If another process holds the store,
    a release request stands while ``attempt`` is retried, for at most
    :func:`release_wait` seconds; then :class:`~spark_io.errors.ShardBusyError` says
    ``what`` is busy and how to proceed (``hint``: what to run one at a time).
    """
    if _local_release is not None:
        _local_release(path)
    try:
        return attempt()
    except StateLockedError as first:
        cause: StateLockedError = first
    wait = release_wait() if _mark(path).exists() else 0.0
    if wait > 0:
        deadline = time.monotonic() + wait
        with requesting(path, wait):
            while time.monotonic() < deadline:
                time.sleep(POLL)
                try:
                    return attempt()
                except StateLockedError as exc:
                    cause = exc
    raise ShardBusyError(
        f"{what} ({path}) is already open in another task or process, which did not hand "
        f"it over within {wait:g} s; joinstate allows one writer per shard: "
        f"{hint or 'run one operation'} at a time per state_dir, keep spark.speculation "
        f"off, and close stores opened outside Spark (${RELEASE_WAIT_ENV} sets the wait). "
        f"Cause: {cause}") from cause


def wipe(path: Path, what: str, hint: str = "") -> None:
    """Remove store directory ``path`` once no process holds it (handed over first)."""
    if not path.exists():
        if _local_release is not None:
            _local_release(path)
        return

    def remove() -> None:
        with hold_directory(path, f"remove {what}"):
            shutil.rmtree(path)

    take(path, remove, what, hint)
