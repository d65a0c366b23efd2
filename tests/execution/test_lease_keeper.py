"""The worker's lease keeper: one thread per process renews the leases of the attempts it holds
(the one it runs, and the one it claimed to run next)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from execution import actions as execution
from execution.worker import _LeaseKeeper
from oversight.models import Gate, GateKind
from planning.models import NodeStatus, PlanNode
from tests.cases import planned_invoice_case
from tests.execution.test_execution import approve, leaves

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S = 0.6  # renewed every 0.2 s


def _lease(node_id: int) -> datetime:
    lease = PlanNode.objects.values_list("lease_until", flat=True).get(pk=node_id)
    assert lease is not None
    return lease


def _eventually(check: Callable[[], bool], *, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def claimed(analyst: Any, officer: Any, settings: Any) -> execution.Claim:
    settings.CASEHUB_LEAF_LEASE_S = LEASE_S
    settings.CASEHUB_LEAF_HARD_LIMIT_S = 60
    case = planned_invoice_case(analyst)
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    return execution.claim_leaf(leaves(case)["extract-fields"].pk, worker="w")


def test_the_held_attempts_lease_is_renewed_by_one_thread_until_it_is_released(
    claimed: execution.Claim,
) -> None:
    keeper = _LeaseKeeper()
    first = _lease(claimed.node_id)
    keeper.hold(claimed)
    thread = keeper._thread
    assert _eventually(lambda: _lease(claimed.node_id) > first)
    keeper.release(claimed)
    time.sleep(LEASE_S / 3)  # a renewal under way when it was released ends
    after = _lease(claimed.node_id)
    time.sleep(LEASE_S)  # three renewals' time
    assert _lease(claimed.node_id) == after
    # The next leaf's claim is kept by the same thread, woken from its wait.
    keeper.hold(claimed)
    assert _eventually(lambda: _lease(claimed.node_id) > after)
    assert keeper._thread is thread and thread is not None and thread.is_alive()
    keeper.release(claimed)


def test_a_lease_is_not_renewed_past_the_hard_limit_nor_for_an_attempt_that_lost_its_leaf(
    claimed: execution.Claim, settings: Any
) -> None:
    settings.CASEHUB_LEAF_HARD_LIMIT_S = LEASE_S
    keeper = _LeaseKeeper()
    first = _lease(claimed.node_id)
    keeper.hold(claimed)
    assert _eventually(lambda: _lease(claimed.node_id) > first)
    # Past the hard limit the keeper lets the claim go: the lease runs out.
    assert _eventually(lambda: not keeper._claims)
    last = _lease(claimed.node_id)
    time.sleep(LEASE_S)
    assert _lease(claimed.node_id) == last

    settings.CASEHUB_LEAF_HARD_LIMIT_S = 60
    keeper.hold(claimed)
    # Another attempt took the leaf: the renewal changes nothing and the claim is dropped.
    PlanNode.objects.filter(pk=claimed.node_id).update(attempts=claimed.attempt + 1)
    assert _eventually(lambda: not keeper._claims)
    node = PlanNode.objects.get(pk=claimed.node_id)
    assert node.status == NodeStatus.RUNNING and node.lease_until == last


def test_the_leaf_claimed_ahead_keeps_its_lease_while_the_one_before_it_runs(
    claimed: execution.Claim, analyst: Any, officer: Any
) -> None:
    """A worker holds the leaf it runs and the one its last completion claimed for it next:
    both leases are renewed, each until it is released."""
    case = planned_invoice_case(analyst)
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    other = execution.claim_leaf(leaves(case)["extract-fields"].pk, worker="w")
    keeper = _LeaseKeeper()
    firsts = _lease(claimed.node_id), _lease(other.node_id)
    keeper.hold(claimed)
    keeper.hold(other)
    assert _eventually(
        lambda: _lease(claimed.node_id) > firsts[0] and _lease(other.node_id) > firsts[1]
    )
    keeper.release(claimed)
    time.sleep(LEASE_S / 3)
    released = _lease(claimed.node_id)
    kept = _lease(other.node_id)
    time.sleep(LEASE_S)
    assert _lease(claimed.node_id) == released
    assert _lease(other.node_id) > kept
    keeper.release(other)
