"""A fraud case planned on an installation without an LLM provider gives its write-up to a person.

The planner tells the pack's methods whether a provider is configured (the planning state), so the
stored plan has no step an `llm` agent could not run; with a provider the analyst keeps it.
"""

from __future__ import annotations

from typing import Any

import pytest

from planning.models import Case, PlanNode
from tests.cases import planned_case

pytestmark = pytest.mark.django_db


def _planned_fraud_case(submitter: Any, strategy: str, **inputs: Any) -> Case:
    fraud = {"account_id": "ACC-410", "amount": "120", **inputs}
    return planned_case(submitter, domain="fraud", inputs=fraud, strategy=strategy)


def _agents(case: Case) -> dict[str, str]:
    return dict(
        PlanNode.objects.filter(version=case.current_version, kind=PlanNode.Kind.LEAF).values_list(
            "key", "agent"
        )
    )


@pytest.mark.parametrize("strategy", ["static", "forward", "goal", "hybrid"])
def test_without_a_provider_the_fraud_write_up_goes_to_the_investigator(
    analyst: Any, settings: Any, strategy: str
) -> None:
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    light = _agents(_planned_fraud_case(analyst, strategy))
    assert light["summarise-findings"] == "investigator"
    serious = _agents(_planned_fraud_case(analyst, strategy, amount="12500"))
    assert serious["draft-findings"] == "investigator"
    assert "fraud-analyst" not in {*light.values(), *serious.values()}


def test_with_a_provider_the_static_fraud_write_up_stays_with_the_llm_analyst(
    analyst: Any, settings: Any
) -> None:
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # configured; static planning calls nobody
    assert _agents(_planned_fraud_case(analyst, "static"))["summarise-findings"] == "fraud-analyst"
