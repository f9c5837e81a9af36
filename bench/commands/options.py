"""Option decorators the benchmark suites share: one spelling, one check, one help text.

Several suites take a TPC-DS scale factor, a results directory, a repeat count, a
shard count, batch sizes, a seed, a work directory, a TPC-DS cache: each is declared
once here, with the suite's own default where the suites differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import click

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "RESULTS", "batch_rows_option", "cache_dir_option", "listed", "out_option",
    "repeat_option", "seed_option", "sf_option", "shards_option", "sizes_option",
    "strategies_option", "workdir_option",
]

RESULTS = Path("bench-results")
"""Where every suite writes its results unless ``--out`` says otherwise."""

Decorator: TypeAlias = "Callable[[Callable[..., Any]], Callable[..., Any]]"
"""What an option decorator is: a function from a command function to a command function."""


def _flag(param: click.Parameter) -> str:
    """The option as the user typed it (``--set``, not the parameter's name ``sets``)."""
    return max(param.opts, key=len) if param.opts else f"--{param.name}"


def _at_least_one(ctx: click.Context, param: click.Parameter, value: int) -> int:
    del ctx
    if value < 1:
        msg = f"{_flag(param)} {value}: give at least 1"
        raise click.UsageError(msg)
    return value


def _positive_sf(ctx: click.Context, param: click.Parameter, value: float) -> float:
    del ctx, param
    if not value > 0:
        msg = f"--sf {value:g}: the scale factor must be > 0 (e.g. 0.01)"
        raise click.UsageError(msg)
    return value


def sf_option(default: float) -> Decorator:
    """``--sf``: the TPC-DS scale factor (> 0)."""
    return click.option("--sf", type=float, default=default, show_default=True,
                        callback=_positive_sf, help="TPC-DS scale factor (generated once by "
                        "DuckDB's dsdgen, cached as Parquet).")


def out_option(default: Path = RESULTS, what: str = "the results (JSON + markdown)"
               ) -> Decorator:
    """``--out``: the directory the suite writes its results into."""
    return click.option("--out", type=click.Path(path_type=Path, file_okay=False),
                        default=default, show_default=True, help=f"Directory for {what}.")


def repeat_option(default: int, help: str = "Batches per size (medians are reported)."
                  ) -> Decorator:
    """``--repeat``: how many times each measurement runs (>= 1)."""
    return click.option("--repeat", type=int, default=default, show_default=True,
                        callback=_at_least_one, help=help)


def shards_option(default: int, help: str = "RocksDB shards (per Spark stage).") -> Decorator:
    """``--shards``: a shard count (>= 1)."""
    return click.option("--shards", type=int, default=default, show_default=True,
                        callback=_at_least_one, help=help)


def seed_option() -> Decorator:
    """``--seed``: the random seed of the generated changes."""
    return click.option("--seed", type=int, default=0, show_default=True,
                        help="Seed of the generated change batches.")


def batch_rows_option(default: int = 65_536, help: str = "Rows per batch.") -> Decorator:
    """``--batch-rows``: rows per pushed batch (>= 1)."""
    return click.option("--batch-rows", type=int, default=default, show_default=True,
                        callback=_at_least_one, help=help)


def workdir_option(help: str = "Where the RocksDB directories go (default: a temporary "
                   "directory, removed after).") -> Decorator:
    """``--workdir``: keep the suite's state here instead of a temporary directory."""
    return click.option("--workdir", type=click.Path(path_type=Path, file_okay=False),
                        default=None, help=help)


def cache_dir_option() -> Decorator:
    """``--cache-dir``: the TPC-DS Parquet cache."""
    return click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
                        default=None, help="TPC-DS Parquet cache (default: "
                        "$JOINSTATE_TPCDS_CACHE or ~/.cache/joinstate/tpcds, then sf<SF>/).")


def listed(choices: Sequence[str] | None = None, *, empty_ok: bool = False
           ) -> Callable[[click.Context, click.Parameter, str], tuple[str, ...]]:
    """A click callback splitting a comma-separated option, each item one of ``choices``."""
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
        del ctx
        flag = _flag(param)
        items = tuple(x.strip() for x in value.split(",") if x.strip())
        if not items and not empty_ok:
            msg = f"{flag} is empty: give " + (
                "one or more of " + ",".join(choices) if choices else "a comma-separated list")
            raise click.UsageError(msg)
        bad = [x for x in items if choices is not None and x not in choices]
        if bad:
            msg = f"{flag} {', '.join(map(repr, bad))}: choose from {','.join(choices or ())}"
            raise click.UsageError(msg)
        return items
    return parse


def strategies_option(default: Sequence[str], choices: Sequence[str], help: str,
                      *, empty_ok: bool = False) -> Decorator:
    """``--strategies``: population strategies to compare, comma-separated."""
    return click.option("--strategies", default=",".join(default), show_default=True,
                        callback=listed(choices, empty_ok=empty_ok), help=help)


def _shares(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    del ctx, param
    try:
        sizes = tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
        msg = f"--sizes {value!r}: give numbers separated by commas, e.g. 0.0001,0.001,0.01"
        raise click.UsageError(msg) from None
    if not sizes or any(not 0 < s <= 1 for s in sizes):
        msg = f"--sizes {value!r}: give shares in (0, 1], comma-separated"
        raise click.UsageError(msg)
    return sizes


def sizes_option(default: Sequence[float], of: str = "the sales rows") -> Decorator:
    """``--sizes``: change-batch sizes as shares of ``of``, in (0, 1], comma-separated."""
    return click.option("--sizes", default=",".join(f"{s:g}" for s in default),
                        show_default=True, callback=_shares,
                        help=f"Batch sizes as shares of {of}, comma-separated.")
