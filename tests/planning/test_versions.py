"""Plan versions: a DagPlan stored as rows is rebuilt exactly from them."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.test import override_settings

from planning.actions import Outcome, materialise_plan, submit_case
from planning.core.serialize import canonical_json, content_hash, node_to_data
from planning.models import PlanNode, PlanVersion
from planning.versions import VersionCorrupt, load_plan
from tests import personas
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.llm_scripts import fraud_plan_responder

pytestmark = pytest.mark.django_db


def _planned(**fields: Any) -> PlanVersion:
    values: dict[str, Any] = {
        "title": "A case",
        "goal": "Verify invoice INV-1042",
        "domain": "invoice",
        "strategy": "static",
        "inputs": {"invoice_id": "INV-1042"},
    }
    values.update(fields)
    case = submit_case(submitter=personas.analyst(), **values)
    result = materialise_plan(case.pk)
    assert result.outcome == Outcome.MATERIALISED, result.reason
    assert result.version is not None
    return result.version


@pytest.mark.parametrize("strategy", ["static", "forward", "goal"])
def test_a_stored_pack_plan_loads_back_to_the_same_plan(strategy: str) -> None:
    version = _planned(strategy=strategy)
    plan = load_plan(version)
    assert content_hash(plan) == version.content_hash
    rows = {row.key: row for row in PlanNode.objects.filter(version=version)}
    assert {leaf.key for leaf in plan.leaves} == {k for k, r in rows.items() if r.is_leaf}
    for leaf in plan.leaves:
        assert sorted(plan.dependencies[leaf.key]) == rows[leaf.key].depends_on
        assert (leaf.risk or "") == rows[leaf.key].risk


def test_an_llm_plan_with_nested_subtasks_loads_back_exactly(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = fraud_plan_responder
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        version = _planned(domain="", inputs={}, strategy="llm", goal="investigate-fraud")
    plan = load_plan(version)
    assert content_hash(plan) == version.content_hash
    assert plan.llm_calls == version.llm_calls == 2
    assert any(not node.is_leaf for node in plan.root.children)


def test_tool_risk_classes_are_part_of_the_hashed_plan() -> None:
    version = _planned()
    plan = load_plan(version)
    assert plan.leaf("place-hold").risk == "financial"
    data = node_to_data(plan.root)
    hold = next(c for c in data["children"] if c["key"] == "place-hold")
    hold["risk"] = None
    assert content_hash_of(data) != version.content_hash


def content_hash_of(data: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def test_rows_changed_behind_the_versions_back_are_detected() -> None:
    version = _planned()
    PlanNode.objects.filter(version=version, key="place-hold").update(inputs={"amount": 1})
    with pytest.raises(VersionCorrupt, match="content hash"):
        load_plan(version)


def test_loading_a_version_takes_one_query(django_assert_num_queries: Any) -> None:
    version = _planned()
    with django_assert_num_queries(1):
        load_plan(version)
