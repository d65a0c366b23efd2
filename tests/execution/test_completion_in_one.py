"""A worker's completion reads and moves its leaf in one statement (PostgreSQL), and falls back
to reading it under its lock whenever anything is amiss: the outcome is the same either way.

`complete_leaf(..., leaf=claim.node)` is what the worker calls; without `leaf` (a person's
result, a test) the completion reads the leaf first, as before.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.chain import verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from execution.models import ExecutionControl, LeafAttempt
from oversight.models import GateKind
from planning.models import NodeStatus, PlanNode
from tests.cases import planned_invoice_case
from tests.execution.test_execution import _gate, approve, leaves

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement completion"),
]

FIRST_READ = "FOR UPDATE OF n FOR SHARE OF c"


def _started(analyst: Any, officer: Any) -> tuple[Any, Any]:
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    first = leaves(case)["extract-fields"]
    return case, execution.claim_leaf(first.pk, worker="w")


def _complete(claim: Any, *, leaf: bool, **options: Any) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        ended = execution.complete_leaf(
            claim.node_id,
            claim.attempt,
            {"vendor": "ACME"},
            leaf=claim.node if leaf else None,
            **options,
        )
    return ended, [q["sql"] for q in queries.captured_queries]


def _succeeded_event(case: Any) -> dict[str, Any]:
    event = AuditEvent.objects.filter(
        chain=f"case:{case.pk}", action="execution.leaf.succeeded"
    ).get()
    return dict(event.data)


@pytest.mark.parametrize("leaf", [True, False])
def test_a_completion_with_the_claims_leaf_reads_and_moves_it_in_one_statement(
    analyst: Any, officer: Any, leaf: bool
) -> None:
    case, claim = _started(analyst, officer)
    fields = PlanNode._meta.concrete_fields
    ended, statements = _complete(claim, leaf=leaf, keep=1, worker="w")
    reads = [sql for sql in statements if sql.lstrip().startswith("SELECT") and FIRST_READ in sql]
    moves = [sql for sql in statements if '"completing" AS (SELECT' in sql]
    if leaf:
        assert (len(reads), len(moves)) == (0, 1), statements
    else:
        assert (len(reads), len(moves)) == (1, 0), statements
    # the same outcome either way: the leaf succeeded, its dependent is claimed next, one event
    node = leaves(case)["extract-fields"]
    assert node.status == NodeStatus.SUCCEEDED and node.output == {"vendor": "ACME"}
    assert node.lease_until is None and node.finished_after_cancel is False
    if leaf:
        # the claim's instance of the leaf, moved in place, is the row as the statement left it
        assert {f.attname: getattr(claim.node, f.attname) for f in fields} == {
            f.attname: getattr(node, f.attname) for f in fields
        }
        assert claim.node.version.case.current_version_id == node.version_id
    assert ended.status == NodeStatus.SUCCEEDED and ended.claimed is not None
    assert leaves(case)[ended.claimed.key].status == NodeStatus.RUNNING
    data = _succeeded_event(case)
    assert data["released"] == [ended.claimed.key] and data["claimed"]["node"] == ended.claimed.key
    attempts = LeafAttempt.objects.filter(node_id=claim.node_id).values_list("number", "outcome")
    assert dict(attempts) == {1: "succeeded"}
    assert verify_chain(f"case:{case.pk}") == []


def test_a_stale_attempt_with_the_claims_leaf_is_fenced_off(analyst: Any, officer: Any) -> None:
    case, claim = _started(analyst, officer)
    PlanNode.objects.filter(pk=claim.node_id).update(lease_until="2000-01-01T00:00:00Z")
    assert execution.reconcile_execution().recovered == (claim.node_id,)
    second = execution.claim_leaf(claim.node_id, worker="x")
    with pytest.raises(execution.StaleResult):
        _complete(claim, leaf=True)
    assert claim.node.status == NodeStatus.RUNNING  # nothing moved: the claim's instance as was
    node = leaves(case)["extract-fields"]
    assert (node.status, node.attempts) == (NodeStatus.RUNNING, second.attempt)
    refused = AuditEvent.objects.filter(action="execution.leaf.result_refused").get()
    assert refused.data["attempt"] == claim.attempt and refused.data["holder"] == second.attempt


@pytest.mark.parametrize(("kind", "status"), [("tool", "succeeded"), ("llm", "cancelled")])
def test_a_cancelled_cases_leaf_with_the_claims_leaf_ends_as_without_it(
    analyst: Any, officer: Any, kind: str, status: str
) -> None:
    case, claim = _started(analyst, officer)
    execution.cancel_case(case_id=case.pk, user=analyst, reason_code="other", reason="wrong one")
    ended, statements = _complete(claim, leaf=True, kind=kind)
    # the one statement moved nothing (the case no longer runs): the leaf was read, then moved
    assert any(FIRST_READ in sql and '"completing"' not in sql for sql in statements)
    node = leaves(case)["extract-fields"]
    assert ended.status == status and node.status == status
    if kind == "tool":
        assert node.finished_after_cancel is True  # the tool's effect happened: recorded


def test_with_execution_stopped_the_completion_claims_nothing_next(
    analyst: Any, officer: Any
) -> None:
    case, claim = _started(analyst, officer)
    ExecutionControl.objects.update_or_create(pk=1, defaults={"stopped": True})
    ended, _ = _complete(claim, leaf=True, keep=1, worker="w")
    assert ended.status == NodeStatus.SUCCEEDED and ended.claimed is None
    assert [leaves(case)[key].status for key in _succeeded_event(case)["released"]] == [
        NodeStatus.READY
    ]


def test_a_refused_claim_locks_nothing_and_commits_so_the_connection_keeps_its_statements(
    analyst: Any, officer: Any
) -> None:
    """A duplicate message (or one whose step a completion took first) is refused without a lock
    and without a rollback: psycopg deallocates every prepared statement at a rollback, and the
    worker's next claim and completion would be planned again."""
    case, claim = _started(analyst, officer)
    prepared = connection.connection._prepared  # psycopg's cache of the connection's statements
    assert prepared._names, "the claim's statements are prepared"
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(execution.ClaimRefused, match="the leaf is running"),
    ):
        execution.claim_leaf(claim.node_id, worker="other")
    statements = [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in statements if sql.lstrip().upper().startswith("ROLLBACK")], (
        statements
    )
    assert prepared._names, "a refusal keeps the connection's prepared statements"
    # the refusal wrote nothing: the leaf is still the first claim's, with no event of its own
    node = leaves(case)["extract-fields"]
    assert (node.status, node.attempts) == (NodeStatus.RUNNING, claim.attempt)
    assert not AuditEvent.objects.filter(
        chain=f"case:{case.pk}", action="execution.leaf.claimed", data__worker="other"
    ).exists()
    with pytest.raises(execution.ClaimRefused, match="no such leaf"):
        execution.claim_leaf(10**9, worker="other")


def test_prepared_statements_are_planned_once_per_connection() -> None:
    """The hot statements look rows up by key: one generic plan, not a plan at every call."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone() == ("force_generic_plan",)
