"""Plan edits through the action and the API: new versions, void and carried gates, the diff,
refusals that change nothing (RELIABILITY R2, R6, R9, O2, O7, W4)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts import roles
from accounts import tokens as api_tokens
from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from oversight.actions import gates, opening
from oversight.actions.edits import EditInvalid, EditRefused, edit_plan
from oversight.actions.gates import DecisionDenied, DecisionInput, ReasonInvalid
from oversight.models import Gate, GateKind, GateStatus, Notification
from oversight.queries import inbox_for
from planning.actions import materialise_plan, submit_case
from planning.core.dag import DagPlan
from planning.core.tree import Compound, Leaf, Provenance
from planning.models import Agent, Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from planning.versions import store_version
from tests import personas
from tests.planning.factories import make_case, make_plan

pytestmark = pytest.mark.django_db

APPROVE = DecisionInput(decision="approve")
SIGNED_APPROVE = DecisionInput(decision="approve", password=personas.PASSWORD)


@pytest.fixture
def people() -> dict[str, Any]:
    return {
        "analyst": personas.analyst(),
        "officer": personas.officer(),
        "second": personas.second_officer(),
    }


@pytest.fixture
def case(people: dict[str, Any]) -> Case:
    """A static invoice case planned as version 1: a plan gate and a step gate for the hold."""
    case = submit_case(
        submitter=people["analyst"],
        title="Verify INV-1042",
        goal="Verify invoice INV-1042",
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    return case


@pytest.fixture
def second_auditor() -> Agent:
    """Another agent allowed to run check_totals, so a step can move to it."""
    return Agent.objects.create(
        slug="second-auditor",
        name="Second auditor",
        kind=Agent.Kind.TOOL,
        tools=["check_totals"],
        trust=0.9,
    )


def _gate(version: PlanVersion, kind: str = GateKind.PLAN, key: str | None = None) -> Gate:
    found = Gate.objects.filter(version=version, kind=kind)
    if key is not None:
        found = found.filter(node__key=key)
    return found.get()


def _events(case: Case, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=case_chain(case.pk), action=action))


def _edit(case: Case, user: Any, node: str, changes: dict[str, Any], **extra: Any) -> Any:
    values: dict[str, Any] = {"reason_code": "wrong-agent", "reason": "wrong agent for it"}
    values.update(extra)
    return edit_plan(case_id=case.pk, user=user, node_key=node, changes=changes, **values)


def _api(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


def _post_edit(client: Client, case: Case, body: dict[str, Any]) -> Any:
    return client.post(f"/api/cases/{case.pk}/plan/edits", body, content_type="application/json")


def _snapshot(case: Case) -> tuple[Any, ...]:
    """What a refused edit must leave alone: versions, gates, the case and its audit chain."""
    case.refresh_from_db()
    return (
        list(PlanVersion.objects.filter(case=case).values_list("number", "content_hash")),
        list(Gate.objects.filter(case=case).order_by("pk").values_list("pk", "status")),
        case.status,
        case.current_version_id,
        AuditEvent.objects.filter(chain=case_chain(case.pk)).count(),
    )


# An edit makes a new version ---------------------------------------------------------------


@pytest.mark.scenario("R2")
def test_an_edited_agent_makes_version_2_voids_open_gates_and_carries_unchanged_approvals(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    v1 = case.current_version
    assert v1 is not None
    hold = _gate(v1, GateKind.STEP, "place-hold")
    gates.decide_gate(gate_id=hold.pk, user=people["second"], decision=SIGNED_APPROVE)

    result = _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"})

    case.refresh_from_db()
    v2 = result.version
    assert (v2.number, case.current_version_id, case.status) == (
        2,
        v2.pk,
        CaseStatus.AWAITING_APPROVAL,
    )
    assert v2.edited_by == people["officer"]
    assert v2.edit == {
        "node": "check-totals",
        "changes": {"agent": "second-auditor"},
        "reason_code": "wrong-agent",
        "reason": "wrong agent for it",
        "from_version": 1,
    }
    assert [
        (c.key, [(f.field, f.before, f.after) for f in c.fields]) for c in result.diff.changed
    ] == [("check-totals", [("agent", "payments-auditor", "second-auditor")])]
    assert result.diff.added == result.diff.removed == result.diff.dependencies == ()
    # The old version's pending plan gate is void; the new version has a pending one of its own.
    assert _gate(v1).status == GateStatus.VOID
    assert _gate(v2).status == GateStatus.PENDING
    # The hold was approved and the edit did not change it: the approval carries.
    carried = _gate(v2, GateKind.STEP, "place-hold")
    assert carried.status == GateStatus.APPROVED
    assert carried.carried_from_id == hold.pk
    assert PlanNode.objects.get(version=v2, key="check-totals").agent == "second-auditor"
    assert PlanNode.objects.get(version=v2, key="check-totals").provenance["source"] == (
        "edit by olivia"
    )
    assert PlanNode.objects.filter(version=v1, key="check-totals").get().agent == (
        "payments-auditor"
    )
    (event,) = _events(case, "planning.plan.edited")
    assert event.actor_user == people["officer"]
    assert event.data["before"]["node"]["agent"] == "payments-auditor"
    assert event.data["after"]["node"]["agent"] == "second-auditor"
    assert event.data["diff"] == result.diff.as_data()
    assert event.data["reason_code"] == "wrong-agent"
    assert verify_chain(case_chain(case.pk)) == []


@pytest.mark.scenario("R2")
def test_the_approval_of_a_changed_step_is_void_and_its_new_gate_pending(
    case: Case, people: dict[str, Any]
) -> None:
    v1 = case.current_version
    assert v1 is not None
    hold = _gate(v1, GateKind.STEP, "place-hold")
    gates.decide_gate(gate_id=hold.pk, user=people["second"], decision=SIGNED_APPROVE)

    v2 = _edit(
        case, people["officer"], "place-hold", {"task": "Hold the payment until Friday"},
        reason_code="incomplete",
    ).version  # fmt: skip

    step = _gate(v2, GateKind.STEP, "place-hold")
    assert step.status == GateStatus.PENDING
    assert step.carried_from_id is None
    assert step.approvals == 0
    assert PlanNode.objects.get(version=v2, key="place-hold").status == (
        NodeStatus.AWAITING_APPROVAL
    )


@pytest.mark.scenario("O2", "R2")
def test_the_editor_cannot_approve_their_version_and_a_second_officer_can(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    v2 = _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}).version
    plan_gate = _gate(v2)
    with pytest.raises(DecisionDenied, match="editor"):
        gates.decide_gate(gate_id=plan_gate.pk, user=people["officer"], decision=APPROVE)
    assert _events(case, "oversight.gate.decision_denied")
    # The old version's gate is void: nobody approves it any more.
    old = _gate(case.versions.get(number=1))
    with pytest.raises(gates.GateConflict):
        gates.decide_gate(gate_id=old.pk, user=people["second"], decision=APPROVE)
    gates.decide_gate(gate_id=plan_gate.pk, user=people["second"], decision=APPROVE)
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING  # approved, and its first steps are ready


@pytest.mark.scenario("S5")
def test_the_editors_own_approval_of_a_step_does_not_count_in_the_version_they_made(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    v1 = case.current_version
    assert v1 is not None
    hold = _gate(v1, GateKind.STEP, "place-hold")
    gates.decide_gate(gate_id=hold.pk, user=people["officer"], decision=SIGNED_APPROVE)
    assert _gate(v1, GateKind.STEP, "place-hold").status == GateStatus.APPROVED

    # The officer who approved the hold edits another step of the same version.
    v2 = _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}).version

    step = _gate(v2, GateKind.STEP, "place-hold")
    assert step.status == GateStatus.PENDING
    assert step.carried_from_id is None
    assert step.approvals == 0
    assert PlanNode.objects.get(version=v2, key="place-hold").status == (
        NodeStatus.AWAITING_APPROVAL
    )
    (opened,) = [e for e in _events(case, "oversight.gate.opened") if e.data["gate"] == step.pk]
    assert opened.data["status"] == GateStatus.PENDING
    # The gate re-opens for someone else: the editor may not decide it, another officer may.
    with pytest.raises(DecisionDenied, match="editor"):
        gates.decide_gate(gate_id=step.pk, user=people["officer"], decision=SIGNED_APPROVE)
    gates.decide_gate(gate_id=step.pk, user=people["second"], decision=SIGNED_APPROVE)
    assert _gate(v2, GateKind.STEP, "place-hold").status == GateStatus.APPROVED


@pytest.mark.scenario("S5")
def test_an_approval_carried_through_an_earlier_edit_does_not_count_once_its_officer_edits(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    v1 = case.current_version
    assert v1 is not None
    hold = _gate(v1, GateKind.STEP, "place-hold")
    gates.decide_gate(gate_id=hold.pk, user=people["officer"], decision=SIGNED_APPROVE)
    # Another officer's edit carries the approval (the approver did not make version 2) ...
    v2 = _edit(case, people["second"], "check-totals", {"agent": "second-auditor"}).version
    assert _gate(v2, GateKind.STEP, "place-hold").carried_from_id == hold.pk
    # ... but once the approver edits version 2, their approval does not count in version 3.
    v3 = _edit(
        case,
        people["officer"],
        "check-duplicate",
        {"task": "Look for a duplicate payment"},
        reason_code="incomplete",
    ).version
    step = _gate(v3, GateKind.STEP, "place-hold")
    assert (step.status, step.approvals, step.carried_from_id) == (GateStatus.PENDING, 0, None)


def test_a_removed_step_is_gone_from_the_new_version_and_its_gate_void(
    case: Case, people: dict[str, Any]
) -> None:
    v1 = case.current_version
    assert v1 is not None
    result = _edit(case, people["officer"], "place-hold", {"remove": True}, reason_code="other")
    assert result.diff.removed == ("place-hold",)
    assert result.version.leaf_count == v1.leaf_count - 1
    assert not PlanNode.objects.filter(version=result.version, key="place-hold").exists()
    assert _gate(v1, GateKind.STEP, "place-hold").status == GateStatus.VOID
    assert not Gate.objects.filter(version=result.version, kind=GateKind.STEP).exists()
    (event,) = _events(case, "planning.plan.edited")
    assert event.data["after"]["node"] is None


def test_a_new_dependency_shows_in_the_diff(case: Case, people: dict[str, Any]) -> None:
    result = _edit(
        case, people["officer"], "check-po", {"depends_on": ["check-totals"]}, reason_code="other"
    )
    (moved,) = result.diff.dependencies
    assert (moved.key, moved.before, moved.after) == (
        "check-po",
        ("lookup-supplier",),
        ("check-totals",),
    )
    assert PlanNode.objects.get(version=result.version, key="check-po").depends_on == [
        "check-totals"
    ]


SECOND_HOLD = {
    "key": "second-hold",
    "agent": "payments-clerk",
    "tool": "place_payment_hold",
    "task": "Place a second hold, for the second finding",
    "inputs": {"report": {"$ref": "audit-report"}},
    "depends_on": ["place-hold"],
}


def test_an_added_step_comes_after_its_step_with_a_gate_of_its_own(
    case: Case, people: dict[str, Any]
) -> None:
    v1 = case.current_version
    assert v1 is not None
    result = _edit(case, people["officer"], "place-hold", {"add": SECOND_HOLD}, reason_code="other")
    assert result.diff.added == ("second-hold",) and not result.diff.changed
    nodes = {n.key: n for n in PlanNode.objects.filter(version=result.version)}
    added, hold = nodes["second-hold"], nodes["place-hold"]
    assert added.parent_id == hold.parent_id and added.position == hold.position + 1
    assert (added.agent, added.tool, added.depends_on) == (
        "payments-clerk",
        "place_payment_hold",
        ["place-hold"],
    )
    assert added.provenance["source"] == "edit by olivia"
    # A financial step: its own gate, a signature, pending.
    gate = _gate(result.version, GateKind.STEP, "second-hold")
    assert gate.status == GateStatus.PENDING and gate.needs_signature
    assert _gate(v1).status == GateStatus.VOID
    (event,) = _events(case, "planning.plan.edited")
    assert event.data["changes"] == {"add": SECOND_HOLD}
    assert event.data["before"]["node"] is None
    assert event.data["after"]["node"]["key"] == "second-hold"


@pytest.mark.parametrize(
    ("step", "field", "message"),
    [
        ({"key": "audit-report"}, "changes.add.key", "already has a step audit-report"),
        ({"key": "Second Hold"}, "changes.add.key", "lower-case letters"),
        ({"agent": "erp-connector"}, "changes.add.agent", "erp-connector cannot run tool"),
        ({"agent": "ghost"}, "changes.add.agent", "there is no agent “ghost”"),
        (
            {"inputs": {}},
            "changes.add.inputs",
            "not fit tool place_payment_hold: “report” is missing",
        ),
        ({"depends_on": ["check-po"]}, "changes.add.inputs", "does not run before it"),
        ({"task": ""}, "changes.add.task", "must not be empty"),
        ({"colour": "red"}, "changes.add", "a new step has no colour"),
    ],
)
def test_an_added_step_that_cannot_run_is_refused_in_words_and_changes_nothing(
    case: Case, people: dict[str, Any], step: dict[str, Any], field: str, message: str
) -> None:
    before = _snapshot(case)
    with pytest.raises(EditInvalid) as refused:
        _edit(case, people["officer"], "place-hold", {"add": SECOND_HOLD | step})
    assert refused.value.field == field
    assert message in refused.value.message
    assert "'" not in refused.value.message.replace("it's", "")
    assert _snapshot(case) == before


# Refusals change nothing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "changes", "field", "message"),
    [
        (
            "extract-fields",
            {"depends_on": ["audit-report"]},
            "changes.depends_on",
            "in a circle: extract-fields",
        ),
        ("check-totals", {"agent": "ghost"}, "changes.agent", "there is no agent “ghost”"),
        (
            "check-totals",
            {"agent": "erp-connector"},
            "changes.agent",
            "erp-connector cannot run tool",
        ),
        (
            "check-totals",
            {"inputs": {}},
            "changes.inputs",
            "do not fit tool check_totals: “invoice” is missing.",
        ),
        ("check-totals", {"inputs": {"invoice": 7}}, "changes.inputs", "“invoice”: input should"),
        ("check-po", {"remove": True}, "changes.remove", "which does not run before it"),
        (
            "check-totals",
            {"task": "Recompute", "inputs": {"invoice": 7}},
            "changes.inputs",
            "Step check-totals: the inputs do not fit tool check_totals",
        ),
        ("verify-invoice", {"task": "Do it all"}, "node", "only steps"),
        ("no-such-step", {"task": "x"}, "node", "no step 'no-such-step'"),
        ("check-totals", {"tool": "freeze_account"}, "changes", "cannot change tool"),
        ("check-totals", {}, "changes", "at least one change"),
        ("check-totals", {"task": "  "}, "changes.task", "empty"),
        ("check-totals", {"agent": "payments-auditor"}, "changes.agent", "changes nothing"),
    ],
)
def test_an_invalid_edit_is_refused_naming_the_field_and_changes_nothing(
    case: Case, people: dict[str, Any], node: str, changes: dict[str, Any], field: str, message: str
) -> None:
    before = _snapshot(case)
    with pytest.raises(EditInvalid) as refused:
        _edit(case, people["officer"], node, changes)
    assert refused.value.field == field
    assert message in refused.value.message
    assert _snapshot(case) == before


@pytest.mark.scenario("O7")
@pytest.mark.parametrize(
    ("reason_code", "message"),
    [("", "required"), ("made-up", "unknown reason code"), ("duplicate", "does not apply")],
)
def test_an_edit_without_a_valid_reason_code_is_refused_and_nothing_recorded(
    case: Case, people: dict[str, Any], second_auditor: Agent, reason_code: str, message: str
) -> None:
    before = _snapshot(case)
    with pytest.raises(ReasonInvalid, match=message) as refused:
        _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"},
              reason_code=reason_code)  # fmt: skip
    assert refused.value.field == "reason_code"
    assert _snapshot(case) == before
    response = _post_edit(
        _api(people["officer"]),
        case,
        {
            "node": "check-totals",
            "changes": {"agent": "second-auditor"},
            "reason_code": reason_code,
        },
    )
    assert response.status_code == 422
    assert list(response.json()["fields"]) == ["reason_code"]
    assert _snapshot(case) == before


@pytest.mark.scenario("O7", "R6")
def test_an_edit_with_the_reason_code_other_needs_its_text(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    before = _snapshot(case)
    with pytest.raises(ReasonInvalid, match="needs the reason in words") as refused:
        _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"},
              reason_code="other", reason="  ")  # fmt: skip
    assert refused.value.field == "reason"
    body = {"node": "check-totals", "changes": {"agent": "second-auditor"}, "reason_code": "other"}
    response = _post_edit(_api(people["officer"]), case, body)
    assert response.status_code == 422
    assert list(response.json()["fields"]) == ["reason"]
    assert _snapshot(case) == before
    done = _post_edit(_api(people["officer"]), case, {**body, "reason": "the second auditor"})
    assert done.status_code == 201, done.content


def test_an_edit_of_a_stale_version_is_refused(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}, base_version=1)
    before = _snapshot(case)
    with pytest.raises(EditRefused, match="version 2, not 1"):
        _edit(case, people["officer"], "check-totals", {"task": "Again"}, base_version=1)
    assert _snapshot(case) == before


def test_a_plan_no_longer_awaiting_approval_is_not_edited(
    case: Case, people: dict[str, Any]
) -> None:
    assert case.current_version is not None
    gates.decide_gate(
        gate_id=_gate(case.current_version).pk, user=people["second"], decision=APPROVE
    )
    before = _snapshot(case)
    with pytest.raises(EditRefused, match="executing: only a plan awaiting approval"):
        _edit(case, people["officer"], "check-totals", {"task": "Later"})
    assert _snapshot(case) == before


@pytest.mark.parametrize("who", ["analyst", "admin", "auditor"])
def test_only_officers_who_did_not_submit_the_case_edit_it_and_refusals_are_audited(
    case: Case, people: dict[str, Any], who: str
) -> None:
    user = {
        "analyst": people["analyst"],
        "admin": personas.admin(),
        "auditor": personas.auditor(),
    }[who]
    versions = case.versions.count()
    with pytest.raises(DecisionDenied):
        _edit(case, user, "check-totals", {"task": "Mine now"})
    assert case.versions.count() == versions
    (denied,) = _events(case, "oversight.plan.edit_denied")
    assert denied.actor_user == user
    assert denied.data["node"] == "check-totals"


# The API -----------------------------------------------------------------------------------


def test_an_edit_through_the_api_answers_201_with_the_version_and_its_diff(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    response = _post_edit(
        _api(people["officer"]),
        case,
        {
            "node": "check-totals",
            "changes": {"agent": "second-auditor"},
            "reason_code": "wrong-agent",
            "reason": "the second auditor knows this supplier",
            "base_version": 1,
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    v2 = case.versions.get(number=2)
    assert body == {
        "case": case.pk,
        "version": 2,
        "content_hash": v2.content_hash,
        "diff": {
            "added": [],
            "removed": [],
            "changed": [
                {
                    "node": "check-totals",
                    "fields": [
                        {"field": "agent", "before": "payments-auditor", "after": "second-auditor"}
                    ],
                }
            ],
            "dependencies": [],
        },
    }


@pytest.mark.parametrize(
    ("body", "status", "fields"),
    [
        ({"node": "extract-fields", "changes": {"depends_on": ["audit-report"]}}, 422,
         ["changes.depends_on"]),
        ({"node": "check-totals", "changes": {"agent": "ghost"}}, 422, ["changes.agent"]),
        ({"node": "nope", "changes": {"task": "x"}}, 422, ["node"]),
        ({"node": "check-totals", "changes": {"tool": "freeze_account"}}, 422, ["changes.tool"]),
        ({"node": "check-totals", "changes": {"remove": "yes"}}, 422, ["changes.remove"]),
        ({"node": "check-totals", "changes": {"task": "x"}, "base_version": 7}, 409, None),
    ],
)  # fmt: skip
def test_refused_edits_through_the_api(
    case: Case, people: dict[str, Any], body: dict[str, Any], status: int, fields: Any
) -> None:
    before = _snapshot(case)
    body = {"reason_code": "other", "reason": "see the step", **body}
    response = _post_edit(_api(people["officer"]), case, body)
    assert response.status_code == status, response.content
    if fields is not None:
        assert list(response.json()["fields"]) == fields
    assert _snapshot(case) == before


def test_the_submitter_gets_403_and_an_admin_too(case: Case, people: dict[str, Any]) -> None:
    body = {"node": "check-totals", "changes": {"task": "x"}, "reason_code": "other", "reason": "x"}
    assert _post_edit(_api(people["analyst"]), case, body).status_code == 403
    # Admins see no cases at all: the same 404 as for a case that does not exist.
    assert _post_edit(_api(personas.admin()), case, body).status_code == 404


@pytest.mark.scenario("W4")
@pytest.mark.parametrize("suffix", ["/plan", "/plan?version=1", "/plan/diff?from=1&to=1"])
def test_another_analysts_case_is_404_for_plans_diffs_and_edits(case: Case, suffix: str) -> None:
    other = _api(personas.analyst("bob"))
    response = other.get(f"/api/cases/{case.pk}{suffix}")
    assert response.status_code == 404
    assert response.json() == {"message": "No such case"}
    body = {"node": "check-totals", "changes": {"task": "x"}, "reason_code": "other", "reason": "x"}
    edit = _post_edit(other, case, body)
    assert edit.status_code == 404
    assert edit.json() == {"message": "No such case"}
    assert case.versions.count() == 1


def test_the_plan_reads_any_version_with_each_nodes_latest_gate(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    v1 = case.current_version
    assert v1 is not None
    v2 = _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}).version
    client = _api(people["analyst"])

    old = client.get(f"/api/cases/{case.pk}/plan?version=1").json()
    assert (old["version"], old["content_hash"], old["edited_by"], old["edit"]) == (
        1,
        v1.content_hash,
        None,
        None,
    )
    nodes = {n["id"]: n for n in old["nodes"]}
    assert nodes["check-totals"]["agent"] == "payments-auditor"
    hold_v1 = _gate(v1, GateKind.STEP, "place-hold")
    assert nodes["place-hold"]["gate"] == {"id": hold_v1.pk, "kind": "step", "status": "void"}
    assert nodes["extract-fields"]["gate"] is None
    assert old["gate"] == {"id": _gate(v1).pk, "kind": "plan", "status": "void"}

    current = client.get(f"/api/cases/{case.pk}/plan").json()
    assert current["version"] == 2
    assert current["edited_by"] == "olivia"
    assert current["edit"]["node"] == "check-totals"
    assert current["gate"] == {"id": _gate(v2).pk, "kind": "plan", "status": "pending"}
    nodes = {n["id"]: n for n in current["nodes"]}
    assert nodes["check-totals"]["agent"] == "second-auditor"
    assert nodes["place-hold"]["gate"]["status"] == "pending"
    assert client.get(f"/api/cases/{case.pk}/plan?version=3").status_code == 404
    assert client.get(f"/api/cases/{case.pk}/plan?version=0").status_code == 422


def test_the_diff_endpoint_compares_two_versions(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"})
    _edit(case, people["officer"], "place-hold", {"remove": True}, reason_code="other")
    client = _api(people["analyst"])

    latest = client.get(f"/api/cases/{case.pk}/plan/diff").json()
    assert (latest["from_version"], latest["to_version"]) == (2, 3)
    assert latest["removed"] == ["place-hold"]
    assert latest["changed"] == []

    whole = client.get(f"/api/cases/{case.pk}/plan/diff?from=1&to=3").json()
    assert whole["removed"] == ["place-hold"]
    assert [c["node"] for c in whole["changed"]] == ["check-totals"]
    assert whole["from_content_hash"] == case.versions.get(number=1).content_hash

    back = client.get(f"/api/cases/{case.pk}/plan/diff?from=3&to=1").json()
    assert back["added"] == ["place-hold"]
    assert client.get(f"/api/cases/{case.pk}/plan/diff?to=1").status_code == 404
    assert client.get(f"/api/cases/{case.pk}/plan/diff?from=9").status_code == 404


def test_the_plan_with_gates_runs_the_same_queries_for_5_and_50_leaves(
    django_assert_num_queries: Any,
) -> None:
    ana = personas.analyst()
    client = _api(ana)
    counts = []
    for leaves in (5, 50):
        case = make_case(ana)
        version = make_plan(case, leaves=leaves, groups=3)
        opening.open_gates(version)
        Gate.objects.bulk_create(
            [
                Gate(
                    **{
                        f.name: getattr(_gate(version), f.name)
                        for f in Gate._meta.concrete_fields
                        if f.name not in {"id", "node", "kind"}
                    },
                    node=node,
                    kind=GateKind.STEP,
                )
                for node in PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF)
            ]
        )
        url = f"/api/cases/{case.pk}/plan"
        client.get(url)  # the first use of a token records last_used_at
        with CaptureQueriesContext(connection) as queries:
            body = client.get(url).json()
        assert all(n["gate"] is not None for n in body["nodes"] if n["kind"] == "leaf")
        assert len(body["nodes"]) == 1 + 3 + leaves
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1]
    with django_assert_num_queries(counts[0]):
        client.get(url)


def test_removing_the_only_step_of_a_group_is_refused(people: dict[str, Any]) -> None:
    provenance = Provenance(strategy="static", source="test", depth=1)
    only = Leaf(key="only", agent="ap-reviewer", task="Review it", provenance=provenance)
    other = Leaf(key="other", agent="ap-reviewer", task="Review more", provenance=provenance)
    group = Compound(key="group", name="Group", children=(only,), provenance=provenance)
    root = Compound(key="root", name="Root", children=(group, other), provenance=provenance)
    case = make_case(people["analyst"])
    version = store_version(case, DagPlan.build(root))
    Case.objects.filter(pk=case.pk).update(current_version=version)
    opening.open_gates(version)
    before = _snapshot(case)
    with pytest.raises(EditInvalid, match="cannot be left empty") as refused:
        _edit(case, people["officer"], "only", {"remove": True})
    assert refused.value.field == "changes.remove"
    assert _snapshot(case) == before
    # The other step can go: the group keeps its step.
    assert _edit(case, people["officer"], "other", {"remove": True}).diff.removed == ("other",)


@pytest.mark.scenario("O2")
def test_an_editor_cannot_approve_a_later_version_that_still_holds_their_edit(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"})
    v3 = _edit(
        case,
        people["second"],
        "check-duplicate",
        {"task": "Look for a duplicate payment"},
        reason_code="incomplete",
    ).version
    third = personas.make_user("tess", roles.OFFICER)
    for editor in (people["officer"], people["second"]):
        with pytest.raises(DecisionDenied, match="editor"):
            gates.decide_gate(gate_id=_gate(v3).pk, user=editor, decision=APPROVE)
        assert not inbox_for(editor).filter(version=v3).exists()
    assert inbox_for(third).filter(version=v3).exists()
    gates.decide_gate(gate_id=_gate(v3).pk, user=third, decision=APPROVE)


def test_the_editor_is_not_told_that_the_new_versions_gates_wait_for_them(
    case: Case, people: dict[str, Any], second_auditor: Agent
) -> None:
    v2 = _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}).version
    told = Notification.objects.filter(gate__version=v2, kind="gate.opened")
    assert set(told.values_list("user__username", flat=True)) == {people["second"].username}
