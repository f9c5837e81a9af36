"""population: the initial load of a join's state, with asymmetry-aware RocksDB control.

    import population
    report = population.populate(join, left=customers, right=sales, strategy="asymmetric")
    print(report.summary())

See :func:`populate` for the arguments, :class:`Strategy` for what a strategy decides,
and :class:`Report` for what is measured.  ``python -m population --help`` is the CLI.
"""

from population.driver import ORDERS, populate
from population.errors import BulkLoadRefused, PopulationError
from population.report import Report, SideReport
from population.strategy import Strategy, choose, preset, small_side

__all__ = [
    "ORDERS",
    "BulkLoadRefused",
    "PopulationError",
    "Report",
    "SideReport",
    "Strategy",
    "choose",
    "populate",
    "preset",
    "small_side",
]
