"""Rows that give TPC-DS queries an answer at small scale factors (bench.tpcds_all).

Below SF1 many official queries have an empty answer (a store named 'ese', customers
buying in three channels on one day, returns above 10,000, year-over-year growth that
beats another channel's...), and a check of an empty answer proves nothing.  A *seed*
of query ``n`` (:data:`SEEDS`) makes, from the current tables (Arrow, as generated),
rows to add before population: ``[(table, rows), ...]`` in order, each step seeing
the rows of the steps before.  New dimension rows take the next free surrogate keys,
so a dimension stays unique on its key.  Most seeds are DuckDB queries over the
current tables (:func:`sql_seed`); a few are Arrow code.  They were written for
SF0.01 and SF0.1; the harness fails a query whose answer is empty after population
or that no change batch changes (``vacuous``), so a seed that stops working shows.
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
    free key, so declared unique keys stay unique.  The tables a step names are loaded
    into DuckDB as tables, not scanned as Arrow: with their statistics DuckDB orders a
    many-way join well (q64's sixteen-way join of returned sales, planned over Arrow
    scans, runs for minutes and takes gigabytes).
    """

    def seed(tables: Mapping[str, pa.Table], rng: np.random.Generator
             ) -> list[tuple[str, pa.Table]]:
        del rng
        current = dict(tables)
        out = []
        import duckdb

        con = duckdb.connect()
        loaded: set[str] = set()
        try:
            for t, sql in steps:
                for n in _tables_named(sql, current) - loaded:
                    _load(con, n, current[n], create=True)
                    loaded.add(n)
                rows = con.execute(sql).to_arrow_table().cast(current[t].schema)
                out.append((t, rows))
                current[t] = pa.concat_tables([current[t], rows])
                if t in loaded:
                    _load(con, t, rows, create=False)
        finally:
            con.close()
        return out

    return seed


def _tables_named(sql: str, tables: Mapping[str, pa.Table]) -> set[str]:
    """The names of ``tables`` that ``sql`` reads."""
    import sqlglot
    import sqlglot.expressions as exp

    return {t.name for t in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Table)
            if t.name in tables}


def _load(con: Any, name: str, rows: pa.Table, *, create: bool) -> None:
    """``rows`` into DuckDB table ``name``: created from them, or appended to it."""
    con.register("seed_rows", rows)
    try:
        con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM seed_rows' if create
                    else f'INSERT INTO "{name}" SELECT * FROM seed_rows')
    finally:
        con.unregister("seed_rows")


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



def _returned_and_bought_in_catalog(sold: str, returned: str, bought: str, n: int = 10
                                    ) -> list[tuple[str, str]]:
    """Store sales returned, whose customers then buy the same item from the catalog.

    ``n`` store sales sold on a date matching ``sold`` and returned on one matching
    ``returned`` (date_dim conditions on ``d1`` and ``d2``) get a catalog sale each: the
    same customer and item, sold on the day ``bought``, under a new order number.  At
    SF0.1 no returning customer buys the item again from the catalog (q25, q29).
    """
    return [("catalog_sales", "SELECT c.* REPLACE ((SELECT max(cs_order_number) FROM "
                              "catalog_sales) + p.k AS cs_order_number, p.sr_customer_sk AS "
                              "cs_bill_customer_sk, p.sr_customer_sk AS cs_ship_customer_sk, "
                              f"p.sr_item_sk AS cs_item_sk, {_on_day(bought)} AS cs_sold_date_sk) "
                              "FROM (SELECT * FROM catalog_sales LIMIT 1) AS c, (SELECT "
                              "sr_customer_sk, sr_item_sk, row_number() OVER (ORDER BY "
                              "sr_ticket_number, sr_item_sk) AS k FROM store_sales, "
                              "store_returns, date_dim AS d1, date_dim AS d2 WHERE "
                              "ss_sold_date_sk = d1.d_date_sk AND sr_returned_date_sk = "
                              "d2.d_date_sk AND ss_ticket_number = sr_ticket_number AND "
                              "ss_item_sk = sr_item_sk AND ss_customer_sk = sr_customer_sk AND "
                              f"{sold} AND {returned} ORDER BY sr_ticket_number, sr_item_sk "
                              f"LIMIT {n}) AS p")]


def _new_items(tag: str, sets: str, n: int = 6) -> tuple[str, str]:
    """``n`` items under the next free keys, copies of the first ``n`` (k: 1..n).

    Each keeps its template's description and brand (the seeded items differ, so a
    change batch copying one's column into another changes the answer) and gets the
    item id ``AAAAAAAASEED<tag><k>`` and ``sets``.
    """
    return ("item", "SELECT * EXCLUDE (k) REPLACE ((SELECT max(i_item_sk) FROM item) + k AS "
                    f"i_item_sk, printf('AAAAAAAASEED{tag}%02d', k) AS i_item_id, {sets}) FROM "
                    "(SELECT *, row_number() OVER (ORDER BY i_item_sk) AS k FROM item ORDER BY "
                    f"i_item_sk LIMIT {n})")


def _seeded_items(n: int = 6) -> str:
    """The ``n`` items :func:`_new_items` added, numbered k = 1..n."""
    return (f"(SELECT i_item_sk, i_item_sk - (SELECT max(i_item_sk) FROM item) + {n} AS k "
            f"FROM item WHERE i_item_sk > (SELECT max(i_item_sk) FROM item) - {n})")


def _in_stock_and_sold(tag: str, manufacts: str, price: int, first: str, last: str,
                       sales: str, p: str) -> list[tuple[str, str]]:
    """Six items of q37/q82's manufacturers and price band, in stock and sold.

    At SF0.1 no item of the four listed manufacturers is in the price band (q37's do
    not exist at all).  Each new item (prices ``price`` + 4k) has one inventory row of
    150-400 units on the k-th inventory date between ``first`` and ``last``, and two
    sales in ``sales`` (lines added to existing tickets or orders: the item is new, so
    each line stays unique).
    """
    number = "ss_ticket_number" if p == "ss" else f"{p}_order_number"
    return [
        _new_items(tag, f"CAST({price} + 4 * k AS DECIMAL(7, 2)) AS i_current_price, "
                        f"[{manufacts}][k % 4 + 1] AS i_manufact_id"),
        ("inventory", "SELECT v.* REPLACE (i.i_item_sk AS inv_item_sk, d.inv_date_sk AS "
                      "inv_date_sk, 100 + 50 * i.k AS inv_quantity_on_hand) FROM (SELECT * FROM "
                      f"inventory LIMIT 1) AS v, {_seeded_items()} AS i, (SELECT inv_date_sk, "
                      "row_number() OVER (ORDER BY inv_date_sk) AS k FROM (SELECT DISTINCT "
                      "inv_date_sk FROM inventory, date_dim WHERE inv_date_sk = d_date_sk AND "
                      f"d_date BETWEEN DATE '{first}' AND DATE '{last}')) AS d WHERE d.k = "
                      "(i.k - 1) % (SELECT count(DISTINCT inv_date_sk) FROM inventory, date_dim "
                      f"WHERE inv_date_sk = d_date_sk AND d_date BETWEEN DATE '{first}' AND DATE "
                      f"'{last}') + 1"),
        (sales, f"SELECT s.* EXCLUDE (j) REPLACE (i.i_item_sk AS {p}_item_sk) FROM (SELECT *, "
                f"row_number() OVER (ORDER BY {number}) AS j FROM {sales} ORDER BY {number} "
                f"LIMIT 12) AS s, {_seeded_items()} AS i WHERE (s.j - 1) % 6 + 1 = i.k")]


_STORE_PAIRS = ("FROM store_sales, store_returns, date_dim AS d1, date_dim AS d2, date_dim AS "
                "d3, store, customer, customer_demographics AS cd1, customer_demographics AS "
                "cd2, promotion, household_demographics AS hd1, household_demographics AS hd2, "
                "customer_address AS ad1, customer_address AS ad2, income_band AS ib1, "
                "income_band AS ib2 WHERE ss_store_sk = s_store_sk AND ss_sold_date_sk = "
                "d1.d_date_sk AND ss_customer_sk = c_customer_sk AND ss_cdemo_sk = "
                "cd1.cd_demo_sk AND ss_hdemo_sk = hd1.hd_demo_sk AND ss_addr_sk = "
                "ad1.ca_address_sk AND ss_item_sk = sr_item_sk AND ss_ticket_number = "
                "sr_ticket_number AND c_current_cdemo_sk = cd2.cd_demo_sk AND c_current_hdemo_sk "
                "= hd2.hd_demo_sk AND c_current_addr_sk = ad2.ca_address_sk AND "
                "c_first_sales_date_sk = d2.d_date_sk AND c_first_shipto_date_sk = d3.d_date_sk "
                "AND ss_promo_sk = p_promo_sk AND hd1.hd_income_band_sk = ib1.ib_income_band_sk "
                "AND hd2.hd_income_band_sk = ib2.ib_income_band_sk AND cd1.cd_marital_status <> "
                "cd2.cd_marital_status AND ss_ticket_number < 1000000")
"""Returned store sales whose every dimension row exists, by customers whose marital
status has changed since (q64's joins, less its item filters)."""
_CATALOG_PAIRS = ("FROM catalog_sales, catalog_returns WHERE cs_item_sk = cr_item_sk AND "
                  "cs_order_number = cr_order_number AND cs_ext_list_price > 2 * "
                  "(cr_refunded_cash + cr_reversed_charge + cr_store_credit) AND "
                  "cs_order_number < 1000000 ORDER BY cs_order_number, cs_item_sk LIMIT 3")
"""Returned catalog sales refunded less than half their list price (q64's cs_ui)."""


def _store_pairs(table: str) -> str:
    """Two pairs of :data:`_STORE_PAIRS` sold in 1999 and two in 2000: ``table``'s rows.

    One pair per ticket: the seeded copies of two lines of one ticket would share a ticket
    and an item, each sale joining both returns (a count of four in q64's year 2000, which
    must not exceed 1999's).
    """
    return " UNION ALL ".join(
        f"(SELECT {table}.* {_STORE_PAIRS} AND d1.d_year = {y} QUALIFY row_number() OVER "
        "(PARTITION BY ss_ticket_number ORDER BY ss_item_sk) = 1 ORDER BY ss_ticket_number "
        "LIMIT 2)" for y in (1999, 2000))


_TWO_NEW_ITEMS = "(SELECT max(i_item_sk) FROM item) - k % 2"
SEED_SQL.update({
    # SF1 has no store sale of 2001Q1 returned in 2001Q1-Q3 and bought again from the
    # catalog in those quarters
    17: _returned_and_bought_in_catalog("d1.d_quarter_name = '2001Q1'",
                                        "d2.d_quarter_name IN ('2001Q1', '2001Q2', '2001Q3')",
                                        "2001-05-15"),
    25: _returned_and_bought_in_catalog("d1.d_year = 2001 AND d1.d_moy = 4",
                                        "d2.d_year = 2001 AND d2.d_moy BETWEEN 4 AND 10",
                                        "2001-08-15"),
    29: _returned_and_bought_in_catalog("d1.d_year = 1999 AND d1.d_moy = 9",
                                        "d2.d_year = 1999 AND d2.d_moy BETWEEN 9 AND 12",
                                        "2000-03-15"),
    37: _in_stock_and_sold("37", "677, 940, 694, 808", 68, "2000-02-01", "2000-04-01",
                           "catalog_sales", "cs"),
    82: _in_stock_and_sold("82", "129, 270, 821, 423", 62, "2000-05-25", "2000-07-24",
                           "store_sales", "ss"),
    64: [_new_row("item", "i_item_sk", "'purple' AS i_color, 70.00 AS i_current_price"),
         ("catalog_sales", "SELECT c.* REPLACE (cs_order_number + 1000000 * k AS "
                           f"cs_order_number, {_TWO_NEW_ITEMS} AS cs_item_sk) FROM (SELECT "
                           f"catalog_sales.* {_CATALOG_PAIRS}) AS c, range(1, 3) AS r(k)"),
         ("catalog_returns", "SELECT c.* REPLACE (cr_order_number + 1000000 * k AS "
                             f"cr_order_number, {_TWO_NEW_ITEMS} AS cr_item_sk) FROM (SELECT "
                             f"catalog_returns.* {_CATALOG_PAIRS}) AS c, range(1, 3) AS r(k)"),
         ("store_sales", "SELECT s.* REPLACE (ss_ticket_number + 1000000 * k AS "
                         f"ss_ticket_number, {_TWO_NEW_ITEMS} AS ss_item_sk) FROM "
                         f"({_store_pairs('store_sales')}) AS s, range(1, 3) AS r(k)"),
         ("store_returns", "SELECT s.* REPLACE (sr_ticket_number + 1000000 * k AS "
                           f"sr_ticket_number, {_TWO_NEW_ITEMS} AS sr_item_sk) FROM "
                           f"({_store_pairs('store_returns')}) AS s, range(1, 3) AS r(k)")],
    65: [("store_sales", "SELECT s.* EXCLUDE (j) REPLACE ((SELECT max(ss_ticket_number) FROM "
                         "store_sales) + i.k AS ss_ticket_number, i.i_item_sk AS ss_item_sk, 1 "
                         "AS ss_quantity, CAST(5 * i.k AS DECIMAL(7, 2)) AS ss_sales_price, "
                         "CAST(5 * i.k AS DECIMAL(7, 2)) AS ss_ext_sales_price) FROM (SELECT "
                         "store_sales.*, row_number() OVER (ORDER BY ss_ticket_number, "
                         "ss_item_sk) AS j FROM store_sales, date_dim "
                         "WHERE ss_sold_date_sk = d_date_sk AND d_month_seq BETWEEN 1176 AND 1187 "
                         "AND ss_store_sk IS NOT NULL ORDER BY ss_ticket_number, ss_item_sk "
                         "LIMIT 1) AS s, (SELECT i_item_sk, row_number() OVER (ORDER BY "
                         "i_item_sk) AS k FROM item WHERE i_item_sk NOT IN (SELECT ss_item_sk "
                         "FROM store_sales, date_dim WHERE ss_sold_date_sk = d_date_sk AND "
                         "d_month_seq BETWEEN 1176 AND 1187 AND ss_item_sk IS NOT NULL) ORDER BY "
                         "i_item_sk LIMIT 6) AS i")],
})
"""Rows giving the multi-channel and inventory queries an answer at SF0.1: returning
store customers buying the item again from the catalog (q25, q29), items of the listed
manufacturers in stock and sold (q37, q82), two purple items sold and returned in
store in 1999 and 2000 and returned through the catalog at under half their price
(q64), six items a store first sells in 1998, once each, for 5-30 (q65: revenue under
a tenth of the store's average)."""

_Q83_WEEKS = ("(SELECT d_date_sk FROM date_dim WHERE d_week_seq IN (SELECT d_week_seq FROM "
              "date_dim WHERE d_date IN (DATE '2000-06-30', DATE '2000-09-27', DATE "
              "'2000-11-17')))")
_Q85_STATES = "('IN', 'OH', 'NJ', 'WI', 'CT', 'KY', 'LA', 'IA', 'AR')"
_Q85_RETURNS = ("FROM web_sales, web_returns, date_dim WHERE ws_item_sk = wr_item_sk AND "
                "ws_order_number = wr_order_number AND ws_sold_date_sk = d_date_sk AND d_year = "
                "2000 AND ws_sales_price BETWEEN 50.00 AND 100.00 AND ws_order_number < 1000000 "
                "ORDER BY ws_order_number, ws_item_sk LIMIT 8")
"""Returned web sales of 2000 at a price q85's single, college-educated customers' band
admits."""
SEED_SQL.update({
    83: [("web_returns", "SELECT r.* REPLACE (w.ws_item_sk AS wr_item_sk, w.ws_order_number AS "
                         "wr_order_number, w.ws_bill_customer_sk AS wr_refunded_customer_sk, "
                         "w.ws_bill_customer_sk AS wr_returning_customer_sk, (SELECT "
                         "min(d_date_sk) FROM date_dim WHERE d_date = [DATE '2000-06-30', DATE "
                         "'2000-09-27', DATE "
                         "'2000-11-17'][(w.k + w.j) % 3 + 1]) AS wr_returned_date_sk, w.k AS "
                         "wr_return_quantity) FROM (SELECT * FROM web_returns LIMIT 1) AS r, "
                         "(SELECT ws_item_sk, ws_order_number, ws_bill_customer_sk, dense_rank() "
                         "OVER (ORDER BY i_item_id) AS k, row_number() OVER (PARTITION BY "
                         "i_item_id ORDER BY ws_order_number, ws_item_sk) AS j FROM (SELECT "
                         "i_item_id, ws_item_sk, ws_order_number, ws_bill_customer_sk FROM "
                         "web_sales, item, date_dim "
                         "WHERE ws_item_sk = i_item_sk AND ws_sold_date_sk = d_date_sk AND d_date "
                         "< DATE '2000-06-24' AND NOT EXISTS (SELECT 1 FROM web_returns WHERE "
                         "wr_order_number = ws_order_number AND wr_item_sk = ws_item_sk) AND "
                         "i_item_id IN (SELECT i_item_id FROM store_returns, item WHERE sr_item_sk "
                         f"= i_item_sk AND sr_returned_date_sk IN {_Q83_WEEKS} INTERSECT SELECT "
                         "i_item_id FROM catalog_returns, item WHERE cr_item_sk = i_item_sk AND "
                         f"cr_returned_date_sk IN {_Q83_WEEKS}) QUALIFY row_number() OVER "
                         "(PARTITION BY i_item_id ORDER BY ws_order_number, ws_item_sk) <= 2 ORDER "
                         "BY i_item_id, ws_order_number, ws_item_sk LIMIT 24)) AS w")],
    85: [("web_sales", "SELECT web_sales.* REPLACE (ws_order_number + 1000000 AS ws_order_number, "
                       f"175.00 AS ws_net_profit) {_Q85_RETURNS}"),
         ("web_returns", "SELECT w.* EXCLUDE (k) REPLACE (wr_order_number + 1000000 AS "
                         "wr_order_number, a.ca_address_sk AS wr_refunded_addr_sk, d.cd_demo_sk "
                         "AS wr_refunded_cdemo_sk, d.cd_demo_sk AS wr_returning_cdemo_sk) FROM "
                         "(SELECT web_returns.*, row_number() OVER (ORDER BY ws_order_number, "
                         f"ws_item_sk) AS k {_Q85_RETURNS}) AS w, (SELECT ca_address_sk, "
                         "row_number() OVER (ORDER BY ca_address_sk) AS k FROM customer_address "
                         f"WHERE ca_country = 'United States' AND ca_state IN {_Q85_STATES}) AS a, "
                         "(SELECT cd_demo_sk, row_number() OVER (ORDER BY cd_demo_sk) AS k FROM "
                         "customer_demographics WHERE cd_marital_status = 'S' AND "
                         "cd_education_status = 'College') AS d WHERE w.k = a.k AND w.k = d.k")],
    91: [("customer", "SELECT c.* REPLACE ((SELECT max(c_customer_sk) FROM customer) + a.k AS "
                      "c_customer_sk, (SELECT min(cd_demo_sk) FROM customer_demographics WHERE "
                      "CASE WHEN a.k % 2 = 0 THEN cd_marital_status = 'M' AND "
                      "cd_education_status = 'Unknown' ELSE cd_marital_status = 'W' AND "
                      "cd_education_status = 'Advanced Degree' END) AS c_current_cdemo_sk, "
                      "(SELECT min(hd_demo_sk) FROM household_demographics WHERE "
                      "hd_buy_potential LIKE 'Unknown%') AS c_current_hdemo_sk, a.ca_address_sk "
                      "AS c_current_addr_sk) FROM (SELECT * FROM customer LIMIT 1) AS c, (SELECT "
                      "ca_address_sk, row_number() OVER (ORDER BY ca_address_sk) AS k FROM "
                      "customer_address WHERE ca_gmt_offset = -7 ORDER BY ca_address_sk LIMIT 4) "
                      "AS a"),
         ("catalog_returns", "SELECT r.* EXCLUDE (k) REPLACE (s.cs_order_number AS "
                             "cr_order_number, s.cs_item_sk AS cr_item_sk, s.cs_call_center_sk AS "
                             "cr_call_center_sk, (SELECT max(c_customer_sk) FROM customer) - s.k % "
                             f"4 AS cr_returning_customer_sk, {_on_day('1998-11-01')} + s.k AS "
                             "cr_returned_date_sk) FROM (SELECT catalog_returns.*, row_number() "
                             "OVER (ORDER BY cr_order_number, cr_item_sk) AS k FROM "
                             "catalog_returns, date_dim WHERE cr_returned_date_sk = d_date_sk "
                             "AND d_year = 1998 AND "
                             "d_moy = 11 ORDER BY cr_order_number, cr_item_sk LIMIT 12) AS r, "
                             "(SELECT cs_order_number, cs_item_sk, cs_call_center_sk, row_number() "
                             "OVER (ORDER BY cs_order_number, cs_item_sk) AS k FROM catalog_sales, "
                             "date_dim WHERE cs_sold_date_sk = d_date_sk AND d_year = 1998 AND "
                             "d_moy = 10 AND cs_call_center_sk IS NOT NULL AND NOT EXISTS "
                             "(SELECT 1 FROM catalog_returns WHERE cr_order_number = "
                             "cs_order_number AND "
                             "cr_item_sk = cs_item_sk) ORDER BY cs_order_number, cs_item_sk "
                             "LIMIT 12) AS s WHERE r.k = s.k")],
})
"""Rows giving q83, q85 and q91 an answer at SF0.1: twelve items returned in all three
channels in q83's weeks (two web returns each, in two of the weeks, added of earlier web
sales of items returned in store and through the catalog then); eight returned web
sales of 2000 priced in q85's band for single, college-educated customers, copied as
new orders returned by such customers (one demographics row each) and refunded to an
address in a listed state, at a profit all its bands admit; four new customers of q91's
demographics (two of each marital status), buying potential and time zone, each
returning in November 1998 three catalog items sold in October (amounts of other
returns of that month)."""


def _numbered_store_sales(joined: str, where: str, n: int) -> str:
    """The first ``n`` store sales (by ticket and item) passing a query's filters, k: 1..n.

    A subquery of the sales joined with ``joined`` (joined in ``where``) that meet
    ``where``.  Seeds copying different sales keep their dates, prices and customers
    apart: the seeded answer has several rows or sums of several values, which change
    batches move.
    """
    return ("(SELECT store_sales.*, row_number() OVER (ORDER BY ss_ticket_number, ss_item_sk) "
            f"AS k FROM store_sales, {joined} WHERE {where} ORDER BY ss_ticket_number, "
            f"ss_item_sk LIMIT {n})")


def _sold_as_new_items(joined: str, where: str, n: int = 40, items: int = 6
                       ) -> tuple[str, str]:
    """Copies of :func:`_numbered_store_sales`, of the ``items`` items added last in turn."""
    return ("store_sales", "SELECT s.* EXCLUDE (k) REPLACE ((SELECT max(i_item_sk) FROM item) - "
                           f"s.k % {items} AS ss_item_sk) FROM "
                           f"{_numbered_store_sales(joined, where, n)} AS s")


_Q13_BRANCHES = ("(VALUES (0, 'M', 'Advanced Degree', 3, 100), (1, 'S', 'College', 1, 50), "
                 "(2, 'W', '2 yr Degree', 1, 150)) AS b(i, marital, education, deps, low)")
"""q13's demographic branches: marital and education status, dependants, lowest price."""
_Q13_ADDRESSES = ("(SELECT ca_address_sk, row_number() OVER (ORDER BY ca_address_sk) % 10 AS j "
                  "FROM customer_address WHERE ca_country = 'United States' AND ca_state IN "
                  "('TX', 'OH', 'OR', 'NM', 'KY', 'VA', 'MS') ORDER BY ca_address_sk LIMIT 10) "
                  "AS a")
"""Ten addresses in q13's states (j: 0..9)."""
_Q13_YEAR = "ss_sold_date_sk = d_date_sk AND d_year = 2001 AND ss_store_sk IS NOT NULL"


def _q31_sales(table: str, p: str, addr: str, amount: str) -> tuple[str, str]:
    """24 sales of 2000 at the two addresses added last: eight a quarter, in Q1-Q3.

    One a week from each quarter's first Monday (``k // 8``: the quarter, 0..2), each
    of ``amount``: several dates a quarter, so a date updated into another quarter
    leaves the quarter its sales.
    """
    day = ("(SELECT d_date_sk FROM date_dim WHERE d_date = [DATE '2000-01-03', DATE "
           "'2000-04-03', DATE '2000-07-03'][k // 8 + 1] + CAST(7 * (k % 8) AS INTEGER))")
    return (table, f"SELECT s.* REPLACE ({_ADDR} - k % 2 AS {addr}, {day} AS {p}_sold_date_sk, "
                   f"CAST({amount} AS DECIMAL(7, 2)) AS {p}_ext_sales_price) FROM (SELECT * "
                   f"FROM {table} LIMIT 1) AS s, range(24) AS r(k)")


SEED_SQL.update({
    6: [_new_items("6", "CAST(999.99 AS DECIMAL(7, 2)) AS i_current_price"),
        _new_row("customer_address", "ca_address_sk", "'SD' AS ca_state"),
        _customers_at_new_addresses(),
        _sales_of("store_sales", "ss", "customer_sk", _NEW_CUSTOMER, "2001-01-10",
                  ", (SELECT max(i_item_sk) FROM item) - k % 6 AS ss_item_sk", 30)],
    3: [_new_items("3", "128 AS i_manufact_id"),
        _sold_as_new_items("date_dim", "ss_sold_date_sk = d_date_sk AND d_moy = 11")],
    19: [_new_items("19", "8 AS i_manager_id"),
         _sold_as_new_items("date_dim, customer, customer_address, store",
                            "ss_sold_date_sk = d_date_sk AND d_year = 1998 AND d_moy = 11 AND "
                            "ss_customer_sk = c_customer_sk AND c_current_addr_sk = "
                            "ca_address_sk AND ss_store_sk = s_store_sk AND "
                            "substring(ca_zip, 1, 5) <> substring(s_zip, 1, 5)")],
    13: [("store_sales", "SELECT s.* EXCLUDE (k) REPLACE ((SELECT min(cd_demo_sk) FROM "
                         "customer_demographics WHERE cd_marital_status = b.marital AND "
                         "cd_education_status = b.education) AS ss_cdemo_sk, (SELECT "
                         "min(hd_demo_sk) FROM household_demographics WHERE hd_dep_count = "
                         "b.deps) AS ss_hdemo_sk, a.ca_address_sk AS ss_addr_sk, CAST(b.low + "
                         "s.k AS DECIMAL(7, 2)) AS ss_sales_price, CAST(150 + s.k AS "
                         "DECIMAL(7, 2)) AS ss_net_profit) FROM "
                         f"{_numbered_store_sales('date_dim', _Q13_YEAR, 30)} AS s, "
                         f"{_Q13_BRANCHES}, {_Q13_ADDRESSES} WHERE b.i = s.k % 3 AND "
                         "a.j = s.k % 10")],
    31: [_new_row("customer_address", "ca_address_sk", "'Seedling County' AS ca_county"),
         _q31_sales("store_sales", "ss", "ss_addr_sk", "1000"),
         _q31_sales("web_sales", "ws", "ws_bill_addr_sk", "[1000, 10000, 99999.99][k // 8 + 1]")],
})
"""Rows giving q3, q6, q13, q19 and q31 an answer at SF0.01 (at SF0.1 they have one;
the seeds add to it).  q6: thirty January 2001 store sales of six items priced far
above their category's average, by two customers living in South Dakota (SF0.01 has
states with ten such sales or none, depending on the rows a change seed holds back).
q3: six items of manufacturer 128 (SF0.01 has none), of six brands,
sold in copies of the first forty November store sales (any year).  q13: copies of
thirty store sales of 2001 made to fit its filters (at SF0.01 none does), ten per
demographic branch, at ten addresses of its states, priced in the branch's band at a
profit every address branch admits.  q19: six items of manager 8 (SF0.01's one sells
nothing in November 1998), sold in copies of forty store sales of that month to
customers living outside the store's zip.  q31: a new county of two addresses (no
SF0.01 county's sales grow faster on the web than in store through 2000's first three
quarters) with eight store sales of 1000 a quarter and eight web sales of 1000, 10000
and 99999.99 (growth 10 against 1: it outlasts a batch deleting half of them; a clone
taking a later quarter's web price can still end it, and that batch is drawn again).  Six
items, not :func:`_new_row`'s two, for q3 and q19: a batch updates two candidate
items, and two seeded ones given another's manufacturer or manager empty the answer."""


SEEDS: dict[int, Seed] = {44: _seed_q44, 49: _seed_q49, 4: _year_over_year("scw", "c"),
                          11: _year_over_year("sw", "w"), 74: _year_over_year("sw", "w"),
                          38: _same_day_everywhere(customers=8)}
SEEDS.update({n: sql_seed(steps) for n, steps in SEED_SQL.items() if n not in SEEDS})
"""Seeds per query number."""
