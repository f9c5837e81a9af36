"""Opt-in profiling of executor tasks: where a shard task's time goes.

Set ``JOINSTATE_SPARK_PROFILE=<directory>`` in the executors' environment (in local
mode the driver's environment is inherited; on a cluster use
``spark.executorEnv.JOINSTATE_SPARK_PROFILE``) and every shard task run under
:func:`task_profile` writes a cProfile dump,
``<directory>/<task>-shard-<NNNNN>-<pid>-<attempt>.prof``, readable with
``python -m pstats``.  Off (the default) it costs one environment lookup per task.

Profiling lives on the executor because that is where the time goes: the driver only
plans and waits, and a driver-side profile of a Spark job shows ``collect()`` blocking.
"""

from __future__ import annotations

import cProfile
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["PROFILE_ENV", "TaskUsage", "task_profile"]

PROFILE_ENV = "JOINSTATE_SPARK_PROFILE"


@contextmanager
def task_profile(task: str, shard: int, attempt: int = 0) -> Iterator[None]:
    """Profile the ``with`` block into ``$JOINSTATE_SPARK_PROFILE`` if that is set."""
    where = os.environ.get(PROFILE_ENV)
    if not where:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        folder = Path(where)
        folder.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(
            str(folder / f"{task}-shard-{shard:05d}-{os.getpid()}-{attempt}.prof"))


def _minor_faults() -> int | None:
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


class TaskUsage:
    """What one shard task cost its Python worker: CPU seconds and minor page faults.

    Reported per task (``process_cpu_s``, ``minor_faults``) because two tasks given the
    same rows can differ: the first heavy task of a fresh worker grows its heap (tens of
    thousands more page faults), and a task's CPU time for the same work varies between
    runs on a shared machine.  The slower task sets the job's time.
    """

    __slots__ = ("cpu0", "faults0")

    def __init__(self) -> None:
        self.cpu0 = time.process_time()
        self.faults0 = _minor_faults()

    def report(self) -> dict[str, float | int]:
        """CPU seconds and minor page faults since this object was made."""
        out: dict[str, float | int] = {"process_cpu_s": round(time.process_time() - self.cpu0, 3)}
        faults = _minor_faults()
        if faults is not None and self.faults0 is not None:
            out["minor_faults"] = faults - self.faults0
        return out
