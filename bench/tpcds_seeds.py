"""Rows that give TPC-DS queries an answer at small scale factors (bench.tpcds_all).

Below SF1 many official queries have an empty answer (a store named 'ese', customers
buying in three channels on one day, returns above 10,000, year-over-year growth that
beats another channel's...), and a check of an empty answer proves nothing.  A *seed*
of query ``n`` (:data:`SEEDS`) makes, from the current tables (Arrow, as generated),
rows to add before population: ``[(table, rows), ...]`` in order, each step seeing
the rows of the steps before.  New dimension rows take the next free surrogate keys,
so a dimension stays unique on its key.  Most seeds are DuckDB queries over the
current tables (:func:`sql_seed`); a few are Arrow code.  They were written for
SF0.01 and hold at SF0.1 (the harness reports whether each answer is non-empty).
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import numpy as np

__all__ = ["SEEDS", "Seed", "sql_seed"]

Seed: TypeAlias = ("Callable[[Mapping[str, pa.Table], np.random.Generator], "
                   "list[tuple[str, pa.Table]]]")
"""A seed: current tables and a generator -> ``(table, rows)`` steps to add."""


def _replace(t: pa.Table, column: str, values: pa.Array | list[Any]) -> pa.Table:
    i = t.schema.get_field_index(column)
    return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))


def _seed_q44(tables: Mapping[str, pa.Table], rng: np.random.Generator
              ) -> list[tuple[str, pa.Table]]:
    """Sales at store 4 (SF0.01 has one store), a tenth of them without an address."""
    ss = tables["store_sales"]
    new = ss.take(pa.array(rng.choice(ss.num_rows, 400, replace=False)))
    new = _replace(new, "ss_store_sk", [4] * new.num_rows)
    addr = new.column("ss_addr_sk").to_pylist()
    new = _replace(new, "ss_addr_sk", [None if i % 10 == 0 else a for i, a in enumerate(addr)])
    return [("store_sales", new)]


def _seed_q49(tables: Mapping[str, pa.Table], rng: np.random.Generator
              ) -> list[tuple[str, pa.Table]]:
    """Returns above 10000 of December 2001 sales that pass q49's filters, per channel."""
    dates = tables["date_dim"]
    dec = set(dates.filter(pc.and_(pc.equal(dates["d_year"], 2001),
                                   pc.equal(dates["d_moy"], 12)))["d_date_sk"].to_pylist())
    out = []
    for sales, returns, p, cols in (
            ("web_sales", "web_returns", "ws", ("wr_order_number", "wr_item_sk",
                                                "wr_return_amt", "wr_return_quantity")),
            ("catalog_sales", "catalog_returns", "cs",
             ("cr_order_number", "cr_item_sk", "cr_return_amount", "cr_return_quantity")),
            ("store_sales", "store_returns", "ss",
             ("sr_ticket_number", "sr_item_sk", "sr_return_amt", "sr_return_quantity"))):
        t = tables[sales]
        ok = pc.and_(pc.and_(pc.is_in(t[f"{p}_sold_date_sk"], pa.array(sorted(dec))),
                             pc.greater(t[f"{p}_net_profit"], 1)),
                     pc.and_(pc.greater(t[f"{p}_net_paid"], 0),
                             pc.greater(t[f"{p}_quantity"], 0)))
        picked = t.filter(ok)
        picked = picked.take(pa.array(rng.permutation(picked.num_rows)[:30]))
        k = picked.num_rows
        number = "ss_ticket_number" if p == "ss" else f"{p}_order_number"
        tmpl = tables[returns].take(pa.array(rng.choice(tables[returns].num_rows, k)))
        tmpl = _replace(tmpl, cols[0], picked[number])
        tmpl = _replace(tmpl, cols[1], picked[f"{p}_item_sk"])
        amounts = [Decimal(int(v)) for v in rng.integers(10001, 19000, k)]
        tmpl = _replace(tmpl, cols[2], amounts)
        tmpl = _replace(tmpl, cols[3], rng.integers(1, 5, k).tolist())
        out.append((returns, tmpl))
    return out


def sql_seed(steps: list[tuple[str, str]]
              ) -> Callable[[Mapping[str, pa.Table], np.random.Generator],
                            list[tuple[str, pa.Table]]]:
    """A seed inserting, per step, the rows a DuckDB query makes of the current tables.

    Each step sees the rows the earlier ones inserted.  New dimension rows take the next
    free key, so declared unique keys stay unique.
    """

    def seed(tables: Mapping[str, pa.Table], rng: np.random.Generator
             ) -> list[tuple[str, pa.Table]]:
        del rng
        current = dict(tables)
        out = []
        import duckdb

        con = duckdb.connect()
        try:
            for t, sql in steps:
                for n, table in current.items():
                    con.register(n, table)
                rows = con.execute(sql).to_arrow_table().cast(current[t].schema)
                out.append((t, rows))
                current[t] = pa.concat_tables([current[t], rows])
        finally:
            con.close()
        return out

    return seed


def _new_row(table: str, key: str, sets: str) -> tuple[str, str]:
    """Two copies of a row of ``table`` under the next free keys, with ``sets`` replaced.

    Two: a change batch rewrites one row of a dimension of two rows (SF0.01 has one
    store), which must not take the only qualifying row away.
    """
    return (table, f"SELECT t.* REPLACE ((SELECT max({key}) FROM {table}) + k AS {key}, "
                   f"{sets}) FROM (SELECT * FROM {table} LIMIT 1) AS t, range(1, 3) AS r(k)")


def _last(table: str, key: str, spread: str = "0") -> str:
    """The last key of ``table`` or (``spread`` odd) the one before: the new rows'."""
    return f"((SELECT max({key}) FROM {table}) - ({spread}) % 2)"


def _two_warehouses(p: str, table: str, day: str, addr: str, site: str, site_key: str,
                    every: int) -> tuple[str, str]:
    """Orders copied under new numbers, each line twice (its warehouse and the next).

    Shipped on ``day`` to ``addr`` through ``site``: the multi-warehouse orders q16, q94
    and q95 count.
    """
    return (table, f"SELECT {table}.* REPLACE ({p}_order_number + 1000000 AS {p}_order_number, "
                   f"(SELECT d_date_sk FROM date_dim WHERE d_date = DATE '{day}') AS "
                   f"{p}_ship_date_sk, {addr} AS {p}_ship_addr_sk, {site} AS {site_key}, "
                   f"{p}_warehouse_sk + k AS {p}_warehouse_sk) FROM {table}, range(2) AS r(k) "
                   f"WHERE {p}_order_number % {every} = 0")


_ADDR = _last("customer_address", "ca_address_sk")
_WEB_ORDERS = [
    _new_row("web_site", "web_site_sk", "'pri' AS web_company_name"),
    _new_row("customer_address", "ca_address_sk", "'IL' AS ca_state"),
    _two_warehouses("ws", "web_sales", "1999-03-01", _ADDR,
                    _last("web_site", "web_site_sk", "ws_item_sk"), "ws_web_site_sk", 20)]
SEED_SQL: dict[int, list[tuple[str, str]]] = {
    88: [_new_row("store", "s_store_sk", "'ese' AS s_store_name"),
         ("store_sales", f"SELECT * REPLACE ({_last('store', 's_store_sk', 'ss_item_sk')} "
                         "AS ss_store_sk) FROM store_sales WHERE ss_ticket_number % 3 = 0")],
    90: [_new_row("web_page", "wp_web_page_sk", "5100 AS wp_char_count"),
         ("web_sales", f"SELECT * REPLACE ({_last('web_page', 'wp_web_page_sk', 'ws_item_sk')} "
                       "AS ws_web_page_sk) FROM web_sales WHERE ws_order_number % 2 = 0")],
    16: [_new_row("call_center", "cc_call_center_sk", "'Williamson County' AS cc_county"),
         _new_row("customer_address", "ca_address_sk", "'GA' AS ca_state"),
         _two_warehouses("cs", "catalog_sales", "2002-03-01", _ADDR,
                         _last("call_center", "cc_call_center_sk", "cs_item_sk"),
                         "cs_call_center_sk", 40)],
    94: _WEB_ORDERS,
    95: [*_WEB_ORDERS,
         ("web_returns", "SELECT r.* REPLACE (o.n AS wr_order_number) FROM (SELECT * FROM "
                         "web_returns LIMIT 1) AS r, (SELECT DISTINCT ws_order_number AS n FROM "
                         "web_sales WHERE ws_order_number > 1000000) AS o")],
    38: [(t, f"SELECT c.* REPLACE (s.ss_customer_sk AS {p}_bill_customer_sk, "
             f"s.ss_sold_date_sk AS {p}_sold_date_sk) FROM (SELECT * FROM {t} LIMIT 1) AS c, "
             "(SELECT DISTINCT ss_customer_sk, ss_sold_date_sk FROM store_sales, date_dim "
             "WHERE ss_sold_date_sk = d_date_sk AND d_month_seq BETWEEN 1200 AND 1211 AND "
             "ss_customer_sk IS NOT NULL ORDER BY 1, 2 LIMIT 20) AS s")
         for t, p in (("catalog_sales", "cs"), ("web_sales", "ws"))],
    8: [("customer_address", f"SELECT a.* REPLACE ({_ADDR} + k AS ca_address_sk, '24128' AS "
                             "ca_zip) FROM (SELECT * FROM customer_address LIMIT 1) AS a, "
                             "range(1, 13) AS r(k)"),
        ("customer", f"SELECT c.* REPLACE ({_last('customer', 'c_customer_sk')} + k AS "
                     f"c_customer_sk, 'Y' AS c_preferred_cust_flag, {_ADDR} - k + 1 AS "
                     "c_current_addr_sk) FROM (SELECT * FROM customer LIMIT 1) AS c, "
                     "range(1, 13) AS r(k)"),
        _new_row("store", "s_store_sk", "'24999' AS s_zip"),
        ("store_sales", f"SELECT * REPLACE ({_last('store', 's_store_sk', 'ss_item_sk')} AS "
                        "ss_store_sk) FROM store_sales WHERE ss_ticket_number % 4 = 0")],
    39: [("inventory", "SELECT i.* REPLACE (CASE WHEN k = 3 THEN 10000 ELSE 0 END AS "
                       "inv_quantity_on_hand) FROM inventory AS i, date_dim, range(4) AS r(k) "
                       "WHERE inv_date_sk = d_date_sk AND d_year = 2001 AND d_moy IN (1, 2) "
                       "AND inv_item_sk % 50 = 1")],
    23: [("store_sales", "SELECT s.* REPLACE (100 AS ss_quantity, 1000.00 AS ss_sales_price) "
                         "FROM (SELECT store_sales.* FROM store_sales, date_dim WHERE "
                         "ss_sold_date_sk = d_date_sk AND d_year = 2000 AND ss_customer_sk IS "
                         "NOT NULL AND ss_item_sk IS NOT NULL ORDER BY ss_ticket_number, "
                         "ss_item_sk LIMIT 1) AS s, range(5) AS r(k)"),
         ("catalog_sales", "SELECT c.* REPLACE ((SELECT d_date_sk FROM date_dim WHERE d_date = "
                           "DATE '2000-02-10') AS cs_sold_date_sk, s.ss_customer_sk AS "
                           "cs_bill_customer_sk, s.ss_item_sk AS cs_item_sk) FROM (SELECT * "
                           "FROM catalog_sales LIMIT 2) AS c, (SELECT * FROM store_sales WHERE "
                           "ss_quantity = 100 AND ss_sales_price = 1000.00 LIMIT 1) AS s")],
}
"""DuckDB queries of rows that give these queries a non-trivial answer at SF0.01: a store
named 'ese' (q88), a web page of 5000-5200 characters (q90), orders shipped from two
warehouses in the queries' windows and states (q16, q94, q95), customers buying on one
day in all three channels (q38), twelve preferred customers in a listed zip (q8), months
of widely varying inventory (q39), a best customer buying a frequent item (q23)."""


def _on_day(day: str) -> str:
    return f"(SELECT d_date_sk FROM date_dim WHERE d_date = DATE '{day}')"


def _customers_at_new_addresses(sets: str = "") -> tuple[str, str]:
    """Two new customers living at the two addresses added last."""
    return ("customer", f"SELECT c.* REPLACE ({_last('customer', 'c_customer_sk')} + k AS "
                        f"c_customer_sk, {_ADDR} - k + 1 AS c_current_addr_sk{sets}) FROM "
                        "(SELECT * FROM customer WHERE c_current_cdemo_sk IS NOT NULL LIMIT 1) "
                        "AS c, range(1, 3) AS r(k)")


_NEW_CUSTOMER = "(SELECT max(c_customer_sk) FROM customer) - k % 2"
_NEW_ITEM = "(SELECT max(i_item_sk) FROM item) - k % 2"


def _sales_of(table: str, p: str, column: str, value: str, day: str, sets: str = "",
              n: int = 4) -> tuple[str, str]:
    """``n`` copies of a sale on ``day`` with ``column`` set to ``value`` (k: the copy)."""
    return (table, f"SELECT s.* REPLACE ({value} AS {p}_{column}, {_on_day(day)} AS "
                   f"{p}_sold_date_sk{sets}) FROM (SELECT * FROM {table} LIMIT 1) AS s, "
                   f"range({n}) AS r(k)")


SEED_SQL.update({
    10: [_new_row("customer_address", "ca_address_sk", "'Rush County' AS ca_county"),
         _customers_at_new_addresses(),
         _sales_of("store_sales", "ss", "customer_sk", _NEW_CUSTOMER, "2002-02-10"),
         _sales_of("web_sales", "ws", "bill_customer_sk", _NEW_CUSTOMER, "2002-03-10")],
    24: [_new_row("store", "s_store_sk", "8 AS s_market_id, '99999' AS s_zip"),
         _new_row("item", "i_item_sk", "'peach' AS i_color"),
         _new_row("customer_address", "ca_address_sk",
                  "'99999' AS ca_zip, 'United States' AS ca_country"),
         _customers_at_new_addresses(", 'CANADA' AS c_birth_country"),
         ("store_sales", "SELECT s.* REPLACE ((SELECT max(ss_ticket_number) FROM store_sales) "
                         f"+ k AS ss_ticket_number, {_NEW_ITEM} AS ss_item_sk, {_NEW_CUSTOMER} "
                         "AS ss_customer_sk, (SELECT max(s_store_sk) FROM store) - k % 2 AS "
                         "ss_store_sk, 10.00 + k AS ss_net_paid) FROM (SELECT * FROM "
                         "store_sales LIMIT 1) AS s, range(1, 7) AS r(k)"),
         ("store_returns", "SELECT r.* REPLACE (s.ss_ticket_number AS sr_ticket_number, "
                           "s.ss_item_sk AS sr_item_sk) FROM (SELECT * FROM store_returns "
                           "LIMIT 1) AS r, (SELECT ss_ticket_number, ss_item_sk FROM store_sales "
                           "WHERE ss_ticket_number > (SELECT max(ss_ticket_number) - 6 FROM "
                           "store_sales)) AS s")],
    30: [("web_returns", "SELECT w.* REPLACE (c.c_customer_sk AS wr_returning_customer_sk, "
                         "c.c_current_addr_sk AS wr_returning_addr_sk, "
                         f"{_on_day('2002-05-01')} AS wr_returned_date_sk, CASE WHEN c.r = 1 "
                         "THEN 5000.00 ELSE 1.00 END AS wr_return_amt) FROM (SELECT * FROM "
                         "web_returns LIMIT 1) AS w, (SELECT c_customer_sk, c_current_addr_sk, "
                         "row_number() OVER (ORDER BY c_customer_sk) AS r FROM customer, "
                         "customer_address WHERE c_current_addr_sk = ca_address_sk AND "
                         "ca_state = 'GA' ORDER BY c_customer_sk LIMIT 3) AS c")],
    32: [_new_row("item", "i_item_sk", "977 AS i_manufact_id"),
         _sales_of("catalog_sales", "cs", "item_sk", _NEW_ITEM, "2000-02-10",
                   ", CASE WHEN k < 2 THEN 100.00 ELSE 1.00 END AS cs_ext_discount_amt", 8)],
    92: [_new_row("item", "i_item_sk", "350 AS i_manufact_id"),
         _sales_of("web_sales", "ws", "item_sk", _NEW_ITEM, "2000-02-10",
                   ", CASE WHEN k < 2 THEN 100.00 ELSE 1.00 END AS ws_ext_discount_amt", 8)],
    41: [_new_row("item", "i_item_sk", "740 AS i_manufact_id, 'seedmanufact' AS i_manufact, "
                  "'Women' AS i_category, 'powder' AS i_color, 'Ounce' AS i_units, 'medium' "
                  "AS i_size, 'seeded product' AS i_product_name")],
    54: [_new_row("item", "i_item_sk", "'Women' AS i_category, 'maternity' AS i_class"),
         _new_row("customer_address", "ca_address_sk",
                  "'Williamson County' AS ca_county, 'TN' AS ca_state"),
         _customers_at_new_addresses(),
         _sales_of("catalog_sales", "cs", "bill_customer_sk", _NEW_CUSTOMER, "1998-12-10",
                   f", {_NEW_ITEM} AS cs_item_sk"),
         _sales_of("store_sales", "ss", "customer_sk", _NEW_CUSTOMER, "1999-02-10",
                   ", (SELECT min(s_store_sk) FROM store WHERE s_county = 'Williamson County' "
                   "AND s_state = 'TN') AS ss_store_sk")],
    58: [_new_row("item", "i_item_sk", "'AAAAAAAASEEDITEM' AS i_item_id"),
         *(_sales_of(t, p, "item_sk", _NEW_ITEM, "2000-01-03", f", 100.00 AS {p}_ext_sales_price",
                     40) for t, p in (("store_sales", "ss"), ("catalog_sales", "cs"),
                                      ("web_sales", "ws")))],
})
"""Rows giving the subquery queries an answer at SF0.01: customers of a listed county
buying in store and on the web (q10), a market-8 store selling peach items to customers
born abroad who live at its zip, with returns (q24), a large and a small 2002 web return
by Georgian customers (q30), sales of an item of the queried manufacturer with two
discounts far above its average (q32, q92), an item matching q41's combinations,
Williamson County customers buying maternity wear in December 1998 and in the store
two months later (q54), one item sold for the same amount in all three channels in
q58's week (forty sales each: a change batch deleting a few keeps them within 10%)."""




_CHANNELS = {"s": ("store_sales", "ss", "ss_customer_sk"),
             "c": ("catalog_sales", "cs", "cs_bill_customer_sk"),
             "w": ("web_sales", "ws", "ws_bill_customer_sk")}
_PRICES = ("ext_list_price", "ext_sales_price", "net_paid")
_NO_COST = ("ext_wholesale_cost", "ext_discount_amt")


def _year_over_year(channels: str, boost: str, customers: int = 3) -> Seed:
    """Sales putting ``customers`` into a year-over-year query's answer (q4, q11, q74).

    Their answer is empty below SF1: it keeps customers buying in every channel in 2001
    and 2002 whose growth in ``boost`` beats the others'.  Each customer gets, on one
    2001 and one 2002 date, a sale of 50,000 per channel, and two more of 99,999.99 in
    2002 in ``boost``: a growth of ~5 against ~1, unless the customer's own sales are
    of that order, which TPC-DS's are not.  The sales are hot: deletes pick them.
    """

    def seed(tables: Mapping[str, pa.Table], rng: np.random.Generator
             ) -> list[tuple[str, pa.Table]]:
        from decimal import Decimal

        cust = tables["customer"]
        pick = rng.choice(cust.num_rows, customers, replace=False)
        sks = cust["c_customer_sk"].take(pa.array(pick)).to_pylist()
        dates = tables["date_dim"]
        year = dates["d_year"].to_numpy(zero_copy_only=False)
        date_sks = dates["d_date_sk"].to_numpy()
        d1 = int(rng.choice(date_sks[year == 2001]))
        d2 = int(rng.choice(date_sks[year == 2002]))
        big, top = Decimal("50000.00"), Decimal("99999.99")
        rows: list[tuple[str, pa.Table]] = []
        for ch in channels:
            table, p, customer_col = _CHANNELS[ch]
            plan = [(d1, big), (d2, big)] + ([(d2, top)] * 2 if ch == boost else [])
            t = tables[table]
            template = t.slice(int(rng.integers(0, t.num_rows)), 1).to_pylist()[0]
            out = [{**template, customer_col: sk, f"{p}_sold_date_sk": d,
                    **{f"{p}_{c}": price for c in _PRICES},
                    **{f"{p}_{c}": Decimal(0) for c in _NO_COST}}
                   for sk in sks for d, price in plan]
            rows.append((table, pa.Table.from_pylist(out, t.schema)))
        return rows

    return seed


def _same_day_everywhere(months: tuple[int, int] = (1200, 1211), customers: int = 4) -> Seed:
    """Customers buying on one day in all three channels (q38's INTERSECT).

    Below SF1 no customer does, within q38's twelve months: its count is zero.  Each
    of ``customers`` random customers gets one sale per channel on one date of those
    months (rows templated on random sales); the sales are hot, so deletes pick them.
    """

    def seed(tables: Mapping[str, pa.Table], rng: np.random.Generator
             ) -> list[tuple[str, pa.Table]]:
        cust = tables["customer"]
        sks = cust["c_customer_sk"].take(
            pa.array(rng.choice(cust.num_rows, customers, replace=False))).to_pylist()
        dates = tables["date_dim"]
        seq = dates["d_month_seq"].to_numpy(zero_copy_only=False)
        ok = (seq >= months[0]) & (seq <= months[1])
        days = rng.choice(dates["d_date_sk"].to_numpy()[ok], customers).tolist()
        rows: list[tuple[str, pa.Table]] = []
        for table, p, customer_col in _CHANNELS.values():
            t = tables[table]
            out = [{**t.slice(int(rng.integers(0, t.num_rows)), 1).to_pylist()[0],
                    customer_col: sk, f"{p}_sold_date_sk": day}
                   for sk, day in zip(sks, days, strict=True)]
            rows.append((table, pa.Table.from_pylist(out, t.schema)))
        return rows

    return seed


SEED_SQL[96] = SEED_SQL[88]  # sales at a store named 'ese', as q88
SEED_SQL[93] = [
    _new_row("reason", "r_reason_sk", "'reason 28' AS r_reason_desc"),
    ("store_returns", "SELECT r.* REPLACE (s.ss_ticket_number AS sr_ticket_number, s.ss_item_sk "
                      "AS sr_item_sk, (SELECT max(r_reason_sk) FROM reason) - s.ss_ticket_number "
                      "% 2 AS sr_reason_sk, 1 AS sr_return_quantity) FROM (SELECT * FROM "
                      "store_returns LIMIT 1) AS r, (SELECT ss_ticket_number, ss_item_sk FROM "
                      "store_sales WHERE ss_ticket_number % 50 = 0 ORDER BY 1, 2 LIMIT 40) AS s")]
"""q96 counts sales at the store 'ese' (as q88); q93 returns for 'reason 28', which the
generator names only from SF1 on: two such reasons and forty returns of sales citing
them."""

SEEDS: dict[int, Seed] = {44: _seed_q44, 49: _seed_q49, 4: _year_over_year("scw", "c"),
                          11: _year_over_year("sw", "w"), 74: _year_over_year("sw", "w"),
                          38: _same_day_everywhere()}
SEEDS.update({n: sql_seed(steps) for n, steps in SEED_SQL.items() if n not in SEEDS})
"""Seeds per query number."""
