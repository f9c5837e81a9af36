"""Data and oracles for the Spark tests: customer/sales-like rows and Z-set helpers.

Customers key on IntegerType, sales on LongType (equal keys must still meet); both have
NULL keys and duplicate rows.  The oracle is Spark's own join of the same inputs.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import random

    from pyspark.sql import DataFrame, SparkSession

Row = tuple[Any, ...]

CUSTOMER = (
    "c_customer_sk int, c_name string, c_birth date, c_balance decimal(10,2), "
    "c_flag boolean, c_seen timestamp, c_score double"
)
SALES = "ss_customer_sk long, ss_ticket long, ss_qty int, ss_paid double"
CUSTOMER_COLS = ["c_customer_sk", "c_name", "c_birth", "c_balance", "c_flag", "c_seen",
                 "c_score"]
SALES_COLS = ["ss_customer_sk", "ss_ticket", "ss_qty", "ss_paid"]
OUT_COLS = CUSTOMER_COLS + SALES_COLS
"""The join output's columns: customer's, then the sale's."""


def customer(rng: random.Random, sk: int | None, tag: str = "") -> Row:
    return (
        sk, f"name{sk}{tag}", dt.date(1950, 1, 1) + dt.timedelta(days=rng.randrange(20_000)),
        Decimal(rng.randrange(1_000_000)) / 100, rng.random() < 0.5,
        dt.datetime(2020, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            seconds=rng.randrange(10**8)),
        round(rng.random(), 6),
    )


def sale(rng: random.Random, sk: int | None, ticket: int) -> Row:
    return (sk, ticket, rng.randrange(1, 10), round(rng.random() * 100, 2))


def new_sale(rng: random.Random, sk: int | None) -> Row:
    """A sale with a fresh random ticket (a new row, not one of :func:`sales`)."""
    return sale(rng, sk, rng.randrange(10**7, 10**8))


def customers(rng: random.Random, n: int = 150) -> list[Row]:
    rows = [customer(rng, sk) for sk in range(n)]
    rows += [rows[3], rows[7]]                                  # identical duplicates
    rows += [customer(rng, 11, "-twin"), customer(rng, 12, "-twin")]  # duplicate keys
    rows += [customer(rng, None), customer(rng, None, "-other")]  # NULL keys
    return rows


def sales(rng: random.Random, n: int = 1200, keys: int = 170) -> list[Row]:
    rows = [sale(rng, rng.randrange(keys), t) for t in range(n)]  # some keys unmatched
    rows += [rows[0], rows[1], rows[1]]                          # identical duplicates
    rows += [sale(rng, None, 10**6 + i) for i in range(3)]      # NULL keys
    return rows


def df(spark: SparkSession, rows: list[Row] | Counter[Row], schema: str) -> DataFrame:
    if isinstance(rows, Counter):
        rows = list(rows.elements())
    return spark.createDataFrame(rows, schema)


def changes_df(spark: SparkSession, changes: list[tuple[Row, int]], schema: str) -> DataFrame:
    return spark.createDataFrame([(*r, w) for r, w in changes], schema + ", _weight long")


def zset(frame: DataFrame, columns: list[str]) -> Counter[Row]:
    """A DataFrame's rows as a Z-set (``_weight`` summed, or 1 per row without it)."""
    has_w = "_weight" in frame.columns
    out: Counter[Row] = Counter()
    for r in frame.select(*columns, *(["_weight"] if has_w else [])).collect():
        out[tuple(r[c] for c in columns)] += r["_weight"] if has_w else 1
    return Counter({k: v for k, v in out.items() if v != 0})


def via_spark(spark: SparkSession, rows: Counter[Row], schema: str, columns: list[str]
              ) -> Counter[Row]:
    """``rows`` as Spark returns them (naive local timestamps, Decimals), for comparisons."""
    return zset(df(spark, rows, schema), columns)


def add(total: Counter[Row], delta: Counter[Row]) -> Counter[Row]:
    for k, v in delta.items():
        total[k] += v
    return Counter({k: v for k, v in total.items() if v != 0})


def spark_join(spark: SparkSession, left: Counter[Row], right: Counter[Row], how: str
               ) -> Counter[Row]:
    """Spark's own join of the integrated inputs, as a Z-set over all output columns."""
    ldf, rdf = df(spark, left, CUSTOMER), df(spark, right, SALES)
    joined = ldf.join(rdf, ldf.c_customer_sk == rdf.ss_customer_sk, how)
    return zset(joined, CUSTOMER_COLS + SALES_COLS)


def mutate(rng: random.Random, current: Counter[Row], make: Any, key_range: int,
           n: int = 12) -> list[tuple[Row, int]]:
    """Deletes, updates (delete + insert under the same key) and inserts of ``current``."""
    existing = sorted(current.elements(), key=repr)
    rng.shuffle(existing)
    out: list[tuple[Row, int]] = []
    for row in existing[:n]:                       # deletes
        out.append((row, -1))
    for row in existing[n:2 * n]:                  # updates
        out.append((row, -1))
        out.append((make(rng, row[0]), 1))
    for _ in range(n):                             # inserts, some on new keys, one NULL
        out.append((make(rng, rng.randrange(key_range)), 1))
    out.append((make(rng, None), 1))
    return out


def apply_to(current: Counter[Row], changes: list[tuple[Row, int]]) -> Counter[Row]:
    return add(Counter(current), Counter(dict(_sum(changes))))


def _sum(changes: list[tuple[Row, int]]) -> dict[Row, int]:
    out: dict[Row, int] = {}
    for r, w in changes:
        out[r] = out.get(r, 0) + w
    return out
