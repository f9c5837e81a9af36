"""Row layouts of an index: how rows are keyed, staged, probed and decoded in RocksDB.

Three layouts, chosen by what is known about uniqueness (:attr:`joinstate.Side.layout`):

``key``     the join key is unique on the side: RocksDB key = prefix + canon,
            value = row.  Probed by multi-get (:mod:`joinstate.layouts.unique`).
``unique``  the side has a unique row key: key = prefix + canon + canon(unique key),
            value = row.  Probed by prefix iteration (:mod:`joinstate.layouts.unique`).
``bag``     nothing is unique: key = prefix + canon + xxh3_128(row) + seq,
            value = count + row (:mod:`joinstate.layouts.bag`).

``prefix`` is the 8-byte big-endian xxh3 of the canonical join key ``canon``.  The unique
layouts read before writing, to enforce the declared key; the bag layout appends blindly
and decides retractions from an in-memory entry map.  What they share is
:class:`~joinstate.layouts.base.RowLayout`.
"""

from __future__ import annotations

from joinstate.layouts.bag import BagLayout
from joinstate.layouts.base import RowLayout, describe_key
from joinstate.layouts.unique import KeyLayout, UniqueLayout

__all__ = ["LAYOUTS", "BagLayout", "KeyLayout", "RowLayout", "UniqueLayout", "describe_key"]

LAYOUTS: dict[str, type[RowLayout]] = {"key": KeyLayout, "unique": UniqueLayout, "bag": BagLayout}
