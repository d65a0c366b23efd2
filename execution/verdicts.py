"""Goal-level verification: whether a case whose leaves all ended reached its goal, by the rules."""

from __future__ import annotations

from dataclasses import dataclass

from execution.goal_judge import judge_model
from planning.catalogue import registered_packs
from planning.models import Case, NodeStatus, PlanNode


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Goal-level verification of a case whose leaves all ended."""

    passed: bool
    reasons: tuple[str, ...]
    checks: tuple[str, ...]
    # The LLM goal judge still to ask before the case may complete ("" when none): the rules held.
    judge: str = ""


def verify_goal(case: Case) -> Verdict:
    """Decide by the rules whether a case whose leaves all ended reached its goal, with the reasons.

    Every leaf must have succeeded, except leaves whose failure policy is `continue` (their
    failure and what it blocked are named); then the pack's rules, when it has any. Never calls a
    model: when the rules hold and an LLM goal judge is configured, the verdict passes and names
    it in `judge`, and the caller has it asked outside the transaction (`execution.goal_judge`).
    """
    nodes = list(
        PlanNode.objects.filter(version_id=case.current_version_id, kind=PlanNode.Kind.LEAF)
    )
    reasons: list[str] = []
    checks: list[str] = []
    for node in nodes:
        if node.status == NodeStatus.SUCCEEDED:
            continue
        if node.failure_policy == "continue" and node.status in {
            NodeStatus.FAILED,
            NodeStatus.SKIPPED,
        }:
            checks.append(f"{node.key} {node.status} (failure policy continue)")
            continue
        reasons.append(f"{node.key} {node.status}" + (f": {node.error}" if node.error else ""))
    if not reasons:
        checks.append(f"all {len(nodes)} steps ended as planned")
    pack = registered_packs().get(case.domain) if case.domain else None
    rules = getattr(pack, "goal_check", None) if pack is not None else None
    if rules is not None and not reasons:
        outputs = {n.key: n.output for n in nodes if n.status == NodeStatus.SUCCEEDED}
        problems = list(rules(outputs))
        reasons.extend(problems)
        if not problems:
            checks.append(f"the {pack.name} rules hold")  # type: ignore[union-attr]
    return Verdict(
        passed=not reasons,
        reasons=tuple(reasons),
        checks=tuple(checks),
        judge="" if reasons else judge_model(),
    )
