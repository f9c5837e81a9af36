"""A progress display on a terminal, silence elsewhere.

rich draws it, on stderr, only when stderr is a terminal: logs, CI and Spark executors
never get control characters.  The library draws nothing else and never configures
logging; a caller that wants no display passes ``progress=False``.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Progress"]


class Progress:
    """Counts rows per side; draws one rich progress bar if asked and stderr is a terminal.

    ``bar`` is the live rich display, or None when nothing is drawn.
    """

    def __init__(self, enabled: bool, total: int | None, desc: str) -> None:
        self.bar: Any = None
        self._task: Any = None
        if not enabled or not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        console = Console(file=sys.stderr)
        if not console.is_terminal:
            return
        self.bar = Bar(
            TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
            TextColumn("{task.completed:,.0f} rows"), TextColumn("{task.fields[side]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, transient=True,
        )
        self._task = self.bar.add_task(desc, total=total, side="")
        self.bar.start()

    def update(self, side: str, rows: int) -> None:
        """Advance by ``rows`` rows of ``side``."""
        if self.bar is not None:
            self.bar.update(self._task, advance=rows, side=side)

    def close(self) -> None:
        """Remove the display."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
