"""A prepared batch: a change set conformed, encoded and consolidated, not yet applied.

:meth:`joinstate.Join.prepare` returns one; :meth:`joinstate.Join.apply` applies it.
Drivers read only the documented properties (``side``, ``rows``, ``inserted``,
``retracted``); the arrays behind them belong to the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import xxhash

if TYPE_CHECKING:
    import pyarrow as pa

    from joinstate._bytes import Bytes
    from joinstate.side import SideName
    from joinstate.zset import Groups

__all__ = ["PreparedBatch"]


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A consolidated delta of one side, with everything derived from it once.

    Consolidated: equal rows are merged and their weights summed, zero weights dropped,
    so ``+1``/``-1`` of one row in one batch cancel before touching state.
    """

    side: SideName
    table: pa.Table
    w: np.ndarray
    enc: Bytes
    rh: Bytes
    canon: Bytes
    khash: np.ndarray
    null: np.ndarray
    keys: Groups  # groups of non-NULL-key rows by join key (inv = -1 for NULL keys)

    @property
    def rows(self) -> int:
        """Distinct rows after consolidation."""
        return len(self.w)

    @property
    def inserted(self) -> int:
        """Rows inserted, with multiplicity (sum of the positive weights)."""
        return _exact_sum(self.w[self.w > 0])

    @property
    def retracted(self) -> int:
        """Rows deleted, with multiplicity (minus the sum of the negative weights)."""
        return -_exact_sum(self.w[self.w < 0])

    def digest(self) -> bytes:
        """16 bytes identifying (side, consolidated change set), independent of row order.

        Recorded with a commit id, so a replay of the id with other data is caught.
        """
        h = xxhash.xxh3_128()
        h.update(self.side.encode() + b"\x00")
        if len(self.w):
            words = np.ascontiguousarray(self.rh.matrix()).view("<u8")
            order = np.lexsort((words[:, 1], words[:, 0]))
            h.update(np.ascontiguousarray(self.rh.matrix()[order]).tobytes())
            h.update(self.w[order].astype("<i8").tobytes())
        return h.digest()


def _exact_sum(a: np.ndarray) -> int:
    if float(np.abs(a.astype(np.float64)).sum()) < 2.0**62:
        return int(a.sum())
    return sum(a.tolist())
