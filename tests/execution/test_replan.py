"""Failure policy `replan`: a failed step's subtree is decomposed another way, as a new version.

Leaves run in-process the way a worker runs them (`execution.execute_leaf`); the pack is
tests/fakes/replan_pack.py (one task with a method per data source, chosen by the inputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from execution import actions as execution
from oversight.actions.edits import edit_plan
from oversight.actions.gates import DecisionDenied, DecisionInput, GateConflict, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from tests.fakes.execution_pack import effect_counts
from tests.fakes.replan_pack import PATH, SLUG

pytestmark = pytest.mark.django_db


@pytest.fixture
def effects(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    settings.CASEHUB_EXTRA_PACKS = [PATH]
    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path))
    sync_packs()
    return tmp_path


def planned(submitter: Any, *, strategy: str = "static", **inputs: Any) -> Case:
    case = submit_case(
        submitter=submitter,
        title="Fetch and report",
        goal="Fetch the data and report",
        domain=SLUG,
        strategy=strategy,
        inputs=inputs,
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    return case


def approve_plan(case: Case, user: Any) -> None:
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING)
    decide_gate(gate_id=gate.pk, user=user, decision=DecisionInput(decision="approve"))


def leaves(case: Case) -> dict[str, PlanNode]:
    case.refresh_from_db()
    return {n.key: n for n in PlanNode.objects.filter(version=case.current_version, kind="leaf")}


def run_ready(case: Case) -> None:
    """Run every ready leaf of the case's current version until none is ready."""
    while ready := [n for n in leaves(case).values() if n.status == NodeStatus.READY]:
        for node in ready:
            execution.execute_leaf(node.pk, worker="test")


def runs(effects: Path, case: Case, key: str) -> int:
    """Return how many times the tool of step `key` was invoked (by its idempotency key)."""
    return effect_counts(effects, f"casehub:case-{case.pk}:leaf-{key}")[1]


def statuses(case: Case) -> dict[str, str]:
    return {key: node.status for key, node in leaves(case).items()}


def edit_report(case: Case, editor: Any) -> PlanVersion:
    """Edit the `report` step of the case's current version; return the version it made."""
    return edit_plan(
        case_id=case.pk,
        user=editor,
        node_key="report",
        changes={"task": "do report, with the sources named"},
        reason_code="incomplete",
        reason="name the sources",
    ).version


@pytest.mark.parametrize("strategy", ["static", "forward", "hybrid"])
def test_a_step_that_fails_with_replan_gets_a_new_version_with_the_next_method(
    effects, analyst, officer, strategy
):
    case = planned(analyst, strategy=strategy, sources=["primary", "mirror"], failing=["primary"])
    first = case.current_version
    approve_plan(case, officer)
    run_ready(case)

    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL
    version = case.current_version
    assert version.number == 2 and version.edited_by is None
    assert version.edit["kind"] == "replan"
    assert version.edit["node"] == "fetch-primary"
    assert version.edit["subtree"] == "fetch"
    assert version.edit["method"] == "fetch-from-mirror"
    assert version.edit["excluded"] == ["fetch-from-primary"]
    assert version.strategy == strategy
    # The steps that succeeded keep their status and output; the replaced one is gone.
    now = leaves(case)
    assert set(now) == {"prepare", "fetch-index", "fetch-mirror", "report"}
    assert now["prepare"].status == NodeStatus.SUCCEEDED
    assert now["prepare"].output["label"] == "prepare"
    assert now["fetch-index"].status == NodeStatus.SUCCEEDED
    assert now["fetch-mirror"].status == NodeStatus.PENDING
    # The old version: the failed step failed, what waited for it is blocked; its gate void.
    old = {n.key: n.status for n in PlanNode.objects.filter(version=first, kind="leaf")}
    assert old["fetch-primary"] == NodeStatus.FAILED
    if strategy == "forward":
        # Forward dependencies follow reads and effects: the report read nothing fetched, but
        # it comes after the fetch in the plan's order, so it had not started: nothing new
        # starts on the replaced version.
        assert old["report"] == NodeStatus.CANCELLED
        assert now["report"].status == NodeStatus.PENDING
    else:
        assert old["report"] == NodeStatus.BLOCKED
        assert now["report"].status == NodeStatus.PENDING
    assert not Gate.objects.filter(version=first, status=GateStatus.PENDING).exists()
    plan_gate = Gate.objects.get(version=version, kind=GateKind.PLAN)
    assert plan_gate.status == GateStatus.PENDING
    assert any("re-planned after step fetch-primary failed" in w for w in version.warnings)
    # Audited in the case's chain, with the diff and the steps kept.
    event = AuditEvent.objects.get(action="planning.plan.replanned")
    assert event.data["version"] == 2 and event.data["from_version"] == 1
    assert event.data["kept"] == ["fetch-index", "prepare"]
    assert "fetch-primary" in str(event.data["diff"]) and "fetch-mirror" in str(event.data["diff"])
    assert AuditEvent.objects.filter(action="planning.case.awaiting_approval").count() == 1

    # The officer who approved version 1 approves version 2 (the system made it, not a person);
    # only the new steps run.
    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, (case.verification, statuses(case))
    assert statuses(case) == dict.fromkeys(
        ("prepare", "fetch-index", "fetch-mirror", "report"), NodeStatus.SUCCEEDED
    )
    assert runs(effects, case, "prepare") == 1
    assert runs(effects, case, "fetch-index") == 1
    assert runs(effects, case, "fetch-mirror") == 1
    assert runs(effects, case, "report") == 1


def test_the_submitter_still_cannot_approve_a_replanned_version(effects, analyst, officer):
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)
    with pytest.raises(DecisionDenied):
        approve_plan(case, analyst)


def test_without_an_alternative_method_the_step_escalates_and_the_refusal_is_audited(
    effects, analyst, officer
):
    case = planned(analyst, sources=["primary"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    assert PlanVersion.objects.filter(case=case).count() == 1
    assert leaves(case)["fetch-primary"].status == NodeStatus.AWAITING_APPROVAL
    escalation = Gate.objects.get(case=case, kind=GateKind.ESCALATION)
    assert escalation.node.key == "fetch-primary"
    assert "failure policy replan" in escalation.reason
    refused = AuditEvent.objects.get(action="execution.replan.refused")
    assert refused.data["node"] == "fetch-primary"
    assert "no other decomposition of 'fetch' applies" in refused.data["why"]


def test_a_method_that_failed_is_not_chosen_again_and_the_limit_escalates(
    effects, analyst, officer, settings
):
    settings.CASEHUB_MAX_REPLANS = 2
    case = planned(
        analyst, sources=["primary", "mirror", "backup"], failing=["primary", "mirror", "backup"]
    )
    approve_plan(case, officer)
    run_ready(case)  # primary fails: version 2 fetches from the mirror
    approve_plan(case, officer)
    run_ready(case)  # the mirror fails: version 3 from the backup, not the primary again
    case.refresh_from_db()
    assert case.current_version.number == 3
    assert case.current_version.edit["method"] == "fetch-from-backup"
    assert case.current_version.edit["excluded"] == ["fetch-from-mirror", "fetch-from-primary"]
    approve_plan(case, officer)
    run_ready(case)  # the backup fails: two re-plans already, it escalates
    case.refresh_from_db()
    assert case.current_version.number == 3
    assert case.status == CaseStatus.EXECUTING
    assert leaves(case)["fetch-backup"].status == NodeStatus.AWAITING_APPROVAL
    refused = AuditEvent.objects.get(action="execution.replan.refused")
    assert "re-planned 2 time(s) already" in refused.data["why"]
    # The step that succeeded in version 1 ran once through all three versions.
    assert runs(effects, case, "prepare") == 1
    assert runs(effects, case, "fetch-index") == 1


def test_a_limit_of_zero_replans_escalates_at_once(effects, analyst, officer, settings):
    settings.CASEHUB_MAX_REPLANS = 0
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)
    assert PlanVersion.objects.filter(case=case).count() == 1
    assert Gate.objects.filter(case=case, kind=GateKind.ESCALATION).count() == 1


def test_a_step_still_running_on_the_old_version_holds_the_new_plan_gate_and_its_result_is_kept(
    effects, analyst, officer
):
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"], parallel=True)
    approve_plan(case, officer)
    # `prepare` is running (a slow worker) when the other branch fails and re-plans the case.
    claim = execution.claim_leaf(leaves(case)["prepare"].pk, worker="slow")
    run_ready(case)
    case.refresh_from_db()
    assert case.current_version.number == 2
    assert leaves(case)["prepare"].status == NodeStatus.PENDING
    with pytest.raises(GateConflict, match="still running"):
        approve_plan(case, officer)
    # The slow step's effect happened: its result is recorded on the old version ...
    output = {"label": "prepare", "effects": 1, "invocations": 1}
    execution.complete_leaf(claim.node_id, claim.attempt, output)
    assert PlanNode.objects.get(pk=claim.node_id).status == NodeStatus.SUCCEEDED
    # ... and carried into the new one when that is approved: it does not run again.
    approve_plan(case, officer)
    carried = AuditEvent.objects.get(action="planning.plan.results_carried")
    assert carried.data["nodes"] == ["prepare"]
    assert leaves(case)["prepare"].output == output
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert runs(effects, case, "prepare") == 0  # completed by the slow "worker" above only
    assert runs(effects, case, "fetch-mirror") == 1


def test_the_version_pages_show_the_replan_and_the_replaced_subtree(
    effects, analyst, officer, client
):
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)
    client.force_login(officer)
    history = client.get(reverse("oversight:version-history", args=[case.pk]))
    assert history.status_code == 200
    page = history.content.decode()
    assert "re-plan after step fetch-primary failed" in page
    diff = client.get(reverse("oversight:version-diff", args=[case.pk]) + "?from=1&to=2")
    assert diff.status_code == 200
    page = diff.content.decode()
    assert "re-plans" in page and "fetch-primary" in page and "fetch-mirror" in page
    detail = client.get(reverse("planning:case-detail", args=[case.pk]))
    assert "re-planned after step fetch-primary failed" in detail.content.decode()


@pytest.mark.scenario("S1")
def test_an_edit_of_a_replanned_version_keeps_the_steps_that_ended_and_nothing_runs_again(
    effects, analyst, officer, second_officer
):
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)  # primary fails: version 2 fetches from the mirror
    case.refresh_from_db()
    replanned = leaves(case)
    assert replanned["prepare"].status == NodeStatus.SUCCEEDED

    version = edit_report(case, second_officer)

    assert version.number == 3 and version.edited_by == second_officer
    now = leaves(case)
    # The unchanged steps that succeeded are still succeeded, with their output.
    for key in ("prepare", "fetch-index"):
        assert now[key].status == NodeStatus.SUCCEEDED, key
        assert now[key].output == replanned[key].output
        assert now[key].attempts == replanned[key].attempts
    # The step the edit changed and the one the re-plan added have still to run.
    assert now["report"].status == NodeStatus.PENDING
    assert now["report"].task == "do report, with the sources named"
    assert now["fetch-mirror"].status == NodeStatus.PENDING

    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, (case.verification, statuses(case))
    assert runs(effects, case, "prepare") == 1
    assert runs(effects, case, "fetch-index") == 1
    assert runs(effects, case, "fetch-mirror") == 1
    assert runs(effects, case, "report") == 1


@pytest.mark.scenario("S2")
def test_an_edited_replanned_version_waits_for_a_step_still_running_on_the_old_version(
    effects, analyst, officer, second_officer
):
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"], parallel=True)
    approve_plan(case, officer)
    # `prepare` is running (a slow worker) when the other branch fails and re-plans the case.
    claim = execution.claim_leaf(leaves(case)["prepare"].pk, worker="slow")
    run_ready(case)
    case.refresh_from_db()
    assert case.current_version.number == 2
    # The re-planned version is edited: the edited version descends from the re-plan.
    version = edit_report(case, second_officer)
    assert version.number == 3
    assert leaves(case)["prepare"].status == NodeStatus.PENDING
    with pytest.raises(GateConflict, match="still running"):
        approve_plan(case, officer)
    assert Gate.objects.get(version=version, kind=GateKind.PLAN).status == GateStatus.PENDING
    # The slow step records its result on version 1 ...
    output = {"label": "prepare", "effects": 1, "invocations": 1}
    execution.complete_leaf(claim.node_id, claim.attempt, output)
    # ... and approving version 3 carries it over: it does not run a second time.
    approve_plan(case, officer)
    carried = AuditEvent.objects.get(action="planning.plan.results_carried")
    assert carried.data["nodes"] == ["prepare"]
    assert carried.data["version"] == 3 and carried.data["from_version"] == 1
    assert leaves(case)["prepare"].status == NodeStatus.SUCCEEDED
    assert leaves(case)["prepare"].output == output
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert runs(effects, case, "prepare") == 0  # completed by the slow "worker" above only
    assert runs(effects, case, "fetch-mirror") == 1
    assert runs(effects, case, "report") == 1


def test_a_step_that_ended_and_is_edited_in_a_replanned_version_is_a_new_step(
    effects, analyst, officer, second_officer
):
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)  # primary fails: version 2 fetches from the mirror
    edit_plan(
        case_id=case.pk,
        user=second_officer,
        node_key="prepare",
        changes={"task": "do prepare, once more"},
        reason_code="incomplete",
    )
    now = leaves(case)
    assert now["prepare"].status == NodeStatus.PENDING
    assert now["prepare"].output is None
    assert now["fetch-index"].status == NodeStatus.SUCCEEDED
    event = AuditEvent.objects.get(action="planning.plan.edited")
    assert event.data["kept"] == ["fetch-index"]
    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, (case.verification, statuses(case))
    assert runs(effects, case, "prepare") == 2  # the edited step ran, under its same key
    assert runs(effects, case, "fetch-index") == 1
