"""Re-planning with promoted methods: once the pack's code methods for the failed step's task are
used up or left out, an active promoted method of the pack decomposes it; a retired one does not.

The pack is tests/fakes/replan_pack.py; the promoted method is stored as an approved row (its
content hash made by planning.promotion.methods, as approval makes it), not through the LLM flow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from oversight.models import Gate, GateKind
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion, PromotedMethod
from planning.promotion.actions import retire_method
from planning.promotion.methods import method_hash
from tests import personas
from tests.execution.test_replan import approve_plan, leaves, planned, run_ready, runs
from tests.execution.test_replan import statuses as step_statuses
from tests.fakes.replan_pack import AGENT, PATH, SLUG

pytestmark = pytest.mark.django_db

NAME = "fetch-from-archive"
SOURCE = f"promoted:{NAME}@v1"
GUARD = [{"key": "failure_policy", "op": "equals", "value": "replan"}]


@pytest.fixture
def effects(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    settings.CASEHUB_EXTRA_PACKS = [PATH]
    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path))
    sync_packs()
    return tmp_path


def _leaf(key: str) -> dict[str, Any]:
    return {
        "kind": "leaf",
        "key": key,
        "agent": AGENT.slug,
        "task": f"do {key}",
        "tool": "replan_effect",
        "inputs": {"label": key},
        "expected_output": "EffectResult",
    }


# The index step as the code methods plan it (it succeeded already, so it is kept), then the data
# from a source no code method knows.
SUBTREE = [_leaf("fetch-index"), _leaf("fetch-archive")]


def _version(case: Case) -> PlanVersion:
    case.refresh_from_db()
    assert case.current_version is not None
    return case.current_version


def _edit(case: Case) -> dict[str, Any]:
    edit = _version(case).edit
    assert isinstance(edit, dict)
    return edit


def _promote(case: Case, proposer: Any) -> PromotedMethod:
    """Store an active promoted method for `fetch` of the re-planning pack, as approval does."""
    description = "Fetch the data from the archive"
    approver: Any = personas.second_officer()  # not the proposer: a second person approves
    return PromotedMethod.objects.create(
        pack=SLUG,
        task="fetch",
        name=NAME,
        version=1,
        description=description,
        guard=GUARD,
        subtree=SUBTREE,
        content_hash=method_hash(
            pack=SLUG,
            task="fetch",
            name=NAME,
            version=1,
            description=description,
            guard=GUARD,
            subtree=SUBTREE,
        ),
        status=PromotedMethod.Status.ACTIVE,
        source_case=case,
        source_version=_version(case),
        source_node=PlanNode.objects.get(version=_version(case), parent=None),
        proposed_by=proposer,
        approved_by=approver,
        approved_at=timezone.now(),
    )


@pytest.mark.parametrize("strategy", ["static", "forward", "hybrid"])
def test_the_only_code_method_failing_re_plans_with_the_active_promoted_method(
    effects: Path, analyst: Any, officer: Any, strategy: str
) -> None:
    case = planned(analyst, strategy=strategy, sources=["primary"], failing=["primary"])
    _promote(case, officer)
    approve_plan(case, officer)
    run_ready(case)

    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, step_statuses(case)
    version = _version(case)
    assert version.number == 2
    assert _edit(case)["method"] == SOURCE
    assert _edit(case)["excluded"] == ["fetch-from-primary"]
    fetch = PlanNode.objects.get(version=version, key="fetch")
    assert fetch.provenance["source"] == SOURCE
    assert fetch.provenance["strategy"] == strategy
    now = leaves(case)
    assert set(now) == {"prepare", "fetch-index", "fetch-archive", "report"}
    assert now["fetch-archive"].provenance["source"] == SOURCE
    assert now["fetch-index"].status == NodeStatus.SUCCEEDED
    assert now["fetch-archive"].status == NodeStatus.PENDING

    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, (case.verification, step_statuses(case))
    assert set(step_statuses(case).values()) == {NodeStatus.SUCCEEDED}
    assert runs(effects, case, "fetch-index") == 1
    assert runs(effects, case, "fetch-archive") == 1


def test_the_promoted_method_comes_after_the_code_methods_that_are_left(
    effects: Path, analyst: Any, officer: Any
) -> None:
    case = planned(analyst, sources=["primary", "mirror"], failing=["primary", "mirror"])
    _promote(case, officer)
    approve_plan(case, officer)
    run_ready(case)  # primary fails: the code method for the mirror first
    assert _edit(case)["method"] == "fetch-from-mirror"
    approve_plan(case, officer)
    run_ready(case)  # the mirror fails too: both code methods are left out, the promoted one
    assert _version(case).number == 3
    assert _edit(case)["method"] == SOURCE
    assert _edit(case)["excluded"] == ["fetch-from-mirror", "fetch-from-primary"]
    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, (case.verification, step_statuses(case))
    assert runs(effects, case, "fetch-archive") == 1


def test_a_retired_promoted_method_is_not_used_and_the_step_escalates(
    effects: Path, analyst: Any, officer: Any
) -> None:
    # While it is active it re-plans the case ...
    used = planned(analyst, sources=["primary"], failing=["primary"])
    method = _promote(used, officer)
    approve_plan(used, officer)
    run_ready(used)
    assert _edit(used)["method"] == SOURCE

    # ... once retired it does not: no other decomposition, the step escalates as without it.
    retire_method(user=officer, method_id=method.pk, reason="The archive is gone")
    case = planned(analyst, sources=["primary"], failing=["primary"])
    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    assert PlanVersion.objects.filter(case=case).count() == 1
    assert leaves(case)["fetch-primary"].status == NodeStatus.AWAITING_APPROVAL
    escalation = Gate.objects.get(case=case, kind=GateKind.ESCALATION)
    assert escalation.node is not None and escalation.node.key == "fetch-primary"
    refused = AuditEvent.objects.get(action="execution.replan.refused", data__node="fetch-primary")
    assert "no other decomposition of 'fetch' applies" in refused.data["why"]
    assert NAME not in refused.data["why"]
    assert runs(effects, case, "fetch-archive") == 0


def test_a_promoted_method_changed_since_its_approval_escalates_rather_than_plans(
    effects: Path, analyst: Any, officer: Any
) -> None:
    case = planned(analyst, sources=["primary"], failing=["primary"])
    method = _promote(case, officer)
    # Edited in the database after approval: the hash no longer binds it.
    PromotedMethod.objects.filter(pk=method.pk).update(
        subtree=[{**_leaf("fetch-archive"), "tool": "replan_fail"}]
    )
    approve_plan(case, officer)
    run_ready(case)
    case.refresh_from_db()
    assert PlanVersion.objects.filter(case=case).count() == 1
    assert leaves(case)["fetch-primary"].status == NodeStatus.AWAITING_APPROVAL
    refused = AuditEvent.objects.get(action="execution.replan.refused")
    assert "no longer matches what was approved" in refused.data["why"]
