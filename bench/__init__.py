"""Benchmarks and data sets: synthetic TPC-DS-shaped data, core and population benchmarks.

Run ``joinstate bench --help`` (or ``python -m bench --help``); the ``joinstate`` command
itself is :mod:`bench.cli`.  Imports of heavy optional dependencies (duckdb, pyspark)
happen inside the subcommands that need them.
"""
