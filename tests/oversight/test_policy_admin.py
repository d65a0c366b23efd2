"""Gating policy versions and reason codes through the actions and the admin's forms
(RELIABILITY R6, R10, O10)."""

from __future__ import annotations

import importlib
import threading
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.db.models.signals import post_migrate
from django.test import Client
from django.urls import reverse

from audit.chain import SYSTEM_CHAIN, verify_chain
from audit.models import AuditEvent
from oversight.actions.gate_policy import active_policy
from oversight.actions.gates import ReasonInvalid
from oversight.actions.policies import (
    PolicyConflict,
    PolicyDenied,
    PolicyInvalid,
    add_reason_code,
    approve_policy,
    change_reason_code,
    propose_policy,
    reject_policy,
)
from oversight.forms import PolicyProposalForm
from oversight.models import PolicyVersion, ReasonCode
from oversight.policy import PolicySettings
from tests import personas

pytestmark = pytest.mark.django_db

REVIEW = "threshold-review"
ADD_URL = reverse("admin:oversight_policyversion_add")
LIST_URL = reverse("admin:oversight_policyversion_changelist")


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=action).order_by("seq"))


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _status() -> dict[int, str]:
    return dict(PolicyVersion.objects.values_list("number", "status"))


def _form_data(settings: PolicySettings | None = None, **changes: Any) -> dict[str, Any]:
    """The POST body of the proposal form: what an admin sees prefilled, with their changes."""
    data: dict[str, Any] = PolicyProposalForm.initial_from(settings or active_policy()[1])
    data.update({"reason_code": REVIEW, "reason": "quarterly review"})
    data.update(changes)
    return data


# Through the actions -------------------------------------------------------------------------


def test_the_migration_seeds_one_active_default_version() -> None:
    version, settings = active_policy()
    assert (version.number, version.status) == (1, "active")
    assert settings == PolicySettings()


def test_a_stricter_change_is_active_at_once_and_audited_with_before_and_after() -> None:
    adam = personas.admin()
    version = propose_policy(adam, {"amount_threshold": "5000"}, REVIEW, "tighter")
    assert (version.number, version.status, version.loosens) == (2, "active", False)
    assert version.activated_at is not None
    assert _status() == {1: "superseded", 2: "active"}
    assert active_policy()[1].amount_threshold == Decimal("5000")
    (proposed,) = _events("oversight.policy.proposed")
    (activated,) = _events("oversight.policy.activated")
    for event in (proposed, activated):
        assert event.actor_user == adam
        assert event.data["before"]["amount_threshold"] == "10000"
        assert event.data["after"]["amount_threshold"] == "5000"
        assert event.data["loosening"] == []
        assert event.data["reason_code"] == REVIEW
        assert event.data["policy_version"] == 2
    assert activated.data["superseded"] == 1
    assert verify_chain(SYSTEM_CHAIN) == []


@pytest.mark.scenario("O10")
def test_a_looser_change_waits_for_a_second_admin_and_its_proposer_cannot_approve_it() -> None:
    adam, alice = personas.admin(), personas.admin("alice")
    version = propose_policy(adam, {"amount_threshold": "50000"}, REVIEW, "fewer gates")
    assert (version.status, version.loosens) == ("pending", True)
    assert _status() == {1: "active", 2: "pending"}
    assert active_policy()[1].amount_threshold == Decimal("10000")
    (proposed,) = _events("oversight.policy.proposed")
    assert proposed.data["loosening"] == ["amount threshold raised"]
    assert _events("oversight.policy.activated") == []

    with pytest.raises(PolicyDenied, match="a second admin must approve it"):
        approve_policy(adam, version)
    (denied,) = _events("oversight.policy.denied")
    assert denied.actor_user == adam
    assert denied.data["why"] == "you proposed this change; a second admin must approve it"
    assert _status() == {1: "active", 2: "pending"}

    approved = approve_policy(alice, version)
    assert (approved.status, approved.approved_by) == ("active", alice)
    assert _status() == {1: "superseded", 2: "active"}
    assert active_policy()[1].amount_threshold == Decimal("50000")
    (event,) = _events("oversight.policy.approved")
    assert event.actor_user == alice
    assert event.data["before"]["amount_threshold"] == "10000"
    assert event.data["after"]["amount_threshold"] == "50000"
    assert event.data["loosening"] == ["amount threshold raised"]
    assert event.data["proposed_by"] == "adam"
    assert len(_events("oversight.policy.activated")) == 1
    with pytest.raises(PolicyConflict, match="is active, not pending"):
        approve_policy(personas.admin("amir"), approved)


def test_a_pending_version_is_refused_once_a_newer_one_is_active() -> None:
    adam, alice = personas.admin(), personas.admin("alice")
    looser = propose_policy(adam, {"gate_hours": 48}, REVIEW)
    stricter = propose_policy(alice, {"trust_threshold": 0.7}, REVIEW)
    assert _status() == {1: "superseded", 2: "pending", 3: "active"}
    with pytest.raises(PolicyConflict, match="propose the change again"):
        approve_policy(alice, looser)
    assert _status() == {1: "superseded", 2: "pending", 3: "active"}
    assert active_policy()[0] == stricter


def test_a_rejected_version_never_takes_effect() -> None:
    adam, alice = personas.admin(), personas.admin("alice")
    version = propose_policy(adam, {"gated_risks": ["financial"]}, REVIEW)
    with pytest.raises(ReasonInvalid, match="a reason code is required"):
        reject_policy(alice, version, "", "no")
    rejected = reject_policy(alice, version, "other", "write steps must stay gated")
    assert rejected.status == "rejected"
    assert _status() == {1: "active", 2: "rejected"}
    (event,) = _events("oversight.policy.rejected")
    assert event.actor_user == alice
    assert event.data["rejection_reason_code"] == "other"
    assert event.data["loosening"] == ["destructive, external, write steps no longer gated"]
    with pytest.raises(PolicyConflict):
        approve_policy(alice, rejected)


def _reseed_oversight(**kwargs: Any) -> None:
    # The flush after a transactional test empties the rows migration 0003 seeds (policy
    # version 1, the reason codes); put them back as a fresh database has them, for the tests
    # that follow. (serialized_rollback cannot: it would rewrite the append-only audit rows.)
    seed = importlib.import_module("oversight.migrations.0003_gates_policy_notifications").seed
    seed(django_apps, None)


post_migrate.connect(
    _reseed_oversight,
    sender=django_apps.get_app_config("oversight"),
    weak=False,
    dispatch_uid="tests-oversight-reseed-policy",
)


@pytest.mark.django_db(transaction=True)
def test_two_admins_changing_the_policy_at_once_are_serialised() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    admins = [personas.admin(), personas.admin("alice")]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def propose(user: Any, values: dict[str, Any]) -> None:
        try:
            barrier.wait()
            propose_policy(user, values, REVIEW)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    changes = ({"amount_threshold": "9000"}, {"trust_threshold": 0.7})
    threads = [
        threading.Thread(target=propose, args=(user, values))
        for user, values in zip(admins, changes, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _status() == {1: "superseded", 2: "superseded", 3: "active"}
    # The second change was made on top of the first: neither is lost.
    settings = active_policy()[1]
    assert (settings.amount_threshold, settings.trust_threshold) == (Decimal("9000"), 0.7)
    (last,) = [e for e in _events("oversight.policy.activated") if e.data["policy_version"] == 3]
    assert last.data["base_version"] == 2


@pytest.mark.scenario("R6")
@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("", "a reason code is required to policy"),
        ("no-such-code", "unknown reason code 'no-such-code'"),
        ("duplicate", "reason code 'duplicate' does not apply to policy"),
    ],
)
def test_a_policy_change_needs_a_reason_code_for_policy(code: str, message: str) -> None:
    with pytest.raises(ReasonInvalid) as raised:
        propose_policy(personas.admin(), {"amount_threshold": "1"}, code, "why")
    assert raised.value.message == message
    assert _status() == {1: "active"}
    assert _events("oversight.policy.proposed") == []


def test_a_retired_reason_code_cannot_justify_a_change() -> None:
    adam = personas.admin()
    change_reason_code(adam, ReasonCode.objects.get(code=REVIEW), active=False)
    with pytest.raises(ReasonInvalid, match="unknown reason code"):
        propose_policy(adam, {"amount_threshold": "1"}, REVIEW)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"amount_threshold": "lots"}, "amount_threshold"),
        ({"trust_threshold": 2}, "trust_threshold"),
        ({"gated_risks": ["telepathy"]}, "gated_risks"),
        ({"requires_approval": False}, "requires_approval"),
        ({}, "values"),
        ({"amount_threshold": "10000"}, "values"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyInvalid) as raised:
        propose_policy(personas.admin(), values, REVIEW)
    assert raised.value.field == field
    assert _status() == {1: "active"}


@pytest.mark.scenario("O10")
@pytest.mark.parametrize("make", [personas.officer, personas.analyst, personas.auditor])
def test_only_admins_change_the_policy_and_each_refusal_is_audited(make: Any) -> None:
    user = make()
    with pytest.raises(PolicyDenied):
        propose_policy(user, {"amount_threshold": "1"}, REVIEW)
    version = propose_policy(personas.admin(), {"amount_threshold": "99999"}, REVIEW)
    with pytest.raises(PolicyDenied):
        approve_policy(user, version)
    with pytest.raises(PolicyDenied):
        reject_policy(user, version, REVIEW)
    with pytest.raises(PolicyDenied):
        add_reason_code(user, code="mine", label="Mine", applies_to=["policy"])
    assert _status() == {1: "active", 2: "pending"}
    steps = [e.data["step"] for e in _events("oversight.policy.denied")]
    assert steps == ["propose", "approve", "reject"]
    assert all(e.actor_user == user for e in _events("oversight.policy.denied"))
    assert len(_events("oversight.reason_code.denied")) == 1


def test_reason_codes_are_added_changed_and_retired_with_audit() -> None:
    adam = personas.admin()
    code = add_reason_code(adam, code="vendor-fraud", label="Vendor fraud", applies_to=["reject"])
    (added,) = _events("oversight.reason_code.added")
    assert added.data["after"] == {
        "code": "vendor-fraud",
        "label": "Vendor fraud",
        "applies_to": ["reject"],
        "active": True,
    }
    change_reason_code(adam, code, applies_to=["reject", "edit"], active=False)
    (changed,) = _events("oversight.reason_code.changed")
    assert changed.data["before"]["active"] is True
    assert changed.data["after"] == {
        "code": "vendor-fraud",
        "label": "Vendor fraud",
        "applies_to": ["edit", "reject"],
        "active": False,
    }
    # Nothing changed: nothing recorded.
    change_reason_code(adam, code, active=False)
    assert len(_events("oversight.reason_code.changed")) == 1
    for kwargs, field in (
        ({"code": "vendor-fraud", "label": "Again", "applies_to": ["reject"]}, "code"),
        ({"code": "not a slug", "label": "X", "applies_to": ["reject"]}, "code"),
        ({"code": "x", "label": " ", "applies_to": ["reject"]}, "label"),
        ({"code": "x", "label": "X", "applies_to": []}, "applies_to"),
        ({"code": "x", "label": "X", "applies_to": ["approve"]}, "applies_to"),
    ):
        with pytest.raises(PolicyInvalid) as raised:
            add_reason_code(adam, **kwargs)
        assert raised.value.field == field


# Through the admin's pages -------------------------------------------------------------------


def test_the_proposal_form_is_prefilled_from_the_active_version() -> None:
    adam, alice = personas.admin(), personas.admin("alice")
    keys = [*PolicySettings().amount_keys, "fee"]
    version = propose_policy(adam, {"amount_threshold": "2500", "amount_keys": keys}, REVIEW)
    assert version.status == "active"
    response = _client(alice).get(ADD_URL)
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert form.initial["amount_threshold"] == "2500"
    assert form.initial["amount_keys"] == "amount, total, value, price, cost, sum, limit, fee"
    body = response.content.decode()
    assert "Settings (prefilled from active version 2)" in body
    assert 'value="2500"' in body
    # Reason codes offered are those for policy changes.
    choices = [value for value, _ in form.fields["reason_code"].choices]
    assert REVIEW in choices and "other" in choices and "duplicate" not in choices


def test_a_stricter_change_through_the_admin_form_is_active_at_once() -> None:
    adam = personas.admin()
    response = _client(adam).post(
        ADD_URL,
        _form_data(
            amount_threshold="7500",
            gated_risks=["read", "write", "financial", "external", "destructive"],
            amount_keys="amount, total, value, price, cost, sum, limit, fee",
        ),
        follow=True,
    )
    assert response.status_code == 200
    assert "Policy version 2 is active" in response.content.decode()
    version, settings = active_policy()
    assert version.number == 2 and version.proposed_by == adam
    assert settings.amount_threshold == Decimal("7500")
    assert "read" in settings.gated_risks
    assert "fee" in settings.amount_keys
    (event,) = _events("oversight.policy.activated")
    assert event.data["before"]["gated_risks"] == ["write", "financial", "external", "destructive"]
    assert event.data["after"]["gated_risks"] == [
        "read",
        "write",
        "financial",
        "external",
        "destructive",
    ]


@pytest.mark.scenario("O10")
def test_a_looser_change_through_the_admin_needs_a_second_admin() -> None:
    adam, alice = personas.admin(), personas.admin("alice")
    response = _client(adam).post(
        ADD_URL, _form_data(trust_threshold="0.3", gated_risks=["financial"]), follow=True
    )
    body = response.content.decode()
    assert "Policy version 2 is pending" in body
    assert "trust threshold lowered" in body and "write" in body
    version = PolicyVersion.objects.get(number=2)
    assert version.loosens and version.status == "pending"
    # The version's page shows its settings as a table, next to the active values.
    page = _client(adam).get(reverse("admin:oversight_policyversion_change", args=[version.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert '<table class="policy-settings">' in text
    assert "<th>trust_threshold</th><td>0.3</td><td>0.6</td>" in text
    # The proposer's approval is refused with a message, and recorded.
    action = {"action": "approve_selected", "_selected_action": [version.pk]}
    response = _client(adam).post(LIST_URL, action, follow=True)
    assert "you proposed this change; a second admin must approve it" in response.content.decode()
    assert PolicyVersion.objects.get(number=2).status == "pending"
    assert len(_events("oversight.policy.denied")) == 1
    # A second admin approves it.
    response = _client(alice).post(LIST_URL, action, follow=True)
    assert "Version 2 approved: it is active." in response.content.decode()
    assert _status() == {1: "superseded", 2: "active"}
    assert active_policy()[1].trust_threshold == 0.3


def test_rejecting_through_the_admin_needs_a_reason_code() -> None:
    adam, alice = personas.admin(), personas.admin("alice")
    version = propose_policy(adam, {"approver_group": "friends of adam"}, REVIEW)
    action = {"action": "reject_selected", "_selected_action": [version.pk]}
    response = _client(alice).post(LIST_URL, action, follow=True)
    assert "a reason code is required to policy" in response.content.decode()
    assert PolicyVersion.objects.get(pk=version.pk).status == "pending"
    response = _client(alice).post(
        LIST_URL, action | {"reason_code": "other", "reason": "who are they?"}, follow=True
    )
    assert "Version 2 rejected." in response.content.decode()
    assert PolicyVersion.objects.get(pk=version.pk).status == "rejected"


def test_the_admin_form_refuses_no_reason_code_and_bad_values_naming_the_field() -> None:
    adam = personas.admin()
    client = _client(adam)
    response = client.post(ADD_URL, _form_data(reason_code="", amount_threshold="5"))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["reason_code"] == ["This field is required."]
    response = client.post(ADD_URL, _form_data(gate_hours="0", amount_keys=" , "))
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"gate_hours", "amount_keys"}
    response = client.post(ADD_URL, _form_data())
    assert response.context["adminform"].form.non_field_errors() == [
        "the proposal changes nothing in the active policy"
    ]
    assert _status() == {1: "active"}


def test_versions_cannot_be_edited_or_deleted_in_the_admin() -> None:
    adam = personas.admin()
    client = _client(adam)
    version = PolicyVersion.objects.get(number=1)
    url = reverse("admin:oversight_policyversion_change", args=[version.pk])
    assert client.post(url, {"status": "superseded"}).status_code == 403
    delete = reverse("admin:oversight_policyversion_delete", args=[version.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert PolicyVersion.objects.get(pk=version.pk).status == "active"
    listing = client.get(LIST_URL).content.decode()
    assert "delete_selected" not in listing


@pytest.mark.parametrize("make", [personas.officer, personas.analyst, personas.auditor])
def test_officers_analysts_and_auditors_cannot_open_the_policy_admin(make: Any) -> None:
    user = make()
    user.is_staff = True  # even with admin-site access, the policy is not theirs
    user.save(update_fields=["is_staff"])
    client = _client(user)
    assert client.get(LIST_URL).status_code == 403
    assert client.get(ADD_URL).status_code == 403
    assert client.post(ADD_URL, _form_data(amount_threshold="1")).status_code == 403
    assert client.get(reverse("admin:oversight_reasoncode_changelist")).status_code == 403
    assert _status() == {1: "active"}


def test_reason_codes_are_added_and_retired_in_the_admin_never_deleted() -> None:
    adam = personas.admin()
    client = _client(adam)
    add = reverse("admin:oversight_reasoncode_add")
    response = client.post(
        add,
        {"code": "sla-change", "label": "SLA change", "applies_to": ["policy"], "active": "on"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    code = ReasonCode.objects.get(code="sla-change")
    assert code.applies_to == ["policy"]
    change = reverse("admin:oversight_reasoncode_change", args=[code.pk])
    response = client.post(
        change, {"code": "renamed", "label": "SLA change", "applies_to": ["policy", "edit"]}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    code.refresh_from_db()
    assert (code.code, code.active, sorted(code.applies_to)) == (
        "sla-change",
        False,
        ["edit", "policy"],
    )
    (added,) = _events("oversight.reason_code.added")
    (changed,) = _events("oversight.reason_code.changed")
    assert added.actor_user == changed.actor_user == adam
    assert changed.data["before"]["active"] is True and changed.data["after"]["active"] is False
    delete = reverse("admin:oversight_reasoncode_delete", args=[code.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ReasonCode.objects.filter(code="sla-change").exists()


def test_a_versions_settings_are_built_once_and_anew_when_its_stored_values_differ() -> None:
    """Every claim reads the active version's values; their settings are built once for them."""
    from oversight.actions.gate_policy import policy_settings

    values: dict[str, Any] = {"trust_threshold": 0.7, "gated_risks": ["write"]}
    first = policy_settings(9001, values)
    assert first.trust_threshold == 0.7
    assert policy_settings(9001, {"trust_threshold": 0.7, "gated_risks": ["write"]}) is first
    values["trust_threshold"] = 0.9  # the caller's dict changes: the settings kept do not
    assert first.trust_threshold == 0.7
    assert policy_settings(9001, values).trust_threshold == 0.9
    assert policy_settings(9002, {"trust_threshold": 0.8}).trust_threshold == 0.8
    # an unreadable version gets the safe defaults, never the settings last built
    assert policy_settings(9003, {"trust_threshold": "high"}) == PolicySettings()
