"""The fraud pack where the installation has no LLM provider: a person writes the findings.

The planning state says so (`planning_state(..., has_llm_provider=False)`); the pack's methods
tried first then give the write-up to the investigator (a human agent's work item) instead of the
`llm` agent fraud-analyst, whose step could not run. With a provider nothing changes.
"""

from typing import Any

import pytest

from planning.core.dag import DagPlan
from planning.core.forward import ForwardDecomposition
from planning.core.goal import GoalOrientedDecomposition
from planning.core.pack import NO_LLM_PROVIDER, case_inputs, has_llm_provider, planning_state
from planning.core.static import StaticDecomposition
from planning.core.validation import validate_plan
from planning.packs import fraud

LIGHT = {"account_id": "ACC-410", "amount": "120"}
SERIOUS = {"account_id": "ACC-300", "amount": "12500"}
LLM_AGENTS = {agent.slug for agent in fraud.AGENTS if agent.kind == "llm"}


def state(inputs: dict[str, Any], *, has_provider: bool) -> dict[str, Any]:
    return planning_state(fraud.PACK.initial_state(inputs), has_llm_provider=has_provider)


def plan(
    inputs: dict[str, Any], *, has_provider: bool, strategy: Any = StaticDecomposition
) -> DagPlan:
    result = strategy(fraud.PACK.methods).plan(
        fraud.PACK.goal(), state(inputs, has_provider=has_provider)
    )
    validate_plan(result, fraud.PACK.catalogue())
    return result


def goal_plan(inputs: dict[str, Any], *, has_provider: bool) -> DagPlan:
    facts = state(inputs, has_provider=has_provider)
    planner = GoalOrientedDecomposition(
        fraud.PACK.capabilities_for(facts), fraud.PACK.goal_facts_for(facts)
    )
    result = planner.plan(fraud.PACK.goal(), facts)
    validate_plan(result, fraud.PACK.catalogue())
    return result


def agents(result: DagPlan) -> dict[str, str]:
    return {leaf.key: leaf.agent for leaf in result.leaves}


def test_the_state_says_no_provider_only_where_there_is_none() -> None:
    inputs = fraud.PACK.initial_state(LIGHT)
    with_provider = planning_state(inputs, has_llm_provider=True)
    assert with_provider == inputs and has_llm_provider(with_provider)
    without = planning_state(inputs, has_llm_provider=False)
    assert without[NO_LLM_PROVIDER] is True and not has_llm_provider(without)
    # A state carried over (a re-plan) is told again, not trusted as it was.
    assert has_llm_provider(planning_state(without, has_llm_provider=True))
    # A pack validating the state against its schema (unknown fields forbidden) reads the inputs.
    assert case_inputs(without) == inputs
    assert fraud.PACK.input_schema.model_validate(case_inputs(without))


def test_without_a_provider_a_person_summarises_a_light_case() -> None:
    result = plan(LIGHT, has_provider=False)
    assert result.root.provenance.source == "light-investigation-without-llm"
    assert agents(result) == {
        "pull-transactions": "transaction-monitor",
        "detect-anomalies": "transaction-monitor",
        "summarise-findings": "investigator",
    }
    assert "no LLM provider" in result.leaf("summarise-findings").rationale


def test_with_a_provider_the_light_case_keeps_the_llm_analyst() -> None:
    result = plan(LIGHT, has_provider=True)
    assert result.root.provenance.source == "light-investigation"
    assert agents(result)["summarise-findings"] == "fraud-analyst"


@pytest.mark.parametrize("strategy", [StaticDecomposition, ForwardDecomposition])
def test_without_a_provider_a_person_drafts_a_serious_cases_findings(strategy: Any) -> None:
    result = plan(SERIOUS, has_provider=False, strategy=strategy)
    assert agents(result)["draft-findings"] == "investigator"
    assert not LLM_AGENTS & set(agents(result).values())
    # The rest of the investigation is as with a provider: same steps, same order.
    assert result.dependencies == plan(SERIOUS, has_provider=True, strategy=strategy).dependencies
    assert result.node("prepare-report").provenance.source == "report-by-person-with-legal-review"


@pytest.mark.parametrize("inputs", [LIGHT, SERIOUS])
def test_without_a_provider_goal_oriented_plans_give_no_step_to_an_llm_agent(
    inputs: dict[str, Any],
) -> None:
    assert LLM_AGENTS & set(agents(goal_plan(inputs, has_provider=True)).values())
    assert not LLM_AGENTS & set(agents(goal_plan(inputs, has_provider=False)).values())
