"""DOT (Graphviz) text for a plan version: compounds as clusters, leaves coloured by status.

The browser lays it out with the vendored Graphviz WebAssembly build (static/planning/dag.js).
Every label, tooltip and URL is written as a quoted DOT string escaped here, because task
names and descriptions come from users and LLMs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from graphlib import CycleError, TopologicalSorter

from planning.models import NodeStatus, PlanNode

# Fill and border colours per leaf status (fill, border); the legend in the page uses the same.
STATUS_COLOURS: dict[str, tuple[str, str]] = {
    NodeStatus.PENDING: ("#f3f4f6", "#6b7280"),
    NodeStatus.AWAITING_APPROVAL: ("#fef3c7", "#b45309"),
    NodeStatus.READY: ("#dbeafe", "#1d4ed8"),
    NodeStatus.RUNNING: ("#bfdbfe", "#1e40af"),
    NodeStatus.RETRYING: ("#fde68a", "#92400e"),
    NodeStatus.SUCCEEDED: ("#dcfce7", "#15803d"),
    NodeStatus.FAILED: ("#fee2e2", "#b91c1c"),
    NodeStatus.SKIPPED: ("#f5f5f4", "#a8a29e"),
    NodeStatus.CANCELLED: ("#e7e5e4", "#57534e"),
    NodeStatus.BLOCKED: ("#fce7f3", "#9d174d"),
}
_UNKNOWN_COLOURS = ("#ffffff", "#111827")

# C0 controls (but newline and tab) and DEL would make Graphviz choke or render garbage.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
LABEL_WIDTH = 28
LABEL_MAX = 90


def quote(value: str) -> str:
    """Return `value` as a quoted DOT string that Graphviz reads back literally.

    Backslashes are doubled (so `\\N`, `\\G`, `\\l` escapes cannot be injected), quotes are
    escaped and newlines become DOT line breaks.
    """
    text = _CONTROL.sub("", value).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\n", "\\n") + '"'


def _wrap(text: str, width: int = LABEL_WIDTH, limit: int = LABEL_MAX) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return "\n".join(lines)


def node_id(node: PlanNode) -> str:
    """Return the DOT (and SVG element) id of a plan node."""
    return f"node-{node.pk}"


def _attrs(**attrs: str) -> str:
    return ", ".join(f"{name}={quote(value)}" for name, value in attrs.items())


def leaf_label(node: PlanNode) -> str:
    """Return the text drawn in a leaf's box: its key, agent and (shortened) task."""
    parts = [node.key]
    if node.agent:
        parts.append(f"[{node.agent}]")
    if node.task:
        parts.append(_wrap(node.task))
    return "\n".join(parts)


def transitive_reduction(
    depends_on: Mapping[str, Collection[str]],
) -> dict[str, tuple[str, ...]]:
    """Return each key's dependencies without those already implied through another one.

    `a` stays a dependency of `c` only if no other dependency of `c` itself depends on `a`,
    directly or transitively; what each key waits for is unchanged. Dependencies on unknown
    keys are dropped, the order of the rest is kept. Ancestor sets are bitsets, so the work is
    O(V·E) bit operations at worst. A cyclic input (never a validated plan) comes back as it
    is, unknown keys dropped.
    """
    keys = list(depends_on)
    bit = {key: 1 << index for index, key in enumerate(keys)}
    deps = {key: [d for d in dict.fromkeys(depends_on[key]) if d in bit] for key in keys}
    try:
        order = list(TopologicalSorter(deps).static_order())
    except CycleError:
        return {key: tuple(found) for key, found in deps.items()}
    ancestors: dict[str, int] = {}
    reduced: dict[str, tuple[str, ...]] = {}
    for key in order:
        direct = deps[key]
        # Everything reachable through a dependency, not counting that dependency itself.
        through = 0
        for dep in direct:
            through |= ancestors[dep]
        reduced[key] = tuple(dep for dep in direct if not through & bit[dep])
        mine = through
        for dep in direct:
            mine |= bit[dep]
        ancestors[key] = mine
    return {key: reduced[key] for key in keys}


def plan_dot(
    nodes: Sequence[PlanNode],
    *,
    url_for: Callable[[PlanNode], str],
    highlight: str | None = None,
) -> str:
    """Return the DOT digraph of one plan version's nodes (in tree order, parents first).

    Compounds become nested `cluster_<pk>` subgraphs labelled with their name, leaves become
    boxes filled by status. Edges run from each dependency to its dependent leaf, drawn as the
    transitive reduction: an edge already implied by a longer path is left out of the drawing
    (the plan keeps it). Dependencies on keys that are not leaves of these nodes are ignored.
    The selected step is highlighted in the browser, so the DOT is the same for every viewer;
    `highlight` names a leaf key drawn with a thick border and the SVG class `highlight` (a gate's
    step on the gate page).
    """
    children: dict[int | None, list[PlanNode]] = defaultdict(list)
    known = {node.pk for node in nodes}
    for node in nodes:
        parent = node.parent_id if node.parent_id in known else None
        children[parent].append(node)
    leaf_ids = {node.key: node_id(node) for node in nodes if node.is_leaf}

    out = [
        "digraph plan {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.3, ranksep=0.4,'
        ' bgcolor="transparent", labeljust=l, style="rounded", color="#cbd5e1",'
        ' fontcolor="#334155"];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10,'
        ' margin="0.22,0.07", penwidth=1.4];',
        '  edge [color="#64748b", arrowsize=0.7];',
    ]

    def emit(level: Iterable[PlanNode], indent: str) -> None:
        for node in level:
            if node.is_leaf:
                fill, border = STATUS_COLOURS.get(node.status, _UNKNOWN_COLOURS)
                extra = (
                    {"class": "highlight", "penwidth": "3.5", "color": "#1d4ed8"}
                    if node.key == highlight
                    else {"color": border}
                )
                attrs = _attrs(
                    id=node_id(node),
                    label=leaf_label(node),
                    tooltip=f"{node.key} ({node.status}): {node.task}",
                    URL=url_for(node),
                    target="_top",
                    fillcolor=fill,
                    **extra,
                )
                out.append(f"{indent}{quote(node_id(node))} [{attrs}];")
            else:
                out.append(f"{indent}subgraph cluster_{node.pk} {{")
                out.append(f"{indent}  id={quote(f'cluster-{node.pk}')};")
                out.append(f"{indent}  label={quote(_wrap(node.name or node.key, 40))};")
                out.append(f"{indent}  tooltip={quote(node.description or node.name or node.key)};")
                emit(children.get(node.pk, []), indent + "  ")
                out.append(f"{indent}}}")

    emit(children.get(None, []), "  ")
    leaves = [node for node in nodes if node.is_leaf]
    drawn = transitive_reduction({node.key: node.depends_on for node in leaves})
    for node in leaves:
        for dep in drawn[node.key]:
            out.append(f"  {quote(leaf_ids[dep])} -> {quote(node_id(node))};")
    out.append("}")
    return "\n".join(out) + "\n"
