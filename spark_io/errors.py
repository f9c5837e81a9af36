"""Errors raised by :mod:`spark_io`; all derive from :class:`joinstate.JoinStateError`.

Errors raised inside a Spark task reach the driver wrapped in Spark's own exception
(the Python traceback becomes a string).  :func:`translate_task_error` turns such a
failure back into the library error it carries (any public error class of
``joinstate``, ``population`` or ``spark_io``, looked up by its qualified name), so a
caller can ``except spark_io.ShardBusyError`` around ``job.apply(...)`` as if the work
had run locally.  The translated error keeps Spark's exception as ``err.spark_error``.
A job that failed for a reason outside the library (a Python worker that died, an
executor lost on every attempt) is raised as :class:`SparkJobError` naming the cause.

Errors a retry cannot cure (a change the state refuses: over-retraction, a unique key,
a conflicting commit id, a bad type) are not raised by tasks at all: a task reports
them as a row (:func:`error_detail`) and ends normally, and the driver raises the same
error (:func:`error_from_detail`).  Spark then neither retries the task nor logs it as
failed with its whole traceback; the caller gets one line.

This module does not import pyspark (``spark_io/__init__`` uses
:class:`SparkNotInstalledError` to say so when pyspark is missing).
"""

from __future__ import annotations

import re

import joinstate.errors as core_errors
import population.errors as population_errors
from joinstate.errors import JoinStateError, StateLockedError

__all__ = [
    "ExecutorEnvironmentError",
    "ManifestError",
    "PopulationStateError",
    "ShardBusyError",
    "SparkIOError",
    "SparkJobError",
    "SparkNotInstalledError",
    "StateDirBusyError",
    "WriterConflictError",
    "error_detail",
    "error_from_detail",
    "reported",
    "task_reason",
    "translate_task_error",
]

INSTALL_HINT = "pip install 'joinstate[spark]'"


class SparkNotInstalledError(ImportError):
    """``import spark_io`` without pyspark: install the ``spark`` extra."""


class SparkIOError(JoinStateError, RuntimeError):
    """Root of the errors specific to driving joinstate from Spark.

    Errors translated from a failed Spark task carry Spark's exception as
    ``spark_error`` (``None`` when raised on the driver).
    """

    spark_error: BaseException | None = None


class ShardBusyError(SparkIOError, StateLockedError):
    """A shard's RocksDB directory is already open: two writers for one shard.

    joinstate allows one writer per shard.  Inside one ``SparkJoin`` operation every
    shard goes to exactly one task, so this means another job (or a speculative task
    attempt, or a process on the driver) holds the shard open at the same time.
    """


class ManifestError(SparkIOError, ValueError):
    """The state directory's manifest is missing, unreadable or for another join."""


class PopulationStateError(SparkIOError):
    """A shard's state is not what the population step expects.

    Population loads a state directory once: a second ``populate()`` is refused, and so
    is a half-loaded shard (an earlier ``populate()`` that failed midway) unless
    ``populate(resume=True)`` continues it; a retried task resumes on its own.
    """


class WriterConflictError(SparkIOError):
    """Another driver object wrote this join's or pipeline's state after this one attached.

    A state directory has one writer at a time; an object that is no longer the writer
    would write from a stale view (and discard the other's commits), so it is refused.
    Re-attach (``SparkJoin.open(...)``, or ``SparkPipeline(...)`` again) to continue from
    the committed state.
    """


class StateDirBusyError(SparkIOError, StateLockedError):
    """Another operation on the same state directory was still running after a wait."""


class SparkJobError(SparkIOError):
    """A Spark job failed for a reason outside joinstate.

    A Python worker died, an executor was lost on every attempt...; ``spark_error``
    holds Spark's exception.
    """


class ExecutorEnvironmentError(SparkIOError):
    """Spark's executors cannot run joinstate (checked once per session, before any job).

    Usually their Python is not the driver's: set ``PYSPARK_PYTHON`` (or
    ``spark.pyspark.python``) to an interpreter with ``joinstate[spark]`` installed.
    ``executor`` holds what the probe task reported (interpreter, version, the error).
    """

    executor: dict[str, object] | None = None


def _public_errors() -> dict[str, type[JoinStateError]]:
    """Every public error class of the three packages, by ``module.QualName`` and name."""
    found: dict[str, type[JoinStateError]] = {}
    modules = (core_errors, population_errors)
    for module in modules:
        for name in module.__all__:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, JoinStateError):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    for cls in (SparkIOError, ShardBusyError, ManifestError, PopulationStateError,
                ExecutorEnvironmentError, WriterConflictError, StateDirBusyError,
                SparkJobError):
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


_ERRORS = _public_errors()
_IN_TRACEBACK = re.compile(
    r"^[ \t]*((?:joinstate|population|spark_io)(?:\.\w+)+): ?([^\n]*)", re.MULTILINE)
_EXCEPTION_LINE = re.compile(
    r"^[ \t]*(?:Caused by: )?([A-Za-z_][\w.$]*(?:Error|Exception|Exit|Interrupt|Refused|"
    r"Failure)): ?([^\n]*)", re.MULTILINE)
_JVM = ("java.", "javax.", "org.", "scala.", "py4j.", "jdk.", "sun.", "com.")
_SPARK_WRAPPERS = ("pyspark.errors.exceptions.captured.", "PythonException")


def _spark_text(exc: BaseException) -> str:
    """The text of a Spark failure, Python traceback included when there is one."""
    parts = [str(exc)]
    get = getattr(exc, "getMessageParameters", None)
    if callable(get):
        try:
            params = get() or {}
        except Exception:  # a Spark without message parameters
            params = {}
        parts.extend(str(params[k]) for k in ("msg", "traceback") if k in params)
    return "\n".join(parts)


def task_reason(exc: BaseException, limit: int = 400) -> str:
    """One line saying why a Spark job failed: the task's own exception if it can be found.

    The last Python exception line of the task's traceback (``ModuleNotFoundError: No
    module named 'spark_io'``), else the deepest JVM cause, else the first line.
    """
    text = _spark_text(exc)
    python: list[tuple[str, str]] = []
    jvm: list[tuple[str, str]] = []
    for cls, message in _EXCEPTION_LINE.findall(text):
        if cls.startswith(_JVM):
            jvm.append((cls, message))
        elif not cls.startswith(_SPARK_WRAPPERS):
            python.append((cls, message))
    if python:
        cls, message = python[-1]
    elif jvm:
        cls, message = jvm[-1]
    else:
        first = next((line.strip() for line in text.splitlines() if line.strip()),
                     type(exc).__name__)
        return first[:limit]
    short = cls.rsplit(".", 1)[-1]
    line = f"{short}: {message.strip()}" if message.strip() else short
    return line if len(line) <= limit else line[: limit - 3] + "..."


def translate_task_error(exc: BaseException) -> JoinStateError | None:
    """The library error a failed Spark job carries in its task traceback, if any.

    Any public error of ``joinstate``, ``population`` or ``spark_io`` is recognised by
    its qualified class name in the traceback and rebuilt on the driver as the same
    class, with the task's message first; Spark's exception is ``err.spark_error``.
    The last matching line wins: it is the exception that ended the task (earlier
    lines are causes chained with ``raise ... from``).
    """
    matches = _IN_TRACEBACK.findall(_spark_text(exc))
    for name, message in reversed(matches):
        cls = _ERRORS.get(name)
        if cls is None:
            continue
        text = f"{message.strip()} (raised in a Spark task)"
        try:
            err = cls(text)
        except TypeError:  # a constructor with other required arguments
            err = cls.__new__(cls)
            Exception.__init__(err, text)
        err.spark_error = exc  # type: ignore[attr-defined]
        return err
    return None


# ---- errors reported by tasks instead of raised ------------------------------------------


def reported(exc: BaseException) -> bool:
    """Whether a task reports ``exc`` as a row rather than failing (see the module doc).

    Library errors about the data or the request (``ValueError`` and ``OverflowError``
    kinds: schema, over-retraction, unique key, commit conflict, weight overflow, a
    population in the wrong state) are the same on every attempt; I/O errors, a busy
    shard and everything else are raised, so Spark may retry them.
    """
    return isinstance(exc, JoinStateError) and isinstance(
        exc, ValueError | OverflowError | PopulationStateError)


def error_detail(exc: BaseException) -> dict[str, object]:
    """``exc`` as a JSON-able report detail (its class and one-line message)."""
    cls = type(exc)
    message = " ".join(str(exc).split())
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "message": message}


def error_from_detail(detail: dict[str, object]) -> JoinStateError:
    """The error a task reported (:func:`error_detail`), rebuilt on the driver."""
    cls = _ERRORS.get(str(detail.get("class")), SparkIOError)
    text = f"{detail.get('message')} (raised in a Spark task)"
    try:
        return cls(text)
    except TypeError:  # a constructor with other required arguments
        err = cls.__new__(cls)
        Exception.__init__(err, text)
        return err
