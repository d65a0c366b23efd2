"""Score a plan against a goal's reference and constraints: validity, node F1 and edge F1.

Leaves are matched one to one, greedily, best pair first: a pair with the same tool; failing
that, a pair with the same agent whose tasks share a content word (the more they share, the
better; a pair whose tools differ never matches). Node F1 is over the matched leaves; edge F1
over the edges of the two transitive reductions, an edge counting when both its ends are matched
and the reference has the edge between their partners (two plans without any edge: the node
F1).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eval.dataset import Constraints
from planning.core.catalogue import Catalogue
from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid
from planning.core.serialize import node_from_data, node_to_data
from planning.core.tree import Compound, Leaf
from planning.core.validation import PlanLimits, validate_plan

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORD_TEXT = (
    "a an and any are as at be by for from has have if in into is it its of on or so the that "
    "their then this to was were with"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """One check a plan did not pass: its name (`catalogue`, `constraint.forbidden_tool`…)."""

    check: str
    detail: str

    def as_data(self) -> dict[str, str]:
        """Return the failure as JSON-ready data."""
        return {"check": self.check, "detail": self.detail}


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """How much of the reference a plan reproduces."""

    matched: int
    node_precision: float
    node_recall: float
    node_f1: float
    edge_precision: float
    edge_recall: float
    edge_f1: float
    pairs: tuple[tuple[str, str], ...]  # (plan leaf key, reference leaf key)


def words(text: str) -> frozenset[str]:
    """Return the content words of a task text (lower case, stopwords left out)."""
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS)


def similarity(a: str, b: str) -> float:
    """Return the Jaccard similarity of two task texts' content words."""
    left, right = words(a), words(b)
    if not left or not right:
        return 0.0
    return len(left & right) / len(left | right)


def _pair_rank(leaf: Leaf, ref: Leaf) -> tuple[int, float] | None:
    sim = similarity(leaf.task, ref.task)
    if leaf.tool is not None and ref.tool is not None:
        if leaf.tool != ref.tool:
            return None
        return (2 + (leaf.agent == ref.agent), sim)
    if leaf.agent == ref.agent and sim > 0:
        return (1, sim)
    return None


def match_leaves(plan: DagPlan, reference: DagPlan) -> tuple[tuple[str, str], ...]:
    """Return the matched (plan leaf, reference leaf) key pairs, best pair first."""
    candidates: list[tuple[int, float, int, int]] = []
    for i, leaf in enumerate(plan.leaves):
        for j, ref in enumerate(reference.leaves):
            rank = _pair_rank(leaf, ref)
            if rank is not None:
                candidates.append((rank[0], rank[1], i, j))
    candidates.sort(key=lambda c: (-c[0], -c[1], c[2], c[3]))
    used_plan: set[int] = set()
    used_ref: set[int] = set()
    pairs: list[tuple[str, str]] = []
    for _, _, i, j in candidates:
        if i in used_plan or j in used_ref:
            continue
        used_plan.add(i)
        used_ref.add(j)
        pairs.append((plan.leaves[i].key, reference.leaves[j].key))
    return tuple(pairs)


def reduced_edges(plan: DagPlan) -> frozenset[tuple[str, str]]:
    """Return the edges (before, after) of the transitive reduction of the plan's leaf DAG."""
    edges: set[tuple[str, str]] = set()
    for key, deps in plan.dependencies.items():
        for dep in deps:
            implied = any(dep in plan.upstream(other) for other in deps if other != dep)
            if not implied:
                edges.add((dep, key))
    return frozenset(edges)


def _f1(correct: int, predicted: int, expected: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / expected if expected else 0.0
    if precision + recall == 0:
        return precision, recall, 0.0
    return precision, recall, 2 * precision * recall / (precision + recall)


def overlap(plan: DagPlan, reference: DagPlan) -> Overlap:
    """Return node and edge precision, recall and F1 of `plan` against `reference`."""
    pairs = match_leaves(plan, reference)
    partner = dict(pairs)
    node = _f1(len(pairs), len(plan.leaves), len(reference.leaves))
    predicted = reduced_edges(plan)
    expected = reduced_edges(reference)
    correct = sum(
        1
        for before, after in predicted
        if before in partner and after in partner and (partner[before], partner[after]) in expected
    )
    # with no edge on either side there is no order to get wrong: the steps decide
    edge = node if not predicted and not expected else _f1(correct, len(predicted), len(expected))
    return Overlap(
        matched=len(pairs),
        node_precision=node[0],
        node_recall=node[1],
        node_f1=node[2],
        edge_precision=edge[0],
        edge_recall=edge[1],
        edge_f1=edge[2],
        pairs=pairs,
    )


def _selected(plan: DagPlan, selector: str) -> list[Leaf]:
    what, _, name = selector.partition(":")
    return [leaf for leaf in plan.leaves if (leaf.tool if what == "tool" else leaf.agent) == name]


def constraint_failures(plan: DagPlan, constraints: Constraints) -> list[Failure]:
    """Return every constraint the plan breaks."""
    failures: list[Failure] = []
    tools = {leaf.tool for leaf in plan.leaves if leaf.tool}
    agents = {leaf.agent for leaf in plan.leaves}
    for tool in constraints.required_tools:
        if tool not in tools:
            failures.append(Failure(check="constraint.required_tool", detail=f"no {tool} step"))
    for tool in constraints.forbidden_tools:
        if tool in tools:
            failures.append(Failure(check="constraint.forbidden_tool", detail=f"uses {tool}"))
    for agent in constraints.required_agents:
        if agent not in agents:
            failures.append(Failure(check="constraint.required_agent", detail=f"no {agent} step"))
    for agent in constraints.forbidden_agents:
        if agent in agents:
            failures.append(Failure(check="constraint.forbidden_agent", detail=f"uses {agent}"))
    for before, after in constraints.orders:
        first = {leaf.key for leaf in _selected(plan, before)}
        for leaf in _selected(plan, after):
            if not first & plan.upstream(leaf.key):
                failures.append(
                    Failure(
                        check="constraint.order",
                        detail=f"{leaf.key!r} ({after}) has no {before} step upstream",
                    )
                )
    if len(plan.leaves) > constraints.max_leaves:
        failures.append(
            Failure(
                check="constraint.max_leaves",
                detail=f"{len(plan.leaves)} leaves, at most {constraints.max_leaves}",
            )
        )
    return failures


def schema_failures(plan: DagPlan) -> list[Failure]:
    """Return a failure when the plan does not survive its stored form (as a plan version)."""
    try:
        root = node_from_data(node_to_data(plan.root))
        if not isinstance(root, Compound):
            raise PlanInvalid("the stored plan's root is a leaf")
        again = DagPlan.build(root)
    except (PlanInvalid, ValueError, KeyError, TypeError) as exc:
        return [Failure(check="schema", detail=str(exc))]
    if again.dependencies != plan.dependencies:
        return [Failure(check="schema", detail="the stored plan's dependencies differ")]
    return []


def catalogue_failures(
    plan: DagPlan, catalogue: Catalogue, *, check_inputs: bool = True
) -> list[Failure]:
    """Return the plan's problems with agents, tools and (`check_inputs`) tool inputs.

    With `check_inputs` this is the planner's own `validate_plan` (agents enabled and allowed
    their tools, tool inputs valid, `$ref`s naming an upstream leaf and an output field it has);
    without, only agents and tools are checked (reference plans carry no tool inputs).
    """
    if check_inputs:
        try:
            validate_plan(plan, catalogue, PlanLimits(max_leaves=10_000))
        except PlanInvalid as exc:
            return [Failure(check="catalogue", detail=part) for part in exc.message.split("; ")]
        return []
    failures: list[Failure] = []
    for leaf in plan.leaves:
        agent = catalogue.agents.get(leaf.agent)
        if agent is None:
            failures.append(Failure(check="catalogue", detail=f"unknown agent {leaf.agent!r}"))
        elif leaf.tool is None and agent.kind == "tool":
            failures.append(
                Failure(check="catalogue", detail=f"tool agent {leaf.agent!r} has no tool")
            )
        elif leaf.tool is not None and leaf.tool not in agent.tools:
            failures.append(
                Failure(
                    check="catalogue",
                    detail=f"tool {leaf.tool!r} is not allowed for {leaf.agent!r}",
                )
            )
        elif leaf.tool is not None and leaf.tool not in catalogue.tools:
            failures.append(Failure(check="catalogue", detail=f"unknown tool {leaf.tool!r}"))
    return failures


def validity_failures(
    plan: DagPlan,
    catalogue: Catalogue,
    constraints: Constraints,
    *,
    check_inputs: bool = True,
) -> list[Failure]:
    """Return every reason the plan is not valid (none: valid). The DAG itself is checked when
    the plan is built (`DagPlan.build` refuses cycles and unknown keys)."""
    return [
        *schema_failures(plan),
        *catalogue_failures(plan, catalogue, check_inputs=check_inputs),
        *constraint_failures(plan, constraints),
    ]


def tree_depth(plan: DagPlan) -> int:
    """Return the deepest leaf's number of ancestors (a flat plan has depth 1)."""
    deepest = 0
    for leaf in plan.leaves:
        depth, parent = 0, plan.parent_of(leaf.key)
        while parent is not None:
            depth += 1
            parent = plan.parent_of(parent.key)
        deepest = max(deepest, depth)
    return deepest


def mean(values: Sequence[float]) -> float:
    """Return the mean (0.0 of nothing)."""
    return sum(values) / len(values) if values else 0.0


def count_by_check(failures: Sequence[Mapping[str, str]]) -> dict[str, int]:
    """Return how many failures each check has, by check name."""
    counts: dict[str, int] = {}
    for failure in failures:
        counts[failure["check"]] = counts.get(failure["check"], 0) + 1
    return counts
