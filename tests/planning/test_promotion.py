"""Promoting an LLM-planned subtree to a method of its pack, end to end with the real openai client
against the fake server: plan, approve, run, propose, approve by a second person, plan again."""

from __future__ import annotations

from typing import Any

import pytest

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from planning.actions import materialise_plan, submit_case
from planning.models import CaseStatus, LlmCall, PlanNode, PlanVersion, PromotedMethod
from planning.promotion.actions import (
    NotPromotable,
    PromotionConflict,
    PromotionDenied,
    approve_method,
    proposal_for,
    propose_method,
    reject_method,
    retire_method,
)
from planning.promotion.methods import MethodInvalid
from tests import personas
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.promotion_flow import UNKNOWN_KIND, incident, llm, model, run_to_end

pytestmark = pytest.mark.django_db

KIND_GUARD = [{"key": "kind", "op": "equals", "value": UNKNOWN_KIND}]


def _root(case: Any) -> PlanNode:
    return PlanNode.objects.get(version_id=case.current_version_id, parent=None)


def _executed(fake_openai: FakeOpenAIServer, analyst: Any, officer: Any) -> Any:
    with llm(fake_openai):
        case = incident(analyst)
        assert case.current_version.llm_calls == 1
        case = run_to_end(case, officer, personas.analyst("bea"))
    assert case.status == CaseStatus.COMPLETED, case.verification
    return case


def _active(case: Any, proposer: Any, approver: Any, **kwargs: Any) -> PromotedMethod:
    method = propose_method(
        user=proposer,
        case_id=case.pk,
        node_id=_root(case).pk,
        name=kwargs.get("name", "certificate-expiry-response"),
        guard=kwargs.get("guard", KIND_GUARD),
    )
    return approve_method(user=approver, method_id=method.pk)


def test_a_promoted_method_plans_the_next_case_of_that_kind_with_no_llm_call(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any
) -> None:
    fake_openai.responder = model
    source = _executed(fake_openai, analyst, officer)
    method = propose_method(
        user=officer,
        case_id=source.pk,
        node_id=_root(source).pk,
        name="certificate-expiry-response",
        guard=KIND_GUARD,
    )
    assert method.status == PromotedMethod.Status.PROPOSED
    assert method.task == "respond-to-incident" and method.version == 1
    assert [child["agent"] for child in method.subtree] == [
        "incident-commander",
        "forensic-analyst",
    ]
    assert method.subtree[1]["depends_on"] == ["triage"]
    approve_method(user=second_officer, method_id=method.pk)
    method.refresh_from_db()
    assert method.status == PromotedMethod.Status.ACTIVE
    assert method.approved_by == second_officer

    asked_before = len(fake_openai.requests)
    calls_before = LlmCall.objects.count()
    with llm(fake_openai):
        # A different description: the decomposition cache cannot answer it.
        again = incident(analyst, description="The web certificate expires tonight.")
    assert len(fake_openai.requests) == asked_before
    assert LlmCall.objects.count() == calls_before
    assert not LlmCall.objects.filter(case=again).exists()
    assert again.status == CaseStatus.AWAITING_APPROVAL
    version = again.current_version
    assert version.llm_calls == 0
    nodes = {n.key: n for n in PlanNode.objects.filter(version=version)}
    assert {n.provenance["source"] for n in nodes.values()} == {
        "promoted:certificate-expiry-response@v1"
    }
    assert nodes["notify"].depends_on == ["triage"]
    assert nodes["triage"].agent == "incident-commander"
    actions = set(
        AuditEvent.objects.filter(chain=case_chain(source.pk)).values_list("action", flat=True)
    )
    assert {"planning.method.proposed", "planning.method.approved"} <= actions
    assert verify_chain(case_chain(source.pk)) == []


def test_the_proposer_cannot_approve_their_own_method(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    method = propose_method(
        user=officer, case_id=case.pk, node_id=_root(case).pk, name="cert", guard=KIND_GUARD
    )
    with pytest.raises(PromotionDenied, match="second person"):
        approve_method(user=officer, method_id=method.pk)
    method.refresh_from_db()
    assert method.status == PromotedMethod.Status.PROPOSED


def test_an_analyst_cannot_promote_or_approve(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    with pytest.raises(PromotionDenied):
        propose_method(
            user=analyst, case_id=case.pk, node_id=_root(case).pk, name="cert", guard=KIND_GUARD
        )
    method = propose_method(
        user=officer, case_id=case.pk, node_id=_root(case).pk, name="cert", guard=KIND_GUARD
    )
    with pytest.raises(PromotionDenied):
        approve_method(user=personas.auditor(), method_id=method.pk)
    assert not PromotedMethod.objects.exclude(status="proposed").exists()


def test_a_subtree_that_has_not_run_is_refused_with_a_clear_message(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    fake_openai.responder = model
    with llm(fake_openai):
        case = incident(analyst)
    with pytest.raises(NotPromotable, match="only a subtree of an approved case"):
        propose_method(
            user=officer, case_id=case.pk, node_id=_root(case).pk, name="cert", guard=KIND_GUARD
        )
    assert not PromotedMethod.objects.exists()


def test_a_statically_planned_subtree_and_a_single_step_are_refused(
    analyst: Any, officer: Any
) -> None:
    case = submit_case(
        submitter=analyst,
        title="Outage",
        goal="Respond",
        domain="incident",
        strategy="hybrid",
        inputs={"kind": "database-outage", "service": "billing-db"},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    root = _root(case)
    with pytest.raises(NotPromotable, match="not planned by the LLM"):
        proposal_for(case, root)
    leaf = PlanNode.objects.filter(version=case.current_version, kind="leaf").first()
    with pytest.raises(NotPromotable, match="single step"):
        proposal_for(case, leaf)


def test_a_retired_method_is_no_longer_used_and_the_llm_is_asked_again(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    method = _active(case, officer, second_officer)
    retire_method(user=officer, method_id=method.pk, reason="the runbook changed")
    asked = len(fake_openai.requests)
    with llm(fake_openai):
        again = incident(analyst, description="Another certificate expired.")
    assert len(fake_openai.requests) == asked + 1
    assert again.current_version.llm_calls == 1
    assert _root(again).provenance["source"].startswith("llm:")
    retired = AuditEvent.objects.get(action="planning.method.retired")
    assert retired.data["reason"] == "the runbook changed"


def test_a_guard_that_does_not_match_leaves_the_case_to_the_llm(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    _active(case, officer, second_officer)
    asked = len(fake_openai.requests)
    with llm(fake_openai):
        other = incident(analyst, kind="dns-failure")
    assert len(fake_openai.requests) == asked + 1
    assert "promoted method" not in fake_openai.requests[-1].user_prompt
    assert other.current_version.llm_calls == 1


def test_code_methods_keep_priority_over_a_promoted_one(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    # A guard that would also match a database outage: the pack's own method still plans it.
    _active(case, officer, second_officer, guard=[{"key": "service", "op": "present"}])
    with llm(fake_openai):
        outage = incident(analyst, kind="database-outage", service="billing-db")
    assert _root(outage).provenance["source"] == "static:database-outage-response"


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ([], "guard is not valid"),
        ([{"key": "kind", "op": "matches", "value": "x"}], "guard is not valid"),
        ([{"key": "kind", "op": "present", "value": "x"}], "takes no value"),
        ([{"key": "kind", "op": "one-of", "value": "x"}], "non-empty list"),
        ([{"key": "kind", "op": "equals", "value": "x", "extra": 1}], "guard is not valid"),
        ([{"key": "colour", "op": "present"}], "not an input of the case"),
        ([{"key": "kind", "op": "equals", "value": "dns-failure"}], "does not hold"),
        ("kind == certificate-expiry", "guard is not valid"),
    ],
)
def test_a_bad_guard_is_refused_and_nothing_is_stored(
    fake_openai: FakeOpenAIServer,
    analyst: Any,
    officer: Any,
    guard: Any,
    message: str,
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    with pytest.raises(MethodInvalid, match=message):
        propose_method(user=officer, case_id=case.pk, node_id=_root(case).pk, name="x", guard=guard)
    assert not PromotedMethod.objects.exists()


def test_a_tampered_method_is_refused_at_approval_and_fails_planning_loudly(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    method = propose_method(
        user=officer, case_id=case.pk, node_id=_root(case).pk, name="cert", guard=KIND_GUARD
    )
    PromotedMethod.objects.filter(pk=method.pk).update(guard=[{"key": "kind", "op": "present"}])
    with pytest.raises(MethodInvalid, match="changed since it was proposed"):
        approve_method(user=second_officer, method_id=method.pk)
    PromotedMethod.objects.filter(pk=method.pk).update(guard=KIND_GUARD)
    approve_method(user=second_officer, method_id=method.pk)
    # The approved row is changed in the database: planning refuses it and says why.
    PromotedMethod.objects.filter(pk=method.pk).update(guard={"kind": "anything"})
    asked = len(fake_openai.requests)
    with llm(fake_openai):
        again = incident(analyst, description="Again.")
    assert again.status == CaseStatus.PLAN_FAILED
    assert "no longer matches what was approved" in again.error
    assert len(fake_openai.requests) == asked
    assert not PlanVersion.objects.filter(case=again).exists()


def test_a_second_version_supersedes_the_first_and_a_rejection_needs_a_reason(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any
) -> None:
    fake_openai.responder = model
    case = _executed(fake_openai, analyst, officer)
    first = _active(case, officer, second_officer, name="cert")
    second = _active(case, second_officer, officer, name="cert")
    first.refresh_from_db()
    assert (first.status, second.status, second.version) == ("retired", "active", 2)
    assert first.retire_reason == "superseded by version 2"
    third = propose_method(
        user=officer, case_id=case.pk, node_id=_root(case).pk, name="cert", guard=KIND_GUARD
    )
    with pytest.raises(MethodInvalid, match="reason"):
        reject_method(user=second_officer, method_id=third.pk, reason="  ")
    reject_method(user=second_officer, method_id=third.pk, reason="no need")
    with pytest.raises(PromotionConflict):
        approve_method(user=second_officer, method_id=third.pk)
    third.refresh_from_db()
    assert third.status == "rejected" and third.rejection_reason == "no need"


@pytest.mark.parametrize("strategy", ["static", "forward"])
def test_static_planning_uses_an_active_promoted_method_and_fails_without_one(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any, second_officer: Any, strategy: str
) -> None:
    fake_openai.responder = model
    source = _executed(fake_openai, analyst, officer)

    def static_case() -> Any:
        case = submit_case(
            submitter=analyst,
            title="Static",
            goal="Respond",
            domain="incident",
            strategy=strategy,
            inputs={"kind": UNKNOWN_KIND, "service": "web"},
        )
        materialise_plan(case.pk)
        case.refresh_from_db()
        return case

    before = static_case()
    assert before.status == CaseStatus.PLAN_FAILED
    method = _active(source, officer, second_officer)
    after = static_case()
    assert after.status == CaseStatus.AWAITING_APPROVAL
    assert _root(after).provenance["source"] == method.source


def test_the_active_promoted_methods_of_a_pack_load_in_one_query(
    fake_openai: FakeOpenAIServer,
    analyst: Any,
    officer: Any,
    second_officer: Any,
    django_assert_num_queries: Any,
) -> None:
    from planning.catalogue import registered_packs
    from planning.promotion.methods import library_for

    fake_openai.responder = model
    source = _executed(fake_openai, analyst, officer)
    for n in range(3):
        guard = [{"key": "kind", "op": "one-of", "value": [UNKNOWN_KIND, f"other-{n}"]}]
        _active(source, officer, second_officer, name=f"method-{n}", guard=guard)
    with django_assert_num_queries(1):
        library = library_for(registered_packs()["incident"])
    names = [m.name for m in library.methods_for("respond-to-incident")]
    assert names[:2] == ["database-outage-response", "security-breach-response"]
    assert names[2:] == [f"promoted:method-{n}@v1" for n in range(3)]
