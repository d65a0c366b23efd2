"""The state machines of the status fields (STYLE.md "State machines", RELIABILITY S8).

Each table is checked on its own rows: every move it allows moves a row and is audited in the
move's transaction, every other pair raises naming the field and both statuses, and a failure
after a move rolls the move and its event back together. The mechanics (`audit.transitions`)
are checked once, on work items.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.chain import NewEvent, append_event, case_chain
from audit.models import AuditEvent
from audit.transitions import (
    IllegalTransition,
    StaleTransition,
    Transitions,
    UnauditedMove,
    audited,
    move_row_along,
)
from execution import actions as execution
from execution.models import WorkItem
from execution.transitions import WORK_ITEM, move_work_item, move_work_items
from oversight.models import Gate, GateKind, GateStatus
from oversight.transitions import GATE, move_gate
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from planning.transitions import CASE, NODE, move_case, move_node
from tests.cases import planned_invoice_case
from tests.execution.work_items import approve_plan, waiting_work_item
from tests.planning.factories import make_case, make_plan

pytestmark = [pytest.mark.django_db, pytest.mark.scenario("S8")]

MOVED = "tests.status.moved"
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


@dataclass(frozen=True, slots=True)
class Machine:
    """One state machine under test: its table, its statuses, a row in a status, its move."""

    table: Transitions
    choices: type[models.TextChoices]
    make: Callable[[Any, str], Any]
    move: Callable[..., str]


def _work_item(submitter: Any, status: str) -> WorkItem:
    case = make_case(submitter)
    make_plan(case, leaves=1)
    node = PlanNode.objects.get(version_id=case.current_version_id, key="step-0")
    now = timezone.now()
    group, _ = Group.objects.get_or_create(name="tests-workers")
    return WorkItem.objects.create(
        case=case,
        node=node,
        attempt=1,
        group=group,
        status=status,
        created_at=now,
        deadline=now + timedelta(hours=1),
    )


def _gate(submitter: Any, status: str) -> Gate:
    case = make_case(submitter)
    version = make_plan(case, leaves=1)
    now = timezone.now()
    group, _ = Group.objects.get_or_create(name="tests-approvers")
    return Gate.objects.create(
        case=case,
        version=version,
        kind=GateKind.PLAN,
        status=status,
        reason="tests",
        approver_group=group,
        content_hash=version.content_hash,
        opened_at=now,
        remind_at=now + timedelta(hours=1),
        deadline=now + timedelta(hours=2),
    )


def _case(submitter: Any, status: str) -> Case:
    return make_case(submitter, status=status)


def _node(submitter: Any, status: str) -> PlanNode:
    case = make_case(submitter)
    make_plan(case, leaves=1, status=status)
    return PlanNode.objects.get(version_id=case.current_version_id, key="step-0")


MACHINES = {
    "work item": Machine(WORK_ITEM, WorkItem.Status, _work_item, move_work_item),
    "gate": Machine(GATE, GateStatus, _gate, move_gate),
    "case": Machine(CASE, CaseStatus, _case, move_case),
    "plan node": Machine(NODE, NodeStatus, _node, move_node),
}


def _pairs(allowed: bool) -> list[Any]:
    return [
        pytest.param(name, before, after, id=f"{name}: {before}->{after}")
        for name, machine in MACHINES.items()
        for before in machine.table.statuses
        for after in machine.table.statuses
        if machine.table.allows(before, after) == allowed
    ]


def _case_id(row: Any) -> int:
    if isinstance(row, Case):
        return row.pk
    return row.version.case_id if isinstance(row, PlanNode) else row.case_id


def _moved_events(row: Any) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=case_chain(_case_id(row)), action=MOVED))


@pytest.mark.parametrize("name", list(MACHINES))
def test_each_table_lists_every_status_of_its_field_and_ends_somewhere(name: str) -> None:
    machine = MACHINES[name]
    assert set(machine.table.statuses) == set(machine.choices.values)
    assert machine.table.ends, "a state machine with no end never finishes"
    for end in machine.table.ends:
        assert machine.table.sources(end), f"nothing reaches the end {end}"


def _documented(field: str) -> tuple[str, dict[str, set[str]]]:
    """Return where docs/architecture.md says a field's table lives, and its moves as shown."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## State machines\n", 1)[1].split("\n## ", 1)[0]
    head = re.search(rf"^\*\*[^*]+\*\* \(`{re.escape(field)}`, `([^`]+)`\):", section, re.M)
    assert head is not None, f"docs/architecture.md shows no table of {field}"
    lines = section[head.end() :].splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("|"))
    moves: dict[str, set[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        before, after = (cell.strip() for cell in line.strip("|").split("|"))
        moves[before.strip("`")] = set(re.findall(r"`([^`]+)`", after))
    return head.group(1), moves


@pytest.mark.parametrize("name", list(MACHINES))
def test_the_architecture_page_shows_each_table_as_it_is(name: str) -> None:
    machine = MACHINES[name]
    where, moves = _documented(machine.table.field)
    assert where == machine.move.__module__.replace(".", "/") + ".py"
    assert moves == {before: set(after) for before, after in machine.table.moves.items()}


@pytest.mark.parametrize(("name", "before", "after"), _pairs(allowed=True))
def test_every_move_the_table_allows_moves_the_row_with_its_event(
    name: str, before: str, after: str, analyst: Any
) -> None:
    machine = MACHINES[name]
    row = machine.make(analyst, before)
    with audited(chain=case_chain(_case_id(row))) as audit:
        assert machine.move(row, to=after, audit=audit) == before
        audit.add(NewEvent(MOVED, None, {"row": row.pk, "before": before, "after": after}))
    assert row.status == after
    row.refresh_from_db()
    assert row.status == after
    assert [e.data for e in _moved_events(row)] == [
        {"row": row.pk, "before": before, "after": after}
    ]


@pytest.mark.parametrize(("name", "before", "after"), _pairs(allowed=False))
def test_a_move_the_table_does_not_allow_raises_naming_the_field_and_both_statuses(
    name: str, before: str, after: str, analyst: Any
) -> None:
    machine = MACHINES[name]
    row = machine.make(analyst, before)
    with (
        pytest.raises(IllegalTransition) as raised,
        transaction.atomic(),
        audited(chain=case_chain(_case_id(row))) as audit,
    ):
        machine.move(row, to=after, audit=audit)
        audit.add(NewEvent(MOVED))
    assert (raised.value.field, raised.value.before, raised.value.after) == (
        machine.table.field,
        before,
        after,
    )
    assert machine.table.field in str(raised.value) and f"{before} → {after}" in str(raised.value)
    row.refresh_from_db()
    assert row.status == before
    assert _moved_events(row) == []


@pytest.mark.parametrize("name", list(MACHINES))
def test_a_failure_after_the_move_rolls_the_move_and_its_event_back(
    name: str, analyst: Any
) -> None:
    machine = MACHINES[name]
    before, after = machine.table.pairs[0]
    row = machine.make(analyst, before)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        with audited(chain=case_chain(_case_id(row))) as audit:
            machine.move(row, to=after, audit=audit)
            audit.add(NewEvent(MOVED))
        assert len(_moved_events(row)) == 1  # written, inside the transaction
        _ = 1 / 0
    row.refresh_from_db()
    assert row.status == before
    assert _moved_events(row) == []


# The mechanics, on work items -------------------------------------------------------------------


def test_a_block_that_moves_a_status_without_an_event_raises_and_changes_nothing(
    analyst: Any,
) -> None:
    item = _work_item(analyst, WorkItem.Status.OPEN)
    with (
        pytest.raises(UnauditedMove, match="without an audit event"),
        transaction.atomic(),
        audited(chain=case_chain(item.case_id)) as audit,
    ):
        move_work_item(item, to=WorkItem.Status.CANCELLED, audit=audit)
    item.refresh_from_db()
    assert item.status == WorkItem.Status.OPEN


def test_a_move_after_its_block_ended_is_refused(analyst: Any) -> None:
    item = _work_item(analyst, WorkItem.Status.OPEN)
    with audited(chain=case_chain(item.case_id)) as audit:
        audit.add(NewEvent(MOVED))
    with pytest.raises(RuntimeError, match="has ended"):
        move_work_item(item, to=WorkItem.Status.CANCELLED, audit=audit)
    item.refresh_from_db()
    assert item.status == WorkItem.Status.OPEN


def test_a_row_whose_status_changed_since_it_was_read_is_not_moved(analyst: Any) -> None:
    item = _work_item(analyst, WorkItem.Status.OPEN)
    WorkItem.objects.filter(pk=item.pk).update(status=WorkItem.Status.CANCELLED)  # elsewhere
    with (
        pytest.raises(StaleTransition, match="is cancelled now"),
        transaction.atomic(),
        audited(chain=case_chain(item.case_id)) as audit,
    ):
        move_work_item(item, to=WorkItem.Status.COMPLETED, audit=audit)
        audit.add(NewEvent(MOVED))
    item.refresh_from_db()
    assert item.status == WorkItem.Status.CANCELLED
    assert _moved_events(item) == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a move along an append")
def test_a_move_along_the_append_changes_its_row_in_the_appends_statement(analyst: Any) -> None:
    """`move_row_along`: checked and covered at once, the row changed by the block's append (one
    statement for both); a row that changed meanwhile raises at the block's end, and nothing of
    the block commits."""
    item = _work_item(analyst, WorkItem.Status.OPEN)
    append_event("tests.chain.started", chain=case_chain(item.case_id))  # its head exists
    with (
        CaptureQueriesContext(connection) as queries,
        audited(chain=case_chain(item.case_id)) as audit,
    ):
        move_row_along(WORK_ITEM, item, to=WorkItem.Status.CANCELLED, audit=audit, name="w")
        assert item.status == WorkItem.Status.CANCELLED  # set on the instance at once
        assert WorkItem.objects.get(pk=item.pk).status == WorkItem.Status.OPEN  # not yet
        audit.add(NewEvent(MOVED))
    # the block's writes (the read above aside): one statement
    assert [q["sql"][:8] for q in queries.captured_queries][1:] == ['WITH "w"']
    assert WorkItem.objects.get(pk=item.pk).status == WorkItem.Status.CANCELLED
    assert len(_moved_events(item)) == 1
    with (
        pytest.raises(IllegalTransition, match="cancelled → open"),
        transaction.atomic(),
        audited(chain=case_chain(item.case_id)) as audit,
    ):
        move_row_along(WORK_ITEM, item, to=WorkItem.Status.OPEN, audit=audit, name="w")

    other = _work_item(analyst, WorkItem.Status.OPEN)
    WorkItem.objects.filter(pk=other.pk).update(status=WorkItem.Status.CANCELLED)  # elsewhere
    with (
        pytest.raises(StaleTransition, match="is cancelled now"),
        transaction.atomic(),
        audited(chain=case_chain(other.case_id)) as audit,
    ):
        move_row_along(WORK_ITEM, other, to=WorkItem.Status.COMPLETED, audit=audit, name="w")
        audit.add(NewEvent(MOVED))
    assert WorkItem.objects.get(pk=other.pk).status == WorkItem.Status.CANCELLED
    assert _moved_events(other) == []


def test_a_bulk_move_changes_only_the_rows_the_table_lets_move_and_returns_them(
    analyst: Any,
) -> None:
    open_item = _work_item(analyst, WorkItem.Status.OPEN)
    done = _work_item(analyst, WorkItem.Status.COMPLETED)
    with audited(chain=case_chain(open_item.case_id)) as audit:
        moved = move_work_items(
            WorkItem.objects.filter(pk__in=[open_item.pk, done.pk]),
            to=WorkItem.Status.CANCELLED,
            audit=audit,
            read=("attempt",),
        )
        audit.add(NewEvent(MOVED))
    assert [(m.pk, m.before, m.after, dict(m.values)) for m in moved] == [
        (open_item.pk, "open", "cancelled", {"attempt": 1})
    ]
    assert audit.moved == moved
    assert dict(WorkItem.objects.values_list("pk", "status")) == {
        open_item.pk: WorkItem.Status.CANCELLED,
        done.pk: WorkItem.Status.COMPLETED,
    }


def test_a_bulk_move_from_a_status_the_table_does_not_allow_raises_before_it_changes_anything(
    analyst: Any,
) -> None:
    item = _work_item(analyst, WorkItem.Status.COMPLETED)
    with (
        pytest.raises(IllegalTransition, match="completed → cancelled"),
        transaction.atomic(),
        audited(chain=case_chain(item.case_id)) as audit,
    ):
        move_work_items(
            WorkItem.objects.all(),
            to=WorkItem.Status.CANCELLED,
            from_=[WorkItem.Status.COMPLETED],
            audit=audit,
        )
    item.refresh_from_db()
    assert item.status == WorkItem.Status.COMPLETED


def test_an_event_added_now_is_appended_before_the_block_takes_its_rows(analyst: Any) -> None:
    item = _work_item(analyst, WorkItem.Status.OPEN)
    chain = case_chain(item.case_id)
    with audited(chain=chain) as audit:
        audit.add(NewEvent("tests.status.first"), now=True)
        assert AuditEvent.objects.filter(chain=chain, action="tests.status.first").exists()
        move_work_item(item, to=WorkItem.Status.CANCELLED, audit=audit)
        audit.add(NewEvent(MOVED))
    assert list(
        AuditEvent.objects.filter(chain=chain).order_by("seq").values_list("action", flat=True)
    ) == ["tests.status.first", MOVED]


def test_a_table_refuses_moves_to_statuses_it_does_not_list_and_moves_to_itself() -> None:
    with pytest.raises(ValueError, match="unknown statuses"):
        Transitions.of("X.status", {"a": {"b"}})
    with pytest.raises(ValueError, match="itself"):
        Transitions.of("X.status", {"a": {"a"}})


# What the code writes with the moves ------------------------------------------------------------


def test_cancelling_a_case_closes_its_open_work_item_with_an_event_of_its_own(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    execution.cancel_case(case_id=item.case_id, user=officer, reason_code="other", reason="no")
    item.refresh_from_db()
    assert item.status == WorkItem.Status.CANCELLED
    (event,) = AuditEvent.objects.filter(
        chain=case_chain(item.case_id), action="execution.work_item.cancelled"
    )
    assert event.actor_label == officer.username
    assert event.data == {
        "work_item": item.pk,
        "node": item.node.key,
        "attempt": item.attempt,
        "why": "the case was cancelled",
        "before": {"status": "open"},
        "after": {"status": "cancelled"},
    }


def _events(case_id: int, action: str) -> list[dict[str, Any]]:
    events = AuditEvent.objects.filter(chain=case_chain(case_id), action=action).order_by("seq")
    return [e.data for e in events]


def _running_chain_of_three(submitter: Any, *, case_status: str, policy: str = "") -> PlanNode:
    """Return step-0 of an executing case's plan step-0 → step-1 → step-2, running."""
    case = make_case(submitter, status=case_status)
    make_plan(case, leaves=3)
    PlanNode.objects.filter(version_id=case.current_version_id, key="step-0").update(
        status=NodeStatus.RUNNING, attempts=1, failure_policy=policy
    )
    return PlanNode.objects.select_related("version").get(
        version_id=case.current_version_id, key="step-0"
    )


def test_cancelling_a_case_cancels_each_waiting_step_with_an_event_of_its_own(
    analyst: Any, officer: Any
) -> None:
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    before = dict(
        PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf").values_list(
            "key", "status"
        )
    )
    execution.cancel_case(case_id=case.pk, user=officer, reason_code="other", reason="no")
    cancelled = _events(case.pk, "execution.leaf.cancelled")
    assert sorted(e["node"] for e in cancelled) == sorted(before)
    for event in cancelled:
        assert event["before"] == {"status": before[event["node"]]}
        assert event["after"] == {"status": "cancelled"}
        assert event["why"] == "the case was cancelled"
    actions = list(
        AuditEvent.objects.filter(chain=case_chain(case.pk))
        .order_by("seq")
        .values_list("action", flat=True)
    )
    assert actions[-1] == "planning.case.cancelled"  # after the steps and gates it closed


def test_a_failed_step_blocks_the_steps_that_need_it_each_with_an_event_of_its_own(
    analyst: Any,
) -> None:
    from execution.cases import fail_and_block

    node = _running_chain_of_three(analyst, case_status=CaseStatus.EXECUTING)
    with transaction.atomic():
        assert fail_and_block(node, why="it broke", actor=None) == ["step-1", "step-2"]
    case_id = node.version.case_id
    (failed,) = _events(case_id, "execution.leaf.failed")
    assert failed == {"node": "step-0", "why": "it broke", "blocked": ["step-1", "step-2"]}
    assert _events(case_id, "planning.node.blocked") == [
        {
            "node": key,
            "why": "it needs step-0, which failed",
            "before": {"status": "pending"},
            "after": {"status": "blocked"},
        }
        for key in ("step-1", "step-2")
    ]
    assert dict(
        PlanNode.objects.filter(version_id=node.version_id, kind="leaf").values_list(
            "key", "status"
        )
    ) == {"step-0": "failed", "step-1": "blocked", "step-2": "blocked"}


@pytest.mark.parametrize(
    ("case_status", "policy", "action", "after"),
    [
        (CaseStatus.EXECUTING, "escalate", "execution.leaf.escalated", "awaiting_approval"),
        (CaseStatus.CANCELLED, "abort", "execution.leaf.cancelled", "cancelled"),
    ],
)
def test_a_failed_attempt_that_moves_its_step_without_failing_it_has_an_event_for_the_move(
    analyst: Any, case_status: str, policy: str, action: str, after: str
) -> None:
    from execution.ending import apply_failure

    node = _running_chain_of_three(analyst, case_status=case_status, policy=policy)
    case = Case.objects.get(pk=node.version.case_id)
    with transaction.atomic():
        ended = apply_failure(node, case, 1, error_class="tool_failure", error="it broke")
    assert ended.status == after
    (event,) = _events(case.pk, action)
    assert (event["node"], event["before"], event["after"]) == (
        "step-0",
        {"status": "running"},
        {"status": after},
    )


def test_approving_a_step_gate_records_that_its_step_may_run(analyst: Any, officer: Any) -> None:
    from tests.execution.test_execution import approve, run_ready
    from tests.personas import PASSWORD

    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    run_ready(case)
    gate = Gate.objects.get(case=case, kind=GateKind.STEP, status=GateStatus.PENDING)
    approve(gate, officer, password=PASSWORD)
    (event,) = _events(case.pk, "execution.leaf.approved")
    assert event == {
        "node": "place-hold",
        "gate": gate.pk,
        "before": {"status": "awaiting_approval"},
        "after": {"status": "pending"},
    }


def test_a_moves_fields_are_stored_as_the_orms_update_stores_them(analyst: Any) -> None:
    """JSON, a datetime, None and a foreign key given as a row: stored and read back as set (on
    PostgreSQL by the prepared compare-and-set UPDATE, elsewhere by the ORM's update())."""
    case = planned_invoice_case(analyst)
    node = PlanNode.objects.filter(version=case.current_version, kind="leaf").order_by("pk")[0]
    when = timezone.now().replace(microsecond=123456)
    output = {"findings": ["geprüft ✓", {"n": 1.5, "none": None}], "ok": True}
    with transaction.atomic(), audited(chain=case_chain(case.pk)) as audit:
        move_node(node, to=NodeStatus.READY, audit=audit, enqueued_at=when)
        move_node(
            node,
            to=NodeStatus.RUNNING,
            audit=audit,
            attempts=1,
            started_at=when,
            lease_until=None,
            routing={"agent": node.agent},
            version=case.current_version,
        )
        move_node(
            node, to=NodeStatus.SUCCEEDED, audit=audit, output=output, error="", finished_at=when
        )
        audit.add(NewEvent(MOVED))
    stored = PlanNode.objects.get(pk=node.pk)
    assert stored.status == NodeStatus.SUCCEEDED
    assert (stored.enqueued_at, stored.started_at, stored.finished_at) == (when, when, when)
    assert stored.lease_until is None and stored.attempts == 1
    assert stored.output == output and stored.routing == {"agent": node.agent}
    assert stored.version_id == case.current_version_id
