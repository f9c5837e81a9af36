"""A progress bar on a terminal, silence elsewhere; works without tqdm installed.

tqdm is an optional dependency (the ``bench`` extra): the library must not need it, and
must never draw on a non-terminal stderr (logs, CI, Spark executors).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Progress"]


class Progress:
    """Counts rows per side; draws a tqdm bar only if asked, tqdm exists and stderr is a tty."""

    def __init__(self, enabled: bool, total: int | None, desc: str) -> None:
        self.bar: Any = None
        if not enabled or not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, desc=desc, unit="rows", unit_scale=True, leave=False)

    def update(self, side: str, rows: int) -> None:
        """Advance by ``rows`` rows of ``side``."""
        if self.bar is not None:
            self.bar.set_postfix_str(side, refresh=False)
            self.bar.update(rows)

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
