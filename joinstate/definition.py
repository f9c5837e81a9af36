"""What a pipeline stores as its definition, and how two definitions differ.

A pipeline's definition is its graph's JSON spec plus the index-sharing choice, kept in
the catalog under the pipeline's name.  Attaching compares the stored one with the given
one: equal definitions re-attach; a different one is refused with its first difference
in words, so the user sees which operator changed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from joinstate.errors import JoinSpecMismatchError
from joinstate.graph import SPEC_VERSION
from joinstate.physical import LAYOUT, check_sharing

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from joinstate.graph import Graph

__all__ = ["check_stored", "definition", "definition_bytes", "definition_diff", "stored_layout"]


def definition(graph: Graph, share_indexes: bool | Mapping[str, bool] = True,
               layout: int = LAYOUT) -> dict[str, Any]:
    """What a pipeline of ``graph`` stores as its definition (JSON-able, store-less).

    Attaching compares it with the stored one: equal definitions re-attach.  ``layout``
    is the index layout (:data:`joinstate.physical.LAYOUTS`) its state is kept in;
    definitions stored before layouts were recorded have none, and mean layout 1.
    """
    spec = {**graph.spec(), "share_indexes": check_sharing(share_indexes)}
    if layout != 1:
        spec["index_layout"] = layout
    return spec


def stored_layout(raw: bytes) -> int:
    """The index layout of a stored definition.

    A definition that does not parse gets :data:`LAYOUT`: :func:`check_stored` names
    the fault.
    """
    try:
        stored = json.loads(raw)
    except ValueError:
        return LAYOUT
    layout = stored.get("index_layout", 1) if isinstance(stored, dict) else LAYOUT
    return layout if isinstance(layout, int) else LAYOUT


def definition_bytes(spec: Mapping[str, Any]) -> bytes:
    """A :func:`definition` as the catalog stores it (sorted keys)."""
    return json.dumps(spec, sort_keys=True).encode()


def definition_diff(stored: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The first difference of two stored definitions, field by field, in words.

    For the message refusing to attach a graph under a name the store holds with
    another definition (``operator 3 (filter): expr [...] -> [...]``).
    """

    def text(key: str, v: Any) -> str:
        if key == "aggs" and isinstance(v, list):  # [name, function, argument or None]
            return ", ".join(f"{a[0]}={a[1]}({'*' if a[2] is None else a[2]})" for a in v)
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    diffs = []
    if stored.get("index_layout", 1) != new.get("index_layout", 1):
        diffs.append(f"index layout {stored.get('index_layout', 1)} -> "
                     f"{new.get('index_layout', 1)}")
    if stored.get("share_indexes") != new.get("share_indexes"):
        diffs.append(f"share_indexes {stored.get('share_indexes')} -> {new.get('share_indexes')}")
    a, b = stored.get("nodes", []), new.get("nodes", [])
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            if x.get("kind") != y.get("kind"):
                diffs.append(f"operator {i} was {x.get('kind')}, now {y.get('kind')}")
            else:
                fields = "; ".join(f"{k} [{text(k, x.get(k))}] -> [{text(k, y.get(k))}]"
                                   for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k))
                diffs.append(f"operator {i} ({x.get('kind')}): {fields}")
            break
    if len(a) != len(b):
        diffs.append(f"{len(a)} operators before, {len(b)} now")
    names = sorted(stored.get("outputs") or {}), sorted(new.get("outputs") or {})
    if names[0] != names[1]:
        diffs.append(f"outputs [{text('', names[0])}] -> [{text('', names[1])}]")
    elif stored.get("materialized") != new.get("materialized"):
        diffs.append("a materialized output's order or limit")
    return "; ".join(diffs) or "definition differs"


def check_stored(owner: str, path: Path, raw: bytes | None, spec: Mapping[str, Any], *,
                 read_only: bool) -> None:
    """Whether ``spec`` may attach where the catalog holds ``raw`` (None: nothing yet).

    Raises :class:`~joinstate.errors.JoinSpecMismatchError` when there is nothing to
    attach to in a read-only store, when the stored definition is of an older version
    (whose state lacks what this one keeps), or when it differs (naming the first
    difference).  ``owner`` starts the message (``"pipeline 'q4'"``).
    """
    if raw is None:
        if read_only:
            raise JoinSpecMismatchError(f"{owner} does not exist in {path} (opened read-only)")
        return
    stored = json.loads(raw)
    if stored.get("version") != SPEC_VERSION:
        raise JoinSpecMismatchError(
            f"{owner} in {path} was created by an older joinstate (definition version "
            f"{stored.get('version')}, this one reads {SPEC_VERSION}): its sources keep no "
            "record of their rows and its global aggregates lack their first row; drop the "
            "pipeline's state and populate it again")
    if stored != spec:
        raise JoinSpecMismatchError(
            f"{owner} already exists in {path} with a different definition "
            f"({definition_diff(stored, spec)}); use a new pipeline name or drop the old "
            "state")
