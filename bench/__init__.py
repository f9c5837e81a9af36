"""Benchmarks and data sets: synthetic TPC-DS-shaped data, core and population benchmarks.

Run ``python -m bench --help``.  Imports of heavy optional dependencies (duckdb, pyspark)
happen inside the subcommands that need them.
"""
