"""Synthetic TPC-DS-shaped data: a customer-like dimension and a store_sales-like fact.

It lives in ``population`` (not ``bench``) because the population CLI's ``--synthetic``
mode needs it and lower layers never import ``bench``.

The shapes follow TPC-DS at SF1 (100k customers, ~2.9M store_sales rows over those
customers), so the asymmetry that population exploits is present, without needing
dsdgen.  Everything is seeded: the same arguments give the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "CUSTOMER_SCHEMA",
    "SALES_SCHEMA",
    "customer_batches",
    "customers",
    "sales",
    "sales_batches",
]

CUSTOMER_SCHEMA = pa.schema([
    ("c_customer_sk", pa.int64()),
    ("c_customer_id", pa.string()),
    ("c_first_name", pa.string()),
    ("c_last_name", pa.string()),
    ("c_birth_year", pa.int32()),
    ("c_birth_month", pa.int32()),
    ("c_preferred_cust_flag", pa.bool_()),
    ("c_balance", pa.float64()),
])

SALES_SCHEMA = pa.schema([
    ("ss_sold_date_sk", pa.int64()),
    ("ss_item_sk", pa.int64()),
    ("ss_customer_sk", pa.int64()),
    ("ss_ticket_number", pa.int64()),
    ("ss_quantity", pa.int32()),
    ("ss_net_paid", pa.float64()),
])

_FIRST = np.array(["James", "Mary", "John", "Linda", "Robert", "Maria", "David", "Sara"])
_LAST = np.array(["Smith", "Jones", "Brown", "Garcia", "Miller", "Davis", "Lopez", "Wilson"])


def customers(n: int, seed: int = 0, start: int = 0) -> pa.Table:
    """``n`` customers with unique ``c_customer_sk`` in ``[start, start + n)``, shuffled."""
    rng = np.random.default_rng(seed)
    sk = rng.permutation(np.arange(start, start + n, dtype=np.int64))
    ids = pa.array([f"AAAAAAAA{v:08X}" for v in sk.tolist()], pa.string())
    return pa.table({
        "c_customer_sk": sk,
        "c_customer_id": ids,
        "c_first_name": pa.array(_FIRST[rng.integers(0, len(_FIRST), n)]),
        "c_last_name": pa.array(_LAST[rng.integers(0, len(_LAST), n)]),
        "c_birth_year": rng.integers(1924, 1993, n).astype(np.int32),
        "c_birth_month": rng.integers(1, 13, n).astype(np.int32),
        "c_preferred_cust_flag": rng.random(n) < 0.5,
        "c_balance": np.round(rng.random(n) * 10_000, 2),
    }, schema=CUSTOMER_SCHEMA)


def sales(n: int, n_customers: int, seed: int = 1, first_ticket: int = 0) -> pa.Table:
    """``n`` sales rows whose ``ss_customer_sk`` are uniform over ``[0, n_customers)``."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "ss_sold_date_sk": rng.integers(2_450_815, 2_452_642, n, dtype=np.int64),
        "ss_item_sk": rng.integers(1, 18_001, n, dtype=np.int64),
        "ss_customer_sk": rng.integers(0, n_customers, n, dtype=np.int64),
        "ss_ticket_number": np.arange(first_ticket, first_ticket + n, dtype=np.int64),
        "ss_quantity": rng.integers(1, 101, n).astype(np.int32),
        "ss_net_paid": np.round(rng.random(n) * 500, 2),
    }, schema=SALES_SCHEMA)


def customer_batches(n: int, batch_rows: int = 65_536, seed: int = 0) -> Iterator[pa.RecordBatch]:
    """:func:`customers` as record batches of ``batch_rows``."""
    yield from customers(n, seed).to_batches(max_chunksize=batch_rows)


def sales_batches(
    n: int, n_customers: int, batch_rows: int = 65_536, seed: int = 1
) -> Iterator[pa.RecordBatch]:
    """:func:`sales` generated batch by batch (bounded memory for tens of millions)."""
    done = 0
    part = 0
    while done < n:
        m = min(batch_rows, n - done)
        yield from sales(m, n_customers, seed=seed * 1_000_003 + part, first_ticket=done
                         ).to_batches()
        done += m
        part += 1
