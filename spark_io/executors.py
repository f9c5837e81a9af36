"""Can Spark's executors run joinstate?  One probe task, once per session, before any job.

Executors start their own Python (``PYSPARK_PYTHON`` / ``spark.pyspark.python``, else
``python3`` on the executor's ``PATH``).  If that Python lacks joinstate, every task of
a real job fails after Spark's retries with pages of Java and Python traces.
:func:`check_executors` runs one tiny task first: it imports ``joinstate``,
``population`` and ``spark_io`` and returns their versions and paths, or the one-line
reason it could not.  The probe function is compiled from source under a module name no
Python has, so cloudpickle ships it by value: unpickling it on the executor needs
nothing but the standard library.  Only a successful check is cached (per Spark
application and executor interpreter).

The probe runs one task per core (``defaultParallelism``, at most
:data:`PROBE_TASKS_MAX`) rather than one: importing joinstate takes a second or more in
a fresh Python worker, and with ``spark.python.worker.reuse`` (the default) Spark keeps
these workers for later RDD jobs, which is how ``SparkJoin`` runs its shard tasks
(:func:`spark_io.lifecycle.run_job`).  The first real job then starts no interpreter on any
core.  (``mapInArrow`` stages use a separate pool of workers, started on their first use.)
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

import joinstate
from spark_io.errors import INSTALL_HINT, ExecutorEnvironmentError, task_reason

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pyspark.sql import SparkSession

__all__ = ["PROBE_TASKS_MAX", "check_executors"]

_PROBE_SOURCE = '''
def probe(rows):
    import sys
    for _ in rows:
        pass
    info = {"python": sys.executable,
            "version": "%d.%d.%d" % tuple(sys.version_info[:3])}
    for name in ("joinstate", "population", "spark_io"):
        try:
            module = __import__(name)
        except BaseException as exc:
            info["module"] = name
            info["error"] = "%s: %s" % (type(exc).__name__, exc)
            break
        info[name] = {"version": str(getattr(module, "__version__", "")),
                      "path": str(getattr(module, "__file__", ""))}
    yield info
'''


def _probe_function() -> Callable[[Iterable[Any]], Iterable[dict[str, Any]]]:
    namespace: dict[str, Any] = {"__name__": "_joinstate_executor_probe"}
    exec(compile(_PROBE_SOURCE, "<joinstate executor probe>", "exec"), namespace)
    probe: Callable[[Iterable[Any]], Iterable[dict[str, Any]]] = namespace["probe"]
    return probe


PROBE_TASKS_MAX = 256
"""At most this many probe tasks (one per core up to it)."""

_checked: dict[tuple[str, str], dict[str, Any]] = {}
_lock = threading.Lock()


def _requested(spark: SparkSession) -> str:
    """The executor Python the driver asks for."""
    return str(getattr(spark.sparkContext, "pythonExec", None) or "python3")


def _configured(spark: SparkSession) -> tuple[str, str | None]:
    """The executor Python the driver asks for, and ``spark.pyspark.python`` if set."""
    conf = spark.sparkContext.getConf().get("spark.pyspark.python")
    return _requested(spark), conf


def _driver() -> str:
    return f"{sys.executable} (Python {'.'.join(map(str, sys.version_info[:3]))})"


def _remedy(requested: str, conf: str | None) -> str:
    asked = f"PYSPARK_PYTHON={requested}" + (
        f", spark.pyspark.python={conf}" if conf else "")
    return (
        f"The executors were asked to run {asked}; the driver runs {_driver()}. Set "
        f"PYSPARK_PYTHON (or spark.pyspark.python) to a Python with joinstate installed "
        f"({INSTALL_HINT}), e.g. the driver's own {sys.executable}, before the "
        "SparkSession starts (spark_io.local_session() does this for local sessions)."
    )


def check_executors(spark: SparkSession, *, force: bool = False) -> dict[str, Any]:
    """Check that executors can import joinstate; return what the probe task reported.

    The result (the executor's interpreter, its version, and the version and path of
    ``joinstate``, ``population`` and ``spark_io``) is cached per Spark application and
    executor interpreter; ``force`` probes again.  Raises
    :class:`~spark_io.ExecutorEnvironmentError` (reason first, then what to set) when
    the probe task fails or cannot import the packages, or when the executors run a
    different joinstate version than the driver.
    """
    sc = spark.sparkContext
    requested = _requested(spark)
    cache_key = (str(sc.applicationId), requested)
    with _lock:
        if not force and cache_key in _checked:
            return _checked[cache_key]
    requested, conf = _configured(spark)  # copies the whole conf: only when probing
    try:
        tasks = max(1, min(int(sc.defaultParallelism), PROBE_TASKS_MAX))
        rows = sc.parallelize(range(tasks), tasks).mapPartitions(_probe_function()).collect()
    except Exception as exc:  # the worker could not even start or unpickle the probe
        err = ExecutorEnvironmentError(
            f"{task_reason(exc)} -- Spark executors cannot run Python tasks for joinstate "
            f"(a one-task probe failed before any job ran). {_remedy(requested, conf)}"
        )
        err.spark_error = exc
        raise err from None
    # A task that could not import the packages reports why; any one of them says it.
    info: dict[str, Any] = next((r for r in rows if "error" in r), rows[0] if rows else {})
    if "error" in info:
        err = ExecutorEnvironmentError(
            f"{info['error']} -- Spark executors run {info.get('python')} (Python "
            f"{info.get('version')}), which cannot import {info.get('module')}. "
            f"{_remedy(requested, conf)}"
        )
        err.executor = info
        raise err
    theirs = info.get("joinstate", {}).get("version")
    if theirs != joinstate.__version__:
        err = ExecutorEnvironmentError(
            f"executors run joinstate {theirs} ({info.get('joinstate', {}).get('path')}, "
            f"Python {info.get('python')}), the driver joinstate {joinstate.__version__} "
            f"({joinstate.__file__}); shards must be written by one version. "
            f"{_remedy(requested, conf)}"
        )
        err.executor = info
        raise err
    with _lock:
        _checked[cache_key] = info
    return info
