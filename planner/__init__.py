"""planner: SQL views compiled to pipelines, and every physical choice made from statistics.

Two halves, each explained in words:

* **SQL** (:mod:`planner.sql`): :func:`compile` turns a SQL view (DuckDB's dialect, the
  incremental subset: select-project-join-aggregate, ``UNION ALL``, CTEs as shared
  subgraphs, a final ``ORDER BY ... LIMIT``) into a :class:`joinstate.Pipeline`;
  anything else is refused, quoting the construct.
* **Physical planning** (:mod:`planner.plan`, :mod:`planner.rules`): small rules applied
  in order (:data:`RULES`), each recording :class:`Decision` objects with the figures
  that drove them -- small side, layout, memtable, compaction, population order and
  strategy, probe path, sharing, Spark shards; :func:`decide_batch` chooses incremental
  apply or full recompute for one change batch.  ``Plan.explain()`` prints the tree.

``strategy="auto"`` in :mod:`population` and :mod:`spark_io` means "ask the planner".
The planner sits below population: it decides from plain data, population executes.
"""

from planner import stats
from planner.batch import decide_batch
from planner.context import PlanContext, PlannerSettings
from planner.errors import PlannerError
from planner.history import History, read_history, record_population
from planner.plan import Plan, plan_join, plan_population, run
from planner.rule import Decision, Rule
from planner.rules import RULES
from planner.sql import Source, SQLError, UnsupportedSQLError, compile, reopen
from planner.stats import KeyStats, SourceStats, from_parquet, from_table, gather
from planner.views import ViewRecord, stored_view

__all__ = [
    "RULES",
    "Decision",
    "History",
    "KeyStats",
    "Plan",
    "PlanContext",
    "PlannerError",
    "PlannerSettings",
    "Rule",
    "SQLError",
    "Source",
    "SourceStats",
    "UnsupportedSQLError",
    "ViewRecord",
    "compile",
    "decide_batch",
    "from_parquet",
    "from_table",
    "gather",
    "plan_join",
    "plan_population",
    "read_history",
    "record_population",
    "reopen",
    "run",
    "stats",
    "stored_view",
]
