"""``python -m population``: populate one join from Parquet files or synthetic data.

A thin wrapper over :func:`population.populate`: it opens (or creates) a state store,
declares the join, loads both sides, prints the report and optionally writes it as
JSON.  Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

import joinstate
from population.driver import ORDERS, populate
from population.strategy import PRESETS

__all__ = ["main"]


def _cols(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m population",
        description="Populate a join's state (RocksDB) from Parquet files or synthetic "
        "TPC-DS-shaped data, then switch it to the live phase and print the report.",
        epilog="examples:\n"
        "  python -m population state/ --synthetic 100000,3000000 --strategy asymmetric\n"
        "  python -m population state/ --left customer.parquet --left-key c_customer_sk "
        "--left-unique c_customer_sk \\\n"
        "      --right store_sales.parquet --right-key ss_customer_sk --strategy auto",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("state_dir", type=Path, help="state store directory (created if missing)")
    src = p.add_argument_group("input (Parquet files or --synthetic)")
    src.add_argument("--left", help="Parquet file of the left side")
    src.add_argument("--right", help="Parquet file of the right side")
    src.add_argument("--left-key", help="left join key column(s), comma-separated")
    src.add_argument("--right-key", help="right join key column(s), comma-separated")
    src.add_argument("--left-unique", help="left unique key column(s), if any")
    src.add_argument("--right-unique", help="right unique key column(s), if any")
    src.add_argument("--synthetic", metavar="CUSTOMERS,SALES",
                     help="synthetic customer (left) x store_sales (right) row counts")
    run = p.add_argument_group("population")
    run.add_argument("--join", default="population", help="join name (default: %(default)s)")
    run.add_argument("--how", default="inner", help="join type (default: %(default)s)")
    run.add_argument("--strategy", default="auto", choices=[*PRESETS, "auto"],
                     help="population strategy (default: %(default)s)")
    run.add_argument("--order", default="small-first", choices=ORDERS,
                     help="batch order (default: %(default)s)")
    run.add_argument("--batch-rows", type=int, default=65_536, help="rows per batch")
    run.add_argument("--write-buffer-mb", type=int, default=64, help="memtable size, MiB")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted population of the join (same inputs)")
    run.add_argument("--json", type=Path, help="also write the report as JSON here")
    run.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    run.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    return p


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, joinstate.Side, joinstate.Side]:
    if args.synthetic:
        from population import synthetic as syn

        try:
            n_c, n_s = (int(x) for x in args.synthetic.split(","))
        except ValueError:
            raise joinstate.JoinStateError(
                f"--synthetic {args.synthetic!r} must be two integers, e.g. 100000,3000000"
            ) from None
        left = syn.customer_batches(n_c, args.batch_rows)
        right = syn.sales_batches(n_s, n_c, args.batch_rows)
        return (left, right,
                joinstate.Side(syn.CUSTOMER_SCHEMA, key=["c_customer_sk"],
                               unique_key=["c_customer_sk"]),
                joinstate.Side(syn.SALES_SCHEMA, key=["ss_customer_sk"]))
    for flag in ("left", "right", "left_key", "right_key"):
        if not getattr(args, flag):
            raise joinstate.JoinStateError(
                f"--{flag.replace('_', '-')} is required unless --synthetic is given"
            )
    schemas = []
    for f in (args.left, args.right):
        try:
            schemas.append(pq.read_schema(f))
        except (OSError, ValueError) as exc:
            raise joinstate.JoinStateError(f"cannot read Parquet file {f!r}: {exc}") from exc
    ls = joinstate.Side(schemas[0], key=_cols(args.left_key) or [],
                        unique_key=_cols(args.left_unique))
    rs = joinstate.Side(schemas[1], key=_cols(args.right_key) or [],
                        unique_key=_cols(args.right_unique))
    return args.left, args.right, ls, rs


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        left, right, ls, rs = _inputs(args)
        options = joinstate.StoreOptions(write_buffer_size=args.write_buffer_mb << 20)
        with joinstate.StateStore(args.state_dir, options) as store:
            join = store.join(args.join, left=ls, right=rs, how=args.how)
            if args.resume:
                report = populate(join, left, right, progress=not args.no_progress,
                                  resume=True)
            else:
                report = populate(join, left, right, strategy=args.strategy,
                                  order=args.order, progress=not args.no_progress,
                                  batch_rows=args.batch_rows)
    except joinstate.JoinStateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    if args.json:
        args.json.write_text(report.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
