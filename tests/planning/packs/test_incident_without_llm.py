"""The incident pack where the installation has no LLM provider: the incident commander reads
the breached hosts' logs instead of the `llm` agent forensic-analyst, whose step could not run.
With a provider nothing changes."""

from typing import Any

import pytest

from planning.core.dag import DagPlan
from planning.core.goal import GoalOrientedDecomposition
from planning.core.pack import planning_state
from planning.core.static import StaticDecomposition
from planning.core.validation import validate_plan
from planning.packs import incident

BREACH = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}


def _state(has_provider: bool) -> dict[str, Any]:
    return planning_state(incident.PACK.initial_state(BREACH), has_llm_provider=has_provider)


def static_plan(has_provider: bool) -> DagPlan:
    plan = StaticDecomposition(incident.PACK.methods).plan(
        incident.PACK.goal(), _state(has_provider)
    )
    validate_plan(plan, incident.PACK.catalogue())
    return plan


def goal_plan(has_provider: bool) -> DagPlan:
    facts = _state(has_provider)
    planner = GoalOrientedDecomposition(
        incident.PACK.capabilities_for(facts), incident.PACK.goal_facts_for(facts)
    )
    plan = planner.plan(incident.PACK.goal(), facts)
    validate_plan(plan, incident.PACK.catalogue())
    return plan


@pytest.mark.parametrize("planner", [static_plan, goal_plan])
def test_without_a_provider_the_incident_commander_reads_the_logs(planner: Any) -> None:
    agents = {leaf.key: leaf.agent for leaf in planner(has_provider=False).leaves}
    assert agents["review-logs-by-hand"] == "incident-commander"
    assert "analyse-attack-path" not in agents
    llm_agents = {a.slug for a in incident.AGENTS if a.kind == "llm"}
    assert not llm_agents & set(agents.values())


@pytest.mark.parametrize("planner", [static_plan, goal_plan])
def test_with_a_provider_the_forensic_analyst_reads_them(planner: Any) -> None:
    agents = {leaf.key: leaf.agent for leaf in planner(has_provider=True).leaves}
    assert agents["analyse-attack-path"] == "forensic-analyst"
    assert "review-logs-by-hand" not in agents
