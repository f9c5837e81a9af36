"""The catalog's one comparison: what differs between a stored spec and a given one.

Joins (and Spark manifests) store their spec as JSON and refuse to re-attach with a
different one; both describe the difference the same way, field by field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["spec_diff"]


def spec_diff(stored: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two JSON-able specs.

    Nested mappings are compared one level deep (``left.key: stored [...], given [...]``);
    the binary ``schema`` entries are skipped (their readable ``columns`` say the same).
    A difference only in skipped entries is reported as schema metadata.
    """
    diffs: list[str] = []
    for k in sorted(set(stored) | set(given)):
        a, b = stored.get(k), given.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            inner = [
                f"{k}.{kk}: stored {a.get(kk)!r}, given {b.get(kk)!r}"
                for kk in sorted(set(a) | set(b))
                if kk != "schema" and a.get(kk) != b.get(kk)
            ]
            diffs += inner or [f"{k}: schema metadata differs"]
        else:
            diffs.append(f"{k}: stored {a!r}, given {b!r}")
    return diffs
