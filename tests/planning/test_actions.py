from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.test import override_settings
from django.urls import reverse

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from observability.metrics import EventCount
from oversight.models import Notification
from planning.actions import CaseInvalid, Outcome, materialise_plan, submit_case
from planning.models import (
    Case,
    CaseStatus,
    DecompositionCacheEntry,
    LlmCall,
    PlanNode,
    PlanVersion,
)
from tests import personas
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.planning.llm_scripts import fraud_plan_responder, incident_responder

pytestmark = pytest.mark.django_db

INVOICE = {"invoice_id": "INV-1042"}


def _submit(user: Any, **overrides: Any) -> Case:
    fields: dict[str, Any] = {
        "title": "Verify INV-1042",
        "goal": "Verify invoice INV-1042",
        "domain": "invoice",
        "strategy": "static",
        "inputs": INVOICE,
    }
    fields.update(overrides)
    return submit_case(submitter=user, **fields)


def _llm(server: FakeOpenAIServer) -> Any:
    return override_settings(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="test-key")


def _actions(case: Case) -> list[str]:
    return list(
        AuditEvent.objects.filter(chain=case_chain(case.pk))
        .order_by("seq")
        .values_list("action", flat=True)
    )


def test_submitting_a_case_audits_it_and_enqueues_planning_on_commit(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        case = _submit(personas.analyst())
    assert case.status == CaseStatus.PLANNING
    assert case.inputs == {**INVOICE, "check_purchase_order": True, "hold_on_findings": True}
    assert len([c for c in callbacks if not isinstance(c, EventCount)]) == 1  # and the metrics
    assert _actions(case) == ["planning.case.submitted"]


def test_only_analysts_submit_cases() -> None:
    for make in (personas.officer, personas.auditor, personas.admin, personas.outsider):
        with pytest.raises(PermissionDenied):
            _submit(make())
    assert Case.objects.count() == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"title": "  "}, "title"),
        ({"goal": ""}, "goal"),
        ({"strategy": "magic"}, "strategy"),
        ({"domain": "astrology"}, "domain"),
        ({"domain": "", "strategy": "static"}, "domain"),
        ({"max_depth": 0}, "max_depth"),
        ({"max_depth": 6}, "max_depth"),
        ({"inputs": {"invoice_id": "1042"}}, "inputs.invoice_id"),
        ({"inputs": {}}, "inputs.invoice_id"),
    ],
)
def test_invalid_cases_name_the_field_and_write_nothing(
    overrides: dict[str, Any], field: str, django_capture_on_commit_callbacks: Any
) -> None:
    user = personas.analyst()
    events_before = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(CaseInvalid) as caught:
        _submit(user, **overrides)
    assert field in caught.value.errors
    assert field in caught.value.message
    assert Case.objects.count() == 0
    assert AuditEvent.objects.count() == events_before
    assert callbacks == []


def test_static_plan_is_stored_whole_as_version_one() -> None:
    case = _submit(personas.analyst())
    version = materialise_plan(case.pk).version
    case.refresh_from_db()
    assert version is not None
    assert case.status == CaseStatus.AWAITING_APPROVAL
    assert case.current_version == version
    assert (version.number, version.llm_calls, version.strategy) == (1, 0, "static")
    assert len(version.content_hash) == 64
    nodes = {n.key: n for n in PlanNode.objects.filter(version=version)}
    assert nodes["verify-invoice"].kind == "compound"
    assert nodes["lookup-supplier"].depends_on == ["extract-fields"]
    checks = {"check-duplicate", "check-totals", "check-po"}
    assert checks <= set(nodes)
    assert all(nodes[key].depends_on == ["lookup-supplier"] for key in checks)
    assert set(nodes["audit-report"].depends_on) == checks
    assert nodes["place-hold"].risk == "financial"
    assert nodes["check-totals"].parent == nodes["verify-invoice"]
    assert version.leaf_count == sum(1 for n in nodes.values() if n.kind == "leaf")
    # The plan gate and the payment hold's step gate open in the transaction that stores it.
    assert _actions(case) == [
        "planning.case.submitted",
        "planning.plan.started",
        "planning.plan.materialised",
        "oversight.gate.opened",
        "oversight.gate.opened",
    ]
    assert verify_chain(case_chain(case.pk)) == []


def test_materialising_twice_changes_nothing() -> None:
    case = _submit(personas.analyst())
    materialise_plan(case.pk)
    assert materialise_plan(case.pk).outcome == Outcome.SKIPPED
    assert PlanVersion.objects.filter(case=case).count() == 1


@pytest.mark.parametrize("strategy", ["forward", "goal"])
def test_forward_and_goal_oriented_plans_of_the_same_case_are_stored_too(strategy: str) -> None:
    case = _submit(personas.analyst(), strategy=strategy)
    version = materialise_plan(case.pk).version
    case.refresh_from_db()
    assert version is not None, case.error
    assert version.strategy == strategy
    assert version.width == 3
    leaves = PlanNode.objects.filter(version=version, kind="leaf")
    assert {leaf.provenance["strategy"] for leaf in leaves} == {strategy}


@override_settings(OPENAI_BASE_URL="", OPENAI_API_KEY="")
def test_llm_cases_are_refused_at_submission_while_no_provider_is_configured() -> None:
    with pytest.raises(CaseInvalid) as caught:
        _submit(personas.analyst(), domain="", inputs={}, strategy="llm", goal="Investigate")
    assert caught.value.errors["strategy"] == [
        "The llm strategy needs an LLM provider, and this server has none configured."
    ]
    assert not Case.objects.exists()


def test_llm_planning_whose_provider_went_away_fails_telling_the_analyst_to_ask_the_operator(
    fake_openai: FakeOpenAIServer,
) -> None:
    with _llm(fake_openai):
        case = _submit(
            personas.analyst(), domain="", inputs={}, strategy="llm", goal="Investigate fraud"
        )
    with override_settings(OPENAI_BASE_URL="", OPENAI_API_KEY=""):
        assert materialise_plan(case.pk).outcome == Outcome.FAILED
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    assert "Ask the operator of this server to configure an LLM provider." in case.error
    assert "OPENAI_" not in case.error
    assert not PlanVersion.objects.exists()
    assert _actions(case)[-1] == "planning.plan.failed"


@override_settings(OPENAI_BASE_URL="", OPENAI_API_KEY="")
def test_hybrid_without_a_provider_still_plans_what_static_methods_cover() -> None:
    case = _submit(
        personas.analyst(),
        domain="incident",
        strategy="hybrid",
        inputs={"kind": "database-outage", "service": "billing-db"},
    )
    assert materialise_plan(case.pk).outcome == Outcome.MATERIALISED


@pytest.mark.scenario("L9")
def test_llm_plan_at_depth_two_records_and_audits_every_call(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = fraud_plan_responder
    with _llm(fake_openai):
        case = _submit(
            personas.analyst(),
            domain="",
            inputs={},
            strategy="llm",
            goal="investigate-fraud",
            max_depth=2,
        )
        version = materialise_plan(case.pk).version
    assert version is not None
    assert version.llm_calls == 2
    leaves = list(
        PlanNode.objects.filter(version=version, kind="leaf")
        .order_by("position")
        .values_list("key", "agent")
    )
    assert [agent for _, agent in leaves] == [
        "fraud-analyst",
        "investigator",
        "fraud-analyst",
        "legal-counsel",
    ]
    calls = list(LlmCall.objects.filter(case=case))
    assert len(calls) == 2
    assert all(c.prompt_hash and c.response_hash and c.prompt_tokens > 0 for c in calls)
    assert _actions(case).count("planning.llm.called") == 2
    subtask = PlanNode.objects.get(version=version, kind="compound", depth=1)
    assert subtask.provenance["strategy"] == "llm"


@pytest.mark.django_db(transaction=True)
def test_identical_llm_requests_are_answered_from_the_stored_cache(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = fraud_plan_responder
    user = personas.analyst()
    with _llm(fake_openai):
        first = _submit(user, domain="", inputs={}, strategy="llm", goal="investigate-fraud")
        materialise_plan(first.pk)
        calls_after_first = len(fake_openai.requests)
        second = _submit(user, domain="", inputs={}, strategy="llm", goal="investigate-fraud")
        version = materialise_plan(second.pk).version
    assert calls_after_first == 2
    assert len(fake_openai.requests) == calls_after_first
    assert version is not None
    assert DecompositionCacheEntry.objects.count() == 2


def test_hybrid_asks_the_llm_only_for_an_unknown_incident(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = incident_responder
    user = personas.analyst()
    with _llm(fake_openai):
        outage = _submit(
            user, domain="incident", strategy="hybrid",
            inputs={"kind": "database-outage", "service": "billing-db"},
        )  # fmt: skip
        materialise_plan(outage.pk)
        assert fake_openai.requests == []
        unknown = _submit(
            user, domain="incident", strategy="hybrid",
            inputs={"kind": "certificate-expiry", "service": "web"},
        )  # fmt: skip
        version = materialise_plan(unknown.pk).version
    assert version is not None
    assert len(fake_openai.requests) == 1
    assert "certificate-expiry" in fake_openai.requests[0].user_prompt
    agents = set(
        PlanNode.objects.filter(version=version, kind="leaf").values_list("agent", flat=True)
    )
    assert agents == {"incident-commander", "forensic-analyst"}


def test_a_failing_llm_leaves_plan_failed_and_no_plan_rows(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda request: FakeReply(status=500, should_retry=False)
    with _llm(fake_openai):
        case = _submit(personas.analyst(), domain="", inputs={}, strategy="llm", goal="investigate")
        assert materialise_plan(case.pk).outcome == Outcome.FAILED
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    assert case.error
    assert not PlanVersion.objects.exists()
    assert not PlanNode.objects.exists()
    assert LlmCall.objects.filter(case=case).exclude(error="").count() >= 1
    assert _actions(case)[-1] == "planning.plan.failed"


def test_the_analyst_is_notified_when_planning_fails(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda request: FakeReply(status=500, should_retry=False)
    analyst = personas.analyst()
    with _llm(fake_openai):
        case = _submit(analyst, domain="", inputs={}, strategy="llm", goal="investigate")
        assert materialise_plan(case.pk).outcome == Outcome.FAILED
    (notice,) = Notification.objects.filter(case=case)
    assert (notice.user, notice.kind) == (analyst, "case.plan_failed")
    assert notice.message.startswith(f"Your case #{case.pk} “Verify INV-1042” could not be")
    assert notice.url == reverse("planning:case-detail", args=[case.pk])


@pytest.mark.scenario("L5")
def test_exceeding_the_call_budget_fails_cleanly(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = fraud_plan_responder
    with _llm(fake_openai), override_settings(CASEHUB_LLM_MAX_CALLS=1):
        case = _submit(personas.analyst(), domain="", inputs={}, strategy="llm", goal="investigate")
        assert materialise_plan(case.pk).outcome == Outcome.FAILED
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    assert "call" in case.error.lower()
    assert not PlanVersion.objects.exists()


def test_a_disabled_pack_cannot_be_chosen() -> None:
    from planning.models import DomainPack

    DomainPack.objects.filter(slug="invoice").update(enabled=False)
    with pytest.raises(CaseInvalid) as caught:
        _submit(personas.analyst())
    assert "domain" in caught.value.errors
