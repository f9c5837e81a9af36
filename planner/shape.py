"""Plan contexts from what there is to plan: statistics alone, or something maintained.

The planner never holds the core's objects: it reads their public views (through the
:class:`~joinstate.maintained.Maintained` protocol: inputs, unique keys, the indexes a
push to each input writes and probes, as :class:`~joinstate.IndexInfo`; and the
definition a pipeline records in the store's catalog) and turns them into the plain
shapes of :mod:`planner.context`.  :func:`context_of` is the one entry: a join and a
pipeline are planned as two kinds of context (a join's has a small and a big side, a
pipeline's a load order over its sources and a compaction schedule per index), built
by the builder :data:`BUILDERS` holds for the target's ``kind``.

A pipeline's operator graph is read from its catalog entry (the JSON definition the
pipeline writes under :func:`joinstate.names.pipeline_spec_key` when it is compiled):
which operator reads which stream on which key, through which filters and column
picks.  The index each reader would share is checked against the pipeline's own
indexes (their column families are named after the stream and key they index); if the
two disagree (a definition format this module does not know), the graph-derived parts
(joins, readers, sharing) are left out of the plan rather than guessed.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

from joinstate.names import index_cf, pipeline_spec_key, source_of_join_side
from planner.context import (
    IndexShape,
    JoinShape,
    PlanContext,
    PlannerSettings,
    ReaderShape,
    ShareGroup,
    StreamShape,
)
from planner.errors import PlannerError
from planner.history import History

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from joinstate import Join, Pipeline, SideName
    from joinstate.maintained import Maintained
    from planner.stats import SourceStats

SIDES: tuple[SideName, SideName] = ("left", "right")

__all__ = ["BUILDERS", "GIVEN_KEYS", "context_of", "join_context", "tracks_degree"]

log = logging.getLogger(__name__)

GIVEN_KEYS = ("strategy", "small_side", "order", "compaction", "memtables", "probe",
              "shards")
"""Choices a caller may fix (``None`` leaves a choice to the rules)."""

_DEGREE_SIDES = {
    "inner": (), "left": ("right",), "right": ("left",), "full": ("left", "right"),
    "left_semi": ("right",), "left_anti": ("right",),
}
"""Sides whose index keeps per-key degrees (the other side's outer rows need them)."""


def tracks_degree(how: str, side: str) -> bool:
    """Whether ``side``'s index of a ``how`` join keeps degrees (then no bulk writes).

    >>> tracks_degree("left", "right"), tracks_degree("inner", "left")
    (True, False)
    """
    return side in _DEGREE_SIDES.get(how, ())


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    bad = [k for k in values if k not in GIVEN_KEYS]
    if bad:
        raise PlannerError(f"unknown fixed choice(s) {bad}; the planner takes {GIVEN_KEYS}")
    return {k: v for k, v in values.items() if v is not None}


def _layout(unique_key: Sequence[str] | None, key: Sequence[str]) -> Any:
    if unique_key is None:
        return "bag"
    return "key" if set(unique_key) <= set(key) else "unique"


def join_context(
    left: SourceStats, right: SourceStats, *, name: str = "join", how: str = "inner",
    left_key: Sequence[str] | None = None, right_key: Sequence[str] | None = None,
    bulk_loadable: Mapping[str, bool] | None = None, history: History | None = None,
    settings: PlannerSettings | None = None, **given: Any,
) -> PlanContext:
    """The context of a join known only by its inputs' statistics.

    Keys default to the first key the statistics describe; index names are the column
    families the join would have.  ``bulk_loadable`` defaults to "no degree family"
    (:func:`tracks_degree`).  ``given`` fixes choices (:data:`GIVEN_KEYS`).
    """
    stats = {"left": left, "right": right}
    keys = {
        "left": tuple(left_key) if left_key is not None else (
            left.keys[0].columns if left.keys else ()),
        "right": tuple(right_key) if right_key is not None else (
            right.keys[0].columns if right.keys else ()),
    }
    indexes = []
    for side in ("left", "right"):
        s = stats[side]
        cf = index_cf(source_of_join_side(name, side), keys[side])
        degree = tracks_degree(how, side)
        loadable = (bulk_loadable or {}).get(side, not degree)
        other = "right" if side == "left" else "left"
        indexes.append(IndexShape(
            cf, side, keys[side], _layout(s.unique_key, keys[side]), s.unique_key,
            written_by=(side,), read_by=(other,), bulk_loadable=loadable,
            tracks_degree=degree, label=f"{side} side by {list(keys[side])}"))
    j = JoinShape(name, "left", "right", keys["left"], keys["right"], how, indexes[0].name,
                  indexes[1].name)
    return PlanContext("join", name, stats, (j,), tuple(indexes),
                       history=history or History(name),
                       settings=settings or PlannerSettings(), given=_given(given))


def _store_settings(target: Maintained, settings: PlannerSettings | None,
                    given: dict[str, Any]) -> PlannerSettings:
    """The store's probe-cache limit and memtable size; its probe mode, if fixed, as given."""
    settings = settings or PlannerSettings()
    store = target.store
    if store is not None:
        settings = settings.replace(probe_cache_max_rows=store.options.probe_cache_max_rows,
                                    memtable_bytes=store.options.write_buffer_size)
        if store.options.probe != "auto":
            given.setdefault("probe", store.options.probe)
    return settings


def _join_context(join: Join, stats: Mapping[str, SourceStats], *,
                  history: History | None = None, settings: PlannerSettings | None = None,
                  **given: Any) -> PlanContext:
    """The context of a :class:`joinstate.Join` with both sides' statistics.

    Index names, layouts and bulk-loadability come from the join's own indexes; the
    store's probe mode (if not ``auto``) and probe-cache limit are taken as given.
    """
    missing = [s for s in SIDES if s not in stats]
    unknown = [s for s in stats if s not in SIDES]
    if missing or unknown:
        raise PlannerError(f"join {join.name!r} is planned with statistics of both sides "
                           f"('left', 'right'); got {sorted(stats)}")
    settings = _store_settings(join, settings, given)
    stats = dict(stats)
    indexes = []
    keys = {}
    for side in SIDES:
        info = join.written_indexes(side)[0]
        keys[side] = join.input_keys(side)[0]
        uk = join.input_unique_key(side)
        if stats[side].unique_key is None and uk is not None:
            stats[side] = stats[side].replace(unique_key=uk)
        other = "right" if side == "left" else "left"
        indexes.append(IndexShape(
            info.column_family, side, keys[side], info.layout, uk,
            tuple(join.input_schema(side).names), (side,), (other,), (), info.bulk_loadable,
            info.tracks_degree, info.rows, f"{side} side by {list(keys[side])}"))
    j = JoinShape(join.name, "left", "right", keys["left"], keys["right"], join.how,
                  indexes[0].name, indexes[1].name)
    return PlanContext("join", join.name, stats, (j,), tuple(indexes),
                       history=history or History(join.name), settings=settings,
                       given=_given(given))


# ---- pipelines ----------------------------------------------------------------------------


def _graph(p: Pipeline) -> dict[int, dict[str, Any]] | None:
    """The pipeline's operator nodes by id, from its catalog entry (None if unreadable)."""
    store = p.store
    if store is None:
        return None
    raw = store.meta_get(pipeline_spec_key(p.name))
    if raw is None:
        return None
    try:
        spec = json.loads(raw)
        nodes = list(spec["nodes"])
        # The entry lists the nodes the outputs depend on, in id order, without their
        # ids; every one of them is an output or an input of another listed node, so
        # the referenced ids, sorted, are theirs.
        ids: set[int] = set(int(i) for i in spec["outputs"].values())
        ids |= {int(m["node"]) for m in dict(spec.get("materialized") or {}).values()}
        for n in nodes:
            ids |= {int(i) for i in n["inputs"]}
        if len(ids) != len(nodes):
            return None
        return dict(zip(sorted(ids), nodes, strict=True))
    except (ValueError, KeyError, TypeError):
        return None


def _label(nid: int, node: Mapping[str, Any]) -> str:
    return str(node["name"]) if node["kind"] == "source" else f"{node['kind']}{nid}"


def _columns(node: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names, types = [], []
    for c in node["columns"]:
        name, _, typ = str(c).partition(": ")
        names.append(name)
        types.append(typ.removesuffix(" not null"))
    return tuple(names), tuple(types)


def _references(expr: str, columns: Sequence[str]) -> set[str]:
    """Columns an expression's text mentions (a filter's, as the definition prints it)."""
    return {c for c in columns
            if re.search(rf'(?<![\w"]){re.escape(c)}(?![\w"])', expr)}


def _picks(node: Mapping[str, Any], inp: Mapping[str, Any]) -> dict[str, str] | None:
    """Output column -> input column if a projection only picks columns, else None."""
    out_names, _ = _columns(node)
    in_names, _ = _columns(inp)
    exprs = [str(e) for e in node.get("exprs", [])]
    if len(exprs) != len(out_names) or any(e not in in_names for e in exprs):
        return None
    return dict(zip(out_names, exprs, strict=True))


def _stream_rows(graph: Mapping[int, Mapping[str, Any]], stats: Mapping[str, SourceStats],
                 history: History) -> tuple[dict[str, int | None], dict[str, str]]:
    """Rows of every stream: sources' counts, recorded operator rows, then estimates."""
    rows: dict[str, int | None] = {}
    origin: dict[str, str] = {}
    for nid in sorted(graph):
        node = graph[nid]
        label = _label(nid, node)
        kind = node["kind"]
        ins = [_label(i, graph[i]) for i in node["inputs"]]
        if kind == "source":
            s = stats.get(label)
            rows[label], origin[label] = (s.rows, "statistics") if s is not None else (
                0, "not loaded: stays empty")
        elif label in history.operators:
            rows[label], origin[label] = history.operators[label], "recorded"
        elif kind == "project":
            rows[label], origin[label] = rows[ins[0]], "its input"
        elif kind == "union":
            parts = [rows[i] for i in ins]
            rows[label] = None if any(x is None for x in parts) else sum(x or 0 for x in parts)
            origin[label] = "sum of its inputs"
        elif kind == "join" and node.get("how") == "inner":
            # A foreign-key join (the other input unique on its key) keeps one row per
            # row of the referencing input.
            left, right = (graph[i] for i in node["inputs"])
            if _unique_on(right, node["right_key"]):
                rows[label], origin[label] = rows[ins[0]], f"rows of {ins[0]} (FK join)"
            elif _unique_on(left, node["left_key"]):
                rows[label], origin[label] = rows[ins[1]], f"rows of {ins[1]} (FK join)"
            else:
                rows[label], origin[label] = None, "unknown"
        else:
            rows[label], origin[label] = None, "unknown"
    return rows, origin


def _unique_on(node: Mapping[str, Any], key: Sequence[str]) -> bool:
    uk = node.get("unique_key") if node["kind"] == "source" else (
        node.get("keys") if node["kind"] == "agg" else None)
    return uk is not None and set(uk) <= set(key)


def _shares(setting: bool | Mapping[str, bool], stream: str) -> bool:
    """Whether the readers of ``stream`` share its indexes under ``share_indexes``."""
    return setting if isinstance(setting, bool) else setting.get(stream, True)


def _pipeline_context(p: Pipeline, stats: Mapping[str, SourceStats], *,
                      history: History | None = None, settings: PlannerSettings | None = None,
                      **given: Any) -> PlanContext:
    """The context of a :class:`joinstate.Pipeline` whose ``stats`` sources are loaded.

    Compiles the pipeline (its indexes exist from then on).  Sources absent from
    ``stats`` are not loaded (they stay empty).
    """
    unknown = [s for s in stats if s not in p.sources]
    if unknown:
        raise PlannerError(f"pipeline {p.name!r} has no source(s) {unknown} (sources: "
                           f"{list(p.sources)})")
    p.compile()
    stats = {s: st if st.unique_key is not None or p.source_unique_key(s) is None
             else st.replace(unique_key=tuple(p.source_unique_key(s) or ()))
             for s, st in stats.items()}
    history = history or History(p.name)
    settings = _store_settings(p, settings, given)
    infos = {ix.column_family: ix for ix in p.indexes()}
    written: dict[str, list[str]] = {cf: [] for cf in infos}
    read: dict[str, list[str]] = {cf: [] for cf in infos}
    for s in p.sources:
        for ix in p.written_indexes(s):
            written.setdefault(ix.column_family, []).append(s)
        for ix in p.probed_indexes(s):
            read.setdefault(ix.column_family, []).append(s)

    graph = _graph(p)
    streams: dict[str, StreamShape] = {}
    joins: list[JoinShape] = []
    groups: dict[tuple[str, tuple[str, ...]], list[ReaderShape]] = {}
    index_of: dict[str, tuple[str, tuple[str, ...]]] = {}  # cf -> (stream, key)
    index_cols: dict[str, set[str]] = {}
    group_cfs: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    cf_readers: dict[str, list[ReaderShape]] = {}
    stream_rows: dict[str, int | None] = {}
    rows_from: dict[str, str] = {}
    if graph is not None:
        for nid, node in graph.items():
            names, types = _columns(node)
            params = {k: v for k, v in node.items() if k not in ("columns", "inputs", "kind")}
            streams[_label(nid, node)] = StreamShape(
                _label(nid, node), node["kind"],
                tuple(_label(i, graph[i]) for i in node["inputs"]), names, types, params)
        stream_rows, rows_from = _stream_rows(graph, stats, history)
        cf_of: dict[tuple[int, int], str] = {}
        for nid, node in graph.items():
            if node["kind"] not in ("join", "joinall"):
                continue
            label = _label(nid, node)
            if node["kind"] == "join":
                keys = [tuple(node["left_key"]), tuple(node["right_key"])]
                strip = node.get("how") == "inner"
            else:
                keys = [(k,) for k in node["keys"]]
                strip = True
            for pos, inp in enumerate(node["inputs"]):
                reader = f"{label}[{pos}]"
                top = _label(inp, graph[inp])
                base = inp
                key: tuple[str, ...] = tuple(keys[pos])
                cols = set(_columns(graph[inp])[0])
                fcols: set[str] = set()
                filtered = False
                while strip:
                    b = graph[base]
                    if b["kind"] == "filter":
                        filtered = True
                        fcols |= _references(str(b["expr"]), _columns(b)[0])
                    elif b["kind"] == "project" and (m := _picks(b, graph[b["inputs"][0]])):
                        key = tuple(m[k] for k in key)
                        cols = {m[c] for c in cols if c in m}
                        fcols = {m[c] for c in fcols if c in m}
                    else:
                        break
                    base = b["inputs"][0]
                blabel = _label(base, graph[base])
                gkey = (blabel, key)
                r = ReaderShape(reader, top, tuple(sorted(cols | set(key))), filtered,
                                tuple(sorted(fcols)))
                groups.setdefault(gkey, []).append(r)
                shared = _shares(p.share_indexes, blabel)
                if shared:
                    cf = index_cf(f"{p.name}~{blabel}", key)
                else:
                    cf = index_cf(f"{p.name}~{top}~{label}-{pos}", keys[pos])
                cf_of[(nid, pos)] = cf
                if cf not in group_cfs.setdefault(gkey, []):
                    group_cfs[gkey].append(cf)
                index_of[cf] = gkey if shared else (top, tuple(keys[pos]))
                cf_readers.setdefault(cf, []).append(r)
                index_cols.setdefault(cf, set()).update(r.columns, r.filter_columns)
            if node["kind"] == "join":
                ins = [_label(i, graph[i]) for i in node["inputs"]]
                joins.append(JoinShape(label, ins[0], ins[1], keys[0], keys[1],
                                       str(node.get("how", "inner")), cf_of[(nid, 0)],
                                       cf_of[(nid, 1)]))
        if set(index_of) != set(infos):
            log.warning("pipeline %s: its definition does not name the indexes it has (%s vs "
                        "%s); planning without its operator graph", p.name,
                        sorted(index_of), sorted(infos))
            streams, joins, groups, index_of, index_cols = {}, [], {}, {}, {}
            group_cfs, cf_readers = {}, {}
            stream_rows, rows_from = {}, {}
    indexes = []
    for cf, info in infos.items():
        stream, key = index_of.get(cf, ("", ()))
        src = stream if stream in p.sources else None
        uk = p.source_unique_key(src) if src is not None else None
        readers = tuple(cf_readers.get(cf, ()))
        indexes.append(IndexShape(
            cf, stream, key, info.layout, uk, tuple(sorted(index_cols.get(cf, ()))),
            tuple(written.get(cf, ())), tuple(read.get(cf, ())), readers,
            info.bulk_loadable, info.tracks_degree, info.rows,
            f"{stream} by {list(key)}" if stream else cf))
    share_groups = tuple(
        ShareGroup(stream, key, tuple(rs),
                   tuple(sorted({c for r in rs for c in (*r.columns, *r.filter_columns)})),
                   tuple(group_cfs.get((stream, key), ())))
        for (stream, key), rs in groups.items())
    return PlanContext(
        "pipeline", p.name, dict(stats), tuple(joins), tuple(indexes), share_groups,
        p.share_indexes, streams, stream_rows, rows_from, history, settings, _given(given))


BUILDERS: dict[str, Callable[..., PlanContext]] = {
    "join": _join_context,
    "pipeline": _pipeline_context,
}
"""The context builder of each kind of maintained target (its ``kind``)."""


def context_of(target: Maintained, stats: Mapping[str, SourceStats], *,
               history: History | None = None, settings: PlannerSettings | None = None,
               **given: Any) -> PlanContext:
    """The plan context of ``target`` whose inputs ``stats`` describe (by input name).

    ``given`` fixes choices (:data:`GIVEN_KEYS`).  A pipeline is compiled first (its
    indexes exist from then on); inputs absent from its ``stats`` are not loaded.
    """
    build = BUILDERS.get(target.kind)
    if build is None:
        raise PlannerError(f"{target.name!r}: no plan context for targets of kind "
                           f"{target.kind!r} (kinds: {sorted(BUILDERS)})")
    return build(target, stats, history=history, settings=settings, **given)
