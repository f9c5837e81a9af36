"""population: the initial load of a join's or a pipeline's state, asymmetry-aware.

    import population
    report = population.populate(join, left=customers, right=sales, strategy="asymmetric")
    report = population.populate(pipeline, sources={"customer": c, "store_sales": s})
    print(report.summary())

One driver loads anything maintained (:class:`joinstate.maintained.Maintained`).  See
:func:`populate` for the arguments, :class:`Strategy` for what a strategy decides, and
:class:`Report` / :class:`PipelineReport` for what is measured.  An interrupted
population (a crash, an exception) resumes with ``populate(..., resume=True)``: see
:mod:`population.resume`.
``python -m population --help`` is the CLI.

Live changes: :func:`apply` applies one change batch either incrementally (a push) or
by recomputing its output from the sides' snapshots, as the planner decides
(:func:`planner.decide_batch`); :func:`apply_batch` also returns the decision and
timings; :func:`apply_changes` applies changes to several sources of a pipeline as one
push.
"""

from population.apply import ApplyReport, apply, apply_batch, apply_changes
from population.driver import ORDERS, populate
from population.errors import BulkLoadRefused, PopulationError, PopulationInterruptedError
from population.report import PipelineReport, Report, SideReport, SourceLoad
from population.resume import Marker, OutputBatch, completed, interrupted, markers
from population.strategy import Strategy, preset

__all__ = [
    "ORDERS",
    "ApplyReport",
    "BulkLoadRefused",
    "Marker",
    "OutputBatch",
    "PopulationError",
    "PipelineReport",
    "PopulationInterruptedError",
    "Report",
    "SideReport",
    "SourceLoad",
    "Strategy",
    "apply",
    "apply_batch",
    "apply_changes",
    "completed",
    "interrupted",
    "markers",
    "populate",
    "preset",
]
