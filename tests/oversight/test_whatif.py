"""The policy what-if (#24): the pure comparison, the replay task and its report, who may run and
read it, and the pages that show it."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from audit.chain import SYSTEM_CHAIN
from audit.models import AuditEvent
from oversight.actions.policies import PolicyConflict, PolicyDenied, PolicyInvalid, propose_policy
from oversight.actions.whatif import request_whatif, run_whatif
from oversight.models import Gate, GateKind, PolicyVersion, PolicyWhatIf
from oversight.policy import RISK_CLASSES, LeafFacts, PolicySettings, classify
from oversight.whatif import (
    AUTONOMOUS,
    CHANGES,
    GATE,
    GATED,
    RECLASSIFIED,
    SIGNATURE,
    TO_SIGNATURE,
    UNCHANGED,
    UNGATED,
    WhatIfTally,
    change_kind,
    compare_leaf,
    compare_plan,
    step_class,
)
from planning.models import PlanNode, PlanVersion
from tests import personas
from tests.cases import planned_invoice_case

REVIEW = "threshold-review"
# Financial steps (the payment hold) no longer gated: a loosening, so it waits for a second admin.
LOOSER = {
    "gated_risks": ["write", "external", "destructive"],
    "signature_risks": ["external", "destructive"],
}


def _leaf(**facts: Any) -> LeafFacts:
    base: dict[str, Any] = {"key": "step", "agent": "clerk", "agent_trust": 0.9}
    return LeafFacts(**(base | facts))


# The pure comparison -------------------------------------------------------------------------


def test_each_change_kind_is_told_apart() -> None:
    active = PolicySettings()
    read = _leaf(tool="lookup", tool_risk="read")
    write = _leaf(tool="post_note", tool_risk="write")
    pay = _leaf(tool="place_payment_hold", tool_risk="financial")
    amount = _leaf(tool="post_note", tool_risk="write", inputs={"amount": "50000"})

    only_financial = PolicySettings(gated_risks=("financial",))
    assert compare_leaf(write, active, only_financial).change == UNGATED
    assert compare_leaf(write, only_financial, active).change == GATED
    assert compare_leaf(read, active, PolicySettings(gated_risks=("read",))).change == GATED

    write_signed = PolicySettings(signature_risks=("write", "financial", "external", "destructive"))
    outcome = compare_leaf(write, active, write_signed)
    assert (outcome.before, outcome.after, outcome.change) == (GATE, SIGNATURE, TO_SIGNATURE)
    # The other way round the step stays gated, on other terms: no signature any more.
    assert compare_leaf(write, write_signed, active).change == RECLASSIFIED
    # Gated by the amount too under a lower threshold: still a gate, by more classifiers.
    lower = PolicySettings(amount_threshold=Decimal("100"), amount_quorum_threshold=Decimal("1000"))
    assert compare_leaf(amount, active, lower).change == RECLASSIFIED  # quorum 1 → 2
    assert compare_leaf(pay, active, active).change == UNCHANGED
    assert compare_leaf(pay, active, active).before == SIGNATURE


def test_a_new_group_reclassifies_every_gated_step_and_no_other() -> None:
    active = PolicySettings()
    moved = PolicySettings(approver_group="treasury")
    gated = _leaf(tool="post_note", tool_risk="write")
    free = _leaf(tool="lookup", tool_risk="read")
    assert compare_leaf(gated, active, moved).change == RECLASSIFIED
    assert compare_leaf(free, active, moved).change == UNCHANGED


facts_strategy = st.builds(
    LeafFacts,
    key=st.text(min_size=1, max_size=8),
    agent=st.sampled_from(["clerk", "auditor", "ghost"]),
    tool=st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    tool_risk=st.one_of(st.none(), st.sampled_from(RISK_CLASSES)),
    declared_risk=st.one_of(st.none(), st.sampled_from(RISK_CLASSES)),
    inputs=st.dictionaries(
        st.sampled_from(["amount", "total", "note"]),
        st.one_of(st.integers(0, 500_000), st.text(max_size=6)),
        max_size=2,
    ),
    agent_trust=st.one_of(st.none(), st.floats(0, 1)),
    strategy=st.sampled_from(["static", "llm", "hybrid"]),
    source=st.sampled_from(["", "llm", "method"]),
    depth=st.integers(0, 4),
)
settings_strategy = st.builds(
    PolicySettings,
    gated_risks=st.lists(st.sampled_from(RISK_CLASSES), unique=True).map(tuple),
    signature_risks=st.lists(st.sampled_from(RISK_CLASSES), unique=True).map(tuple),
    amount_threshold=st.integers(0, 200_000).map(Decimal),
    trust_threshold=st.floats(0, 1),
    llm_depth_threshold=st.integers(0, 4),
    destructive_quorum=st.integers(1, 3),
)


@given(facts=facts_strategy, active=settings_strategy, draft=settings_strategy)
def test_the_what_if_says_what_classify_says_under_each_policy(
    facts: LeafFacts, active: PolicySettings, draft: PolicySettings
) -> None:
    outcome = compare_leaf(facts, active, draft)
    before, after = classify(facts, active), classify(facts, draft)
    assert outcome.before == step_class(before) and outcome.after == step_class(after)
    assert (outcome.before == AUTONOMOUS) == (not before.gated)
    assert (outcome.after == SIGNATURE) == (after.gated and after.needs_signature)
    assert outcome.change == change_kind(before, after)
    # Gated ↔ ungated is symmetric; the same policy changes nothing.
    back = compare_leaf(facts, draft, active).change
    assert (outcome.change == GATED) == (back == UNGATED)
    assert compare_leaf(facts, active, active).change == UNCHANGED


def test_the_tally_counts_every_step_and_keeps_the_changed_cases_most_changed_first() -> None:
    active, draft = PolicySettings(), PolicySettings(gated_risks=("financial",))
    write = _leaf(key="note", tool="post_note", tool_risk="write")
    write2 = _leaf(key="note2", tool="post_note", tool_risk="write")
    read = _leaf(key="look", tool="lookup", tool_risk="read")
    tally = WhatIfTally()
    tally.add(1, compare_plan([write, read], active, draft))
    tally.add(2, compare_plan([read], active, draft))
    tally.add(3, compare_plan([write, write2, read], active, draft))
    tally.add(3, compare_plan([write], active, draft))  # a second version of case 3
    summary = tally.summary()
    assert summary["versions"] == 4 and summary["steps"] == 7
    assert summary["changes"][UNGATED] == 4 and summary["changes"][UNCHANGED] == 3
    assert summary["before"] == {"autonomous": 3, "gate": 4, "signature": 0}
    assert summary["after"] == {"autonomous": 7, "gate": 0, "signature": 0}
    assert summary["changed_cases"] == 2
    rows = tally.case_rows()
    assert [r["case"] for r in rows] == [3, 1]
    assert rows[0]["versions"] == 2 and rows[0]["counts"] == {UNGATED: 3}
    assert sorted(s["key"] for s in rows[0]["steps"]) == ["note", "note2"]
    assert tally.case_rows(limit=1, steps_per_case=1)[0]["more_steps"] == 1
    assert set(summary["changes"]) == set(CHANGES)


# Asking for one ------------------------------------------------------------------------------


def _pending(proposer: Any = None, values: dict[str, Any] | None = None) -> PolicyVersion:
    version = propose_policy(proposer or personas.admin("alice"), values or LOOSER, REVIEW, "why")
    assert version.status == PolicyVersion.Status.PENDING
    return version


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=action).order_by("seq"))


@pytest.mark.django_db
def test_an_admin_asks_for_a_what_if_and_the_request_is_audited() -> None:
    adam = personas.admin()
    version = _pending()
    report = request_whatif(adam, version)
    assert report.status == PolicyWhatIf.Status.QUEUED
    assert report.base_version == PolicyVersion.objects.get(status="active")
    assert timedelta(days=29) < report.period_end - report.period_start <= timedelta(days=30)
    (event,) = _events("oversight.policy.whatif_requested")
    assert event.actor_user == adam
    assert event.data["whatif"] == report.pk
    assert event.data["policy_version"] == version.number


@pytest.mark.django_db
def test_a_non_admin_may_not_ask_and_the_refusal_is_audited() -> None:
    version = _pending()
    for user in (personas.officer(), personas.auditor(), personas.analyst()):
        with pytest.raises(PolicyDenied):
            request_whatif(user, version)
    assert PolicyWhatIf.objects.count() == 0
    denials = _events("oversight.policy.denied")
    assert [e.data["step"] for e in denials] == ["what-if"] * 3


@pytest.mark.django_db
def test_only_a_pending_version_over_a_sane_period_is_replayed() -> None:
    adam = personas.admin()
    active = PolicyVersion.objects.get(status="active")
    with pytest.raises(PolicyConflict, match="pending"):
        request_whatif(adam, active)
    version = _pending()
    now = timezone.now()
    with pytest.raises(PolicyInvalid, match="end after it starts"):
        request_whatif(adam, version, start=now, end=now - timedelta(days=1))
    with pytest.raises(PolicyInvalid, match="in the past"):
        request_whatif(adam, version, start=now + timedelta(days=1), end=now + timedelta(days=2))
    with pytest.raises(PolicyInvalid, match="366 days"):
        request_whatif(adam, version, start=now - timedelta(days=400), end=now)
    assert PolicyWhatIf.objects.count() == 0


# The replay ----------------------------------------------------------------------------------


WRITE = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.IGNORECASE)


@pytest.mark.django_db
def test_the_replay_writes_the_report_and_nothing_else() -> None:
    case = planned_invoice_case(personas.analyst())
    report = request_whatif(personas.admin(), _pending())
    gates, events = Gate.objects.count(), AuditEvent.objects.count()
    statuses = dict(PlanNode.objects.values_list("pk", "status"))
    with CaptureQueriesContext(connection) as queries:
        done = run_whatif(report.pk)
    written = {
        match[1].lower()
        for query in queries.captured_queries
        if (match := WRITE.match(query["sql"])) is not None
    }
    assert written == {"oversight_policywhatif"}
    assert (Gate.objects.count(), AuditEvent.objects.count()) == (gates, events)
    assert dict(PlanNode.objects.values_list("pk", "status")) == statuses
    assert done.status == PolicyWhatIf.Status.DONE and done.finished_at is not None
    assert (done.done, done.total) == (1, 1)
    assert done.summary["changes"][UNGATED] == 1  # the payment hold
    (row,) = done.cases
    assert row["case"] == case.pk and row["counts"] == {UNGATED: 1}
    (step,) = row["steps"]
    assert (step["key"], step["before"], step["after"]) == ("place-hold", SIGNATURE, AUTONOMOUS)


@pytest.mark.django_db
def test_the_active_side_of_the_replay_is_the_gates_that_were_opened() -> None:
    """The what-if classifies with the code the gates are opened with: under the policy they
    were opened with, each step's class is its gate (none, a gate, a signature)."""
    case = planned_invoice_case(personas.analyst())
    # A stricter proposal is active at once; a looser one is then compared with it.
    report = request_whatif(personas.admin(), _pending(values={"gate_hours": 48}))
    done = run_whatif(report.pk)
    assert done.summary["changes"][UNCHANGED] == done.summary["steps"] > 0
    opened = {
        g.node.key: (SIGNATURE if g.needs_signature else GATE)
        for g in Gate.objects.filter(case=case, kind=GateKind.STEP).select_related("node")
    }
    leaves = PlanNode.objects.filter(version=case.current_version, kind=PlanNode.Kind.LEAF)
    expected = {"autonomous": 0, "gate": 0, "signature": 0}
    for leaf in leaves:
        expected[opened.get(leaf.key, AUTONOMOUS)] += 1
    assert done.summary["before"] == expected
    assert expected["signature"] == 1  # the payment hold is signed for


@pytest.mark.django_db
def test_the_replay_reports_its_progress_batch_by_batch_and_keeps_to_the_period() -> None:
    analyst = personas.analyst()
    cases = [planned_invoice_case(analyst, goal=f"Verify invoice INV-{n}") for n in range(3)]
    old = cases[0].current_version
    assert old is not None
    PlanVersion.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    report = request_whatif(personas.admin(), _pending())
    seen: list[tuple[int, int]] = []
    progress: list[int] = []

    def on_batch(done: int, total: int) -> None:
        seen.append((done, total))
        progress.append(PolicyWhatIf.objects.get(pk=report.pk).done)

    done = run_whatif(report.pk, batch=1, on_batch=on_batch)
    assert seen == [(1, 2), (2, 2)]
    assert progress == [1, 2]
    assert {row["case"] for row in done.cases} == {cases[1].pk, cases[2].pk}
    # Finished reports are left alone (a task delivered twice).
    assert run_whatif(report.pk).finished_at == done.finished_at


@pytest.mark.django_db
def test_a_replay_that_fails_marks_its_report_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    planned_invoice_case(personas.analyst())
    report = request_whatif(personas.admin(), _pending())

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr("oversight.actions.whatif.compare_plan", broken)
    with pytest.raises(RuntimeError):
        run_whatif(report.pk)
    report.refresh_from_db()
    assert report.status == PolicyWhatIf.Status.FAILED
    assert report.error.startswith("RuntimeError")


@pytest.mark.django_db
def test_the_task_runs_the_replay() -> None:
    from oversight.tasks import run_policy_whatif

    planned_invoice_case(personas.analyst())
    report = request_whatif(personas.admin(), _pending())
    result = run_policy_whatif(report.pk)
    assert result == {"whatif": report.pk, "status": "done", "versions": 1}


# The pages -----------------------------------------------------------------------------------


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_an_admin_runs_a_what_if_from_its_page_and_reads_the_report() -> None:
    case = planned_invoice_case(personas.analyst())
    version = _pending()
    client = _client(personas.admin())
    url = reverse("oversight:policy-whatif", args=[version.pk])
    page = client.get(url)
    assert page.status_code == 200
    assert b'name="start"' in page.content and b'type="date"' in page.content
    today = timezone.localdate()
    answer = client.post(url, {"start": str(today - timedelta(days=7)), "end": str(today)})
    report = PolicyWhatIf.objects.get()
    assert answer.status_code == 302
    assert answer["Location"] == reverse("oversight:whatif-report", args=[report.pk])
    queued = client.get(answer["Location"]).content.decode()
    assert 'hx-trigger="every 1s"' in queued and "<progress" in queued
    assert "Queued: waiting for a worker." in queued

    run_whatif(report.pk)
    done = client.get(answer["Location"]).content.decode()
    assert "every 1s" not in done
    assert 'data-change="ungated"><th scope="row">No longer gated</th><td data-count>1<' in done
    # An admin reads no case: each case links to its figures, without its title.
    assert reverse("quality:case-quality", args=[case.pk]) in done
    assert case.title not in done
    partial = client.get(
        answer["Location"], headers={"HX-Request": "true", "HX-Target": "whatif-report"}
    )
    body = partial.content.decode()
    assert body.lstrip().startswith('<div id="whatif-report"') and "<html" not in body


@pytest.mark.django_db
def test_a_bad_period_is_refused_with_the_form_again() -> None:
    version = _pending()
    client = _client(personas.admin())
    url = reverse("oversight:policy-whatif", args=[version.pk])
    today = timezone.localdate()
    answer = client.post(url, {"start": str(today), "end": str(today - timedelta(days=3))})
    assert answer.status_code == 422
    assert b"must end on or after" in answer.content
    future = client.post(
        url, {"start": str(today + timedelta(days=2)), "end": str(today + timedelta(days=3))}
    )
    assert future.status_code == 422 and b"in the past" in future.content
    assert PolicyWhatIf.objects.count() == 0


@pytest.mark.django_db
def test_nobody_but_admins_sees_or_runs_a_what_if() -> None:
    version = _pending()
    report = request_whatif(personas.admin(), version)
    run_whatif(report.pk)
    urls = [
        reverse("oversight:policy-whatif", args=[version.pk]),
        reverse("oversight:whatif-report", args=[report.pk]),
    ]
    for user in (personas.officer(), personas.auditor(), personas.analyst(), personas.outsider()):
        client = _client(user)
        for url in urls:
            assert client.get(url).status_code == 403
            assert (
                client.get(url, headers={"HX-Request": "true", "HX-Target": "whatif-report"})
            ).status_code == 403
        assert client.post(urls[0], {"start": "2026-01-01", "end": "2026-01-02"}).status_code == 403
    assert PolicyWhatIf.objects.count() == 1
    admin = _client(personas.admin("amir"))
    assert admin.get(reverse("oversight:whatif-report", args=[report.pk + 1])).status_code == 404
    assert admin.get(reverse("oversight:policy-whatif", args=[9999])).status_code == 404


@pytest.mark.django_db
def test_the_report_page_costs_the_same_queries_for_one_case_or_many(
    django_assert_num_queries: Any,
) -> None:
    analyst = personas.analyst()
    planned_invoice_case(analyst)
    client = _client(personas.admin())
    version = _pending()
    amir = personas.admin("amir")
    one = request_whatif(amir, version)
    run_whatif(one.pk)
    url = reverse("oversight:whatif-report", args=[one.pk])
    client.get(url)
    with CaptureQueriesContext(connection) as first:
        client.get(url)
    for n in range(4):
        planned_invoice_case(analyst, goal=f"Verify invoice INV-{n}")
    many = request_whatif(amir, version)
    many = run_whatif(many.pk)
    assert len(many.cases) == 5
    with django_assert_num_queries(len(first)):
        client.get(reverse("oversight:whatif-report", args=[many.pk]))


@pytest.mark.django_db
def test_the_second_admin_sees_the_latest_report_on_the_pending_version_page() -> None:
    planned_invoice_case(personas.analyst())
    version = _pending()
    client = _client(personas.admin())
    url = reverse("admin:oversight_policyversion_change", args=[version.pk])
    before = client.get(url).content.decode()
    assert "What would this policy have done?" in before
    assert 'data-whatif-status="none"' in before
    assert reverse("oversight:policy-whatif", args=[version.pk]) in before
    report = request_whatif(personas.admin("amir"), version)
    running = client.get(url).content.decode()
    assert 'data-whatif-status="queued"' in running and "<progress" in running
    run_whatif(report.pk)
    after = client.get(url).content.decode()
    assert 'data-whatif-status="done"' in after
    assert 'data-change="ungated"><th scope="row">No longer gated</th><td data-count>1<' in after
    assert reverse("oversight:whatif-report", args=[report.pk]) in after


@pytest.mark.django_db
def test_proposing_a_loosening_in_the_admin_starts_its_what_if() -> None:
    from tests.oversight.test_policy_admin import ADD_URL, _form_data

    client = _client(personas.admin())
    answer = client.post(ADD_URL, _form_data(amount_threshold="50000"))
    assert answer.status_code == 302
    version = PolicyVersion.objects.get(status="pending")
    report = PolicyWhatIf.objects.get()
    assert report.policy_version == version
    assert (
        "A what-if of the last 30 days runs for it"
        in client.get(answer["Location"]).content.decode()
    )
    # A stricter proposal is active at once: nothing to replay.
    client.post(ADD_URL, _form_data(trust_threshold="0.7"))
    assert PolicyWhatIf.objects.count() == 1


@pytest.mark.django_db
def test_the_list_of_versions_links_each_ones_latest_what_if() -> None:
    version = _pending()
    adam = personas.admin()
    request_whatif(adam, version)
    latest = request_whatif(adam, version)
    page = _client(adam).get(reverse("admin:oversight_policyversion_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    url = reverse("oversight:whatif-report", args=[latest.pk])
    assert f'<a href="{url}">report (queued)</a>' in html


@pytest.mark.django_db
def test_a_report_no_worker_took_says_so_and_offers_to_run_it_again() -> None:
    version = _pending()
    report = request_whatif(personas.admin(), version)
    client = _client(personas.admin("amir"))
    url = reverse("oversight:whatif-report", args=[report.pk])
    assert 'data-note="waiting"' not in client.get(url).content.decode()
    PolicyWhatIf.objects.filter(pk=report.pk).update(
        created_at=timezone.now() - timedelta(minutes=3)
    )
    page = client.get(url).content.decode()
    assert 'data-note="waiting"' in page
    assert reverse("oversight:policy-whatif", args=[version.pk]) in page
