"""population: the initial load of a join's state, with asymmetry-aware RocksDB control.

    import population
    report = population.populate(join, left=customers, right=sales, strategy="asymmetric")
    print(report.summary())

See :func:`populate` for the arguments, :class:`Strategy` for what a strategy decides,
and :class:`Report` for what is measured.  An interrupted population (a crash, an
exception) resumes with ``populate(..., resume=True)``: see :mod:`population.resume`.
``python -m population --help`` is the CLI.
"""

from population.driver import ORDERS, populate
from population.errors import BulkLoadRefused, PopulationError, PopulationInterruptedError
from population.pipeline import PipelineReport, populate_pipeline
from population.report import Report, SideReport
from population.resume import Marker, OutputBatch, completed, interrupted, markers
from population.strategy import Strategy, choose, preset, small_side

__all__ = [
    "ORDERS",
    "BulkLoadRefused",
    "Marker",
    "OutputBatch",
    "PopulationError",
    "PipelineReport",
    "PopulationInterruptedError",
    "Report",
    "SideReport",
    "Strategy",
    "choose",
    "completed",
    "interrupted",
    "markers",
    "populate",
    "populate_pipeline",
    "preset",
    "small_side",
]
