"""How Spark spreads the state: the shard count, and inputs copied to every shard.

**Shards.**  One shard is one RocksDB directory written by one task; rocksdict holds
the GIL while writing, so parallelism comes from one shard per executor core.  The
count is the cores, or more (a multiple of the cores, so that every wave is full) when
the data would make a shard bigger than ``shard_max_bytes``.  A count fixed by the
caller (an existing state directory has one) is recorded as given.

**Replication.**  An input copied to every shard lets the other input of its join stay
where it is instead of being shuffled by key.  That pays when the copy is small (at
most ``replicate_max_bytes``, Spark's broadcast-join threshold) and the extra writes
(its rows times ``shards - 1``) are fewer than the rows of the input that no longer
moves.  Only an input whose every join is inner-like on its side may be copied: an
outer join emits the unmatched rows of its preserved side, and a copy in every shard
would emit them once per shard; and of the two inputs of one join at most one is
copied (two copies would compute the whole join in every shard).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from planner.rule import Decision
from planner.rules._text import rows

if TYPE_CHECKING:
    from planner.context import PlanContext

__all__ = ["PRESERVED", "SparkDistribution"]

PRESERVED = {
    "inner": (),
    "left": ("left",),
    "right": ("right",),
    "full": ("left", "right"),
    "left_semi": ("left",),
    "left_anti": ("left",),
}
"""The sides whose rows a join emits even without a match: they must not be copied."""


class SparkDistribution:
    """Decide the shard count (subject: the root) and, per source, replicate or shuffle.

    >>> from planner.plan import plan_join
    >>> from planner.stats import given
    >>> from planner.context import PlannerSettings
    >>> p = plan_join(given("left", 1_000, bytes=64_000), given("right", 3_000_000),
    ...               settings=PlannerSettings(cores=4))
    >>> p.get("shards"), p.get("replicate", "left"), p.get("replicate", "right")
    (4, 'replicate', 'shuffle')
    """

    name = "spark"

    def apply(self, context: PlanContext) -> list[Decision]:
        """The shard count, then one decision per source."""
        s = context.settings
        fixed = context.given.get("shards", s.shards)
        total_bytes = 0
        unknown = []
        for name, src in context.sources.items():
            if src.bytes is None:
                unknown.append(name)
            else:
                total_bytes += src.bytes
        figures: dict[str, Any] = {"cores": s.cores, "bytes": total_bytes,
                                   "unknown_bytes": unknown,
                                   "shard_max_bytes": s.shard_max_bytes}
        if fixed is not None:
            shards = int(fixed)
            out = [Decision("shards", context.name, shards, f"{shards} shards fixed by the "
                            "caller (the state directory's)", figures, self.name)]
        else:
            waves = max(1, math.ceil(total_bytes / s.shard_max_bytes / s.cores))
            shards = s.cores * waves
            why = (f"{total_bytes / (1 << 20):,.0f} MiB of input in shards of at most "
                   f"{s.shard_max_bytes >> 20:,} MiB" if waves > 1 else
                   f"one shard per core ({s.cores}); {total_bytes / (1 << 20):,.1f} MiB of "
                   "input" + (f" (sizes of {', '.join(unknown)} unknown)" if unknown else ""))
            out = [Decision("shards", context.name, shards, why, figures, self.name)]
        out += self._replicate(context, shards)
        return out

    def _replicate(self, context: PlanContext, shards: int) -> list[Decision]:
        s = context.settings
        # Per source: the joins reading it directly, as (join, its side, other stream).
        uses: dict[str, list[tuple[str, str, str]]] = {n: [] for n in context.sources}
        for j in context.joins:
            for side in ("left", "right"):
                stream = j.stream(side)
                if stream in uses:
                    other = j.stream("right" if side == "left" else "left")
                    uses[stream].append((j.how, side, other))
        chosen: set[str] = set()
        out = []
        ranked = sorted(context.sources, key=lambda n: (context.sources[n].bytes is None,
                                                         context.sources[n].bytes or 0))
        for name in ranked:
            src = context.sources[name]
            figures: dict[str, Any] = {"rows": src.rows, "bytes": src.bytes, "shards": shards,
                                       "max_bytes": s.replicate_max_bytes}
            joins = uses[name]
            blocked = [f"{how} join keeps its {side} side's unmatched rows"
                       for how, side, _ in joins if side in PRESERVED.get(how, (side,))]
            partners = [o for _, _, o in joins]
            others = [context.rows(o) for o in partners]
            moved = None if any(o is None for o in others) else sum(o or 0 for o in others)
            extra = None if src.rows is None else src.rows * (shards - 1)
            figures.update(extra_rows=extra, unshuffled_rows=moved)
            if shards == 1:
                choice, why = "shuffle", "one shard: nothing to copy"
            elif not joins:
                choice, why = "shuffle", "read by no join directly"
            elif blocked:
                choice, why = "shuffle", blocked[0]
            elif chosen & set(partners):
                choice, why = "shuffle", "the other input of its join is copied already"
            elif src.bytes is None or src.rows is None:
                choice, why = "shuffle", "size unknown"
            elif src.bytes > s.replicate_max_bytes:
                choice, why = "shuffle", (f"{src.bytes / (1 << 20):,.1f} MiB is more than "
                                          f"{s.replicate_max_bytes / (1 << 20):,.0f} MiB")
            elif moved is None or extra is None or extra >= moved:
                choice, why = "shuffle", (f"copies cost {rows(extra)} extra rows, the shuffle "
                                          f"it saves moves {rows(moved)}")
            else:
                choice, why = "replicate", (f"{src.bytes / (1 << 20):,.2f} MiB copied to "
                                            f"{shards} shards ({rows(extra)} extra rows) "
                                            f"instead of shuffling {rows(moved)} rows")
                chosen.add(name)
            out.append(Decision("replicate", name, choice, why, figures, self.name))
        return out
