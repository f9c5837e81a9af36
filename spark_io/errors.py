"""Errors raised by :mod:`spark_io`; all derive from :class:`joinstate.JoinStateError`.

Errors raised inside a Spark task reach the driver wrapped in Spark's own exception
(the Python traceback becomes a string).  :func:`translate_task_error` turns such a
failure back into the joinstate error it carries, so a caller can ``except
spark_io.ShardBusyError`` around ``job.apply(...)`` as if the work had run locally.
"""

from __future__ import annotations

import re

import joinstate.errors as core_errors
from joinstate.errors import JoinStateError, StateLockedError
from population.errors import PopulationError, PopulationInterruptedError

__all__ = [
    "ManifestError",
    "PopulationStateError",
    "ShardBusyError",
    "SparkIOError",
    "translate_task_error",
]


class SparkIOError(JoinStateError, RuntimeError):
    """Root of the errors specific to driving joinstate from Spark."""


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


_LOCAL = {
    cls.__name__: cls
    for cls in (SparkIOError, ShardBusyError, ManifestError, PopulationStateError)
}
_CORE = {
    name: getattr(core_errors, name)
    for name in core_errors.__all__
}
_POPULATION = {cls.__name__: cls for cls in (PopulationError, PopulationInterruptedError)}
_IN_TRACEBACK = re.compile(
    r"\b(?:spark_io\.errors|joinstate\.errors|population\.errors)\.(\w+): ([^\n]*)")


def translate_task_error(exc: BaseException) -> JoinStateError | None:
    """The joinstate error a failed Spark job carries in its task traceback, if any.

    The last matching line wins: it is the exception that ended the task (earlier lines
    are causes chained with ``raise ... from``).
    """
    matches = _IN_TRACEBACK.findall(str(exc))
    for name, message in reversed(matches):
        cls = _LOCAL.get(name) or _CORE.get(name) or _POPULATION.get(name)
        if cls is not None:
            return cls(f"{message} (raised in a Spark task)")
    return None
