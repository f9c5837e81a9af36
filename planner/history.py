"""What earlier runs measured, kept in the store's metadata for the planner to prefer.

Static rules estimate; a store that has populated something before *knows*.  Every
population run records, under :func:`joinstate.names.planner_history_key` of its
subject (a join's name, or ``pipeline~<name>`` for a pipeline, as
:func:`joinstate.names.pipeline_owner` spells it):

* per strategy: input rows, seconds and runs (population rows/s per strategy);
* per input (a join side, a pipeline source): microseconds per loaded row, the push
  cost per changed row while populating;
* per index: rows, entries and bytes at the end of the run;
* per pipeline operator: rows of change it produced (to estimate derived streams).

Figures of one strategy are pooled over runs of a similar size (within
``SCALE_FACTOR`` rows of each other); a run at another scale replaces them, since
rows/s measured on a small input say little about a large one.  Rules compare
strategies only between figures recorded at a scale comparable to the run being
planned (:meth:`History.comparable`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from joinstate.names import planner_history_key

if TYPE_CHECKING:
    from collections.abc import Mapping

    from joinstate import Database

__all__ = ["SCALE_FACTOR", "History", "StrategyFigures", "read_history",
           "record_population"]

log = logging.getLogger(__name__)

SCALE_FACTOR = 4.0
"""Two runs are of a comparable size when their input rows are within this factor."""

_VERSION = 1


def _comparable(a: int, b: int, factor: float = SCALE_FACTOR) -> bool:
    lo, hi = sorted((max(a, 1), max(b, 1)))
    return hi <= lo * factor


@dataclass(frozen=True)
class StrategyFigures:
    """Population runs of one strategy: input rows and seconds, summed over ``runs``."""

    strategy: str
    rows: int
    seconds: float
    runs: int = 1

    @property
    def rows_per_second(self) -> float:
        """Input rows per second over the pooled runs."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_per_run(self) -> int:
        """Mean input rows of one run (the scale the figures were measured at)."""
        return self.rows // max(self.runs, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"rows": self.rows, "seconds": self.seconds, "runs": self.runs}


@dataclass(frozen=True)
class History:
    """The figures recorded for one subject (empty when nothing was recorded)."""

    subject: str
    population: Mapping[str, StrategyFigures] = field(default_factory=dict)
    push_us_per_row: Mapping[str, float] = field(default_factory=dict)
    indexes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    operators: Mapping[str, int] = field(default_factory=dict)
    updated: float | None = None

    @property
    def empty(self) -> bool:
        """Whether nothing was recorded."""
        return not (self.population or self.push_us_per_row or self.indexes
                    or self.operators)

    def comparable(self, rows: int | None, candidates: tuple[str, ...]
                   ) -> dict[str, StrategyFigures]:
        """Figures of the ``candidates`` measured at a scale comparable to ``rows``.

        With ``rows`` unknown, every recorded candidate counts (the best the store knows).
        """
        return {name: f for name, f in self.population.items()
                if name in candidates and f.seconds > 0
                and (rows is None or _comparable(f.rows_per_run, rows))}

    def to_dict(self) -> dict[str, Any]:
        """The JSON document stored in the metadata."""
        return {"version": _VERSION, "subject": self.subject,
                "population": {k: v.to_dict() for k, v in self.population.items()},
                "push_us_per_row": dict(self.push_us_per_row),
                "indexes": {k: dict(v) for k, v in self.indexes.items()},
                "operators": dict(self.operators), "updated": self.updated}

    @classmethod
    def from_dict(cls, subject: str, doc: Mapping[str, Any]) -> History:
        """Rebuild from :meth:`to_dict` output (unknown fields are ignored)."""
        pop = {
            name: StrategyFigures(name, int(f["rows"]), float(f["seconds"]),
                                  int(f.get("runs", 1)))
            for name, f in dict(doc.get("population") or {}).items()
        }
        return cls(
            subject, pop,
            {k: float(v) for k, v in dict(doc.get("push_us_per_row") or {}).items()},
            {k: {a: int(b) for a, b in dict(v).items()}
             for k, v in dict(doc.get("indexes") or {}).items()},
            {k: int(v) for k, v in dict(doc.get("operators") or {}).items()},
            doc.get("updated"),
        )


def read_history(store: Database | None, subject: str) -> History:
    """The figures recorded for ``subject`` in ``store`` (empty if none or unreadable).

    An unreadable record is logged and ignored: figures only refine estimates, so a
    damaged one must not stop a population.
    """
    if store is None or store.closed:
        return History(subject)
    raw = store.meta_get(planner_history_key(subject))
    if raw is None:
        return History(subject)
    try:
        doc = json.loads(raw)
        if doc.get("version") != _VERSION:
            return History(subject)
        return History.from_dict(subject, doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring the unreadable planner history of %s in %s: %s", subject,
                    store.path, exc)
        return History(subject)


def record_population(
    store: Database, subject: str, *, strategy: str, rows: int, seconds: float,
    inputs: Mapping[str, tuple[int, float]] | None = None,
    indexes: Mapping[str, Mapping[str, int]] | None = None,
    operators: Mapping[str, int] | None = None,
) -> History:
    """Add one population run's figures to ``subject``'s history and write it.

    ``inputs``: per input, (rows loaded, seconds spent loading them); ``indexes``: per
    index column family, its rows/entries/bytes at the end; ``operators``: rows of
    change per pipeline operator.  Runs that loaded nothing are not recorded.  Returns
    the history as written.  Nothing is written to a read-only store.
    """
    before = read_history(store, subject)
    if rows <= 0 or seconds <= 0 or store.read_only:
        return before
    pop = dict(before.population)
    old = pop.get(strategy)
    if old is not None and _comparable(old.rows_per_run, rows):
        pop[strategy] = StrategyFigures(strategy, old.rows + rows, old.seconds + seconds,
                                        old.runs + 1)
    else:
        pop[strategy] = StrategyFigures(strategy, rows, seconds)
    push = dict(before.push_us_per_row)
    for name, (n, s) in (inputs or {}).items():
        if n > 0 and s > 0:
            push[name] = round(s / n * 1e6, 4)
    new = History(
        subject, pop, push,
        {**before.indexes, **{k: dict(v) for k, v in (indexes or {}).items()}},
        dict(operators) if operators else dict(before.operators), round(time.time(), 3),
    )
    store.meta_put(planner_history_key(subject),
                   json.dumps(new.to_dict(), sort_keys=True).encode())
    return new
