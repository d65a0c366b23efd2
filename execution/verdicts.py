"""Goal-level verification: whether a case whose leaves all ended reached its goal, by the rules."""

from __future__ import annotations

from dataclasses import dataclass

from execution.goal_judge import judge_model
from planning.catalogue import data_port, registered_packs
from planning.core.pack import GoalFindings
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
    failure and what it blocked are named); then the pack's rules, when it has any: they read the
    outputs and the pack's systems as the last step left them (its database port), so a finding
    there (a service still down, a freeze not on the account) fails the case. Never calls a
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
    if pack is not None and pack.goal_check is not None and not reasons:
        outputs = {n.key: n.output for n in nodes if n.status == NodeStatus.SUCCEEDED}
        try:
            findings = pack.goal_check(outputs, data_port(pack))
        except (LookupError, ValueError, TypeError) as exc:
            # e.g. a service the estate no longer runs: what cannot be checked is not reached
            findings = GoalFindings(
                problems=(f"the {pack.name} rules could not be checked: {exc}",)
            )
        reasons.extend(findings.problems)
        if findings.reached:
            # what the rules saw hold, in words, under the rules' name
            checks.append(f"the {pack.name} rules hold")
            checks.extend(findings.held)
    return Verdict(
        passed=not reasons,
        reasons=tuple(reasons),
        checks=tuple(checks),
        judge="" if reasons else judge_model(),
    )
