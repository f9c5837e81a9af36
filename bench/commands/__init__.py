"""The ``joinstate`` subcommands, one module each; :mod:`bench.cli` puts them in one group.

:mod:`~bench.commands.common` holds what they share (exit codes, one-line errors, state
directories, Parquet inputs), :mod:`~bench.commands.options` the option decorators the
benchmark suites share.
"""
