"""``python -m population``: the population driver's command (:mod:`population.cli`).

The same command is ``joinstate bench populate``; ``--help`` lists its options.
"""

from __future__ import annotations

from population.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
