"""A worker runs its next leaf while the last one's success is recorded (PostgreSQL).

Each completion claims the leaf the worker runs after the one running now, so a leaf starts as
soon as the one before it ends: its claim was committed by the completion before. The success is
recorded on the worker's completer thread, one at a time and in order. Everything else is as in
the plain loop: one attempt and one `execution.leaf.succeeded` event a leaf, each claim audited
in the completion that made it, a failure recorded on the worker's own thread, the chain whole.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from execution.models import LeafAttempt
from execution.worker import overlapping
from planning.catalogue import sync_packs
from planning.models import CaseStatus, NodeStatus, PlanNode
from tests.casehub.test_observability import delta, scrape, spans  # noqa: F401 (a fixture)
from tests.cases import scripted_case

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the completer's connection"),
    pytest.mark.scenario("P2"),
]


@pytest.fixture
def pack(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings.CASEHUB_EXTRA_PACKS = ["tests.fakes.execution_pack.PACK"]
    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path))
    sync_packs()


def _first(case: Any) -> PlanNode:
    return (
        PlanNode.objects.filter(version=case.current_version, kind="leaf", status=NodeStatus.READY)
        .order_by("position")
        .first()
    )


def test_the_next_leaf_runs_while_the_last_ones_success_is_recorded(
    pack: None, analyst: Any, officer: Any
) -> None:
    width = 3
    leaves = [
        {
            "key": f"l{layer}-{i}",
            "seconds": 0.1,
            "depends_on": [f"l{layer - 1}-{k}" for k in range(width)] if layer else [],
        }
        for layer in range(2)
        for i in range(width)
    ]
    case = scripted_case(analyst, officer, leaves)
    assert overlapping()

    outcomes = execution.execute_leaf(_first(case).pk, worker="w")

    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED
    nodes = PlanNode.objects.filter(version=case.current_version, kind="leaf")
    assert sorted(outcomes) == sorted(f"{n.pk} succeeded" for n in nodes)
    assert {n.status for n in nodes} == {NodeStatus.SUCCEEDED}
    attempts = list(LeafAttempt.objects.filter(node__in=nodes).order_by("started_at"))
    assert [a.outcome for a in attempts] == [LeafAttempt.Outcome.SUCCEEDED] * len(leaves)
    assert len({a.node_id for a in attempts}) == len(leaves)
    # A leaf started before the success of the one before it was recorded (its finished_at is
    # when its completion began): the run overlapped the completion.
    assert any(
        later.started_at < earlier.finished_at for earlier, later in itertools.pairwise(attempts)
    )
    events = AuditEvent.objects.filter(chain=case_chain(case.pk))
    succeeded = [e.data for e in events.filter(action="execution.leaf.succeeded")]
    assert sorted(d["node"] for d in succeeded) == sorted(n.key for n in nodes)
    # Each claim but the first (by its message) is audited once, in the completion that made it.
    claimed = [d[k]["node"] for d in succeeded for k in ("claimed", "claimed_ahead") if k in d]
    assert any("claimed_ahead" in d for d in succeeded)
    assert sorted(claimed) == sorted(n.key for n in nodes if n.pk != attempts[0].node_id)
    assert not events.filter(action="execution.leaf.claimed").exclude(
        data__node=PlanNode.objects.get(pk=attempts[0].node_id).key
    )
    assert verify_chain(case_chain(case.pk)) == []


def test_a_failure_is_recorded_after_the_success_in_flight_and_the_leaf_claimed_ahead_runs(
    pack: None, analyst: Any, officer: Any
) -> None:
    leaves = [
        {"key": "a", "seconds": 0.05},
        {"key": "b", "seconds": 0.05},
        {"key": "c", "tool": "fail", "failure_policy": "continue"},
        {"key": "d", "seconds": 0.05},
    ]
    case = scripted_case(analyst, officer, leaves)

    outcomes = execution.execute_leaf(_first(case).pk, worker="w")

    nodes = {n.key: n for n in PlanNode.objects.filter(version=case.current_version, kind="leaf")}
    assert sorted(outcomes) == sorted(
        f"{n.pk} {'failed' if key == 'c' else 'succeeded'}" for key, n in nodes.items()
    )
    assert nodes["c"].status == NodeStatus.FAILED
    assert {nodes[k].status for k in "abd"} == {NodeStatus.SUCCEEDED}
    assert LeafAttempt.objects.filter(node__in=nodes.values()).count() == len(leaves)
    assert verify_chain(case_chain(case.pk)) == []


def test_the_plain_loop_is_kept_when_overlap_is_off(
    pack: None, analyst: Any, officer: Any, settings: Any
) -> None:
    settings.CASEHUB_LEAF_OVERLAP = 0
    case = scripted_case(analyst, officer, [{"key": f"l{i}", "seconds": 0.05} for i in range(3)])
    assert not overlapping()

    execution.execute_leaf(_first(case).pk, worker="w")

    succeeded = AuditEvent.objects.filter(
        chain=case_chain(case.pk), action="execution.leaf.succeeded"
    )
    assert succeeded.count() == 3
    assert not [e for e in succeeded if "claimed_ahead" in e.data]
    attempts = list(
        LeafAttempt.objects.filter(node__version=case.current_version).order_by("started_at")
    )
    assert all(
        later.started_at >= earlier.finished_at for earlier, later in itertools.pairwise(attempts)
    )


def test_a_short_leafs_success_is_recorded_before_the_next_leaf_starts(
    pack: None, analyst: Any, officer: Any, settings: Any
) -> None:
    """A leaf that ran for less than `CASEHUB_LEAF_OVERLAP_MIN_MS` has its success recorded on
    the worker's own thread, claiming the next leaf as the plain loop does: its completion would
    not hide behind the next leaf, and the hand-over to the completer costs more than it saves."""
    settings.CASEHUB_LEAF_OVERLAP_MIN_MS = 60_000  # every leaf is short
    case = scripted_case(analyst, officer, [{"key": f"l{i}", "seconds": 0.05} for i in range(3)])
    assert overlapping()

    outcomes = execution.execute_leaf(_first(case).pk, worker="w")

    nodes = PlanNode.objects.filter(version=case.current_version, kind="leaf")
    assert sorted(outcomes) == sorted(f"{n.pk} succeeded" for n in nodes)
    succeeded = AuditEvent.objects.filter(
        chain=case_chain(case.pk), action="execution.leaf.succeeded"
    )
    assert not [e for e in succeeded if "claimed_ahead" in e.data]
    assert len([e for e in succeeded if "claimed" in e.data]) == 2  # each claimed the next
    attempts = list(
        LeafAttempt.objects.filter(node__version=case.current_version).order_by("started_at")
    )
    assert len(attempts) == 3
    assert all(
        later.started_at >= earlier.finished_at for earlier, later in itertools.pairwise(attempts)
    )
    assert verify_chain(case_chain(case.pk)) == []


def test_each_leaf_is_one_span_one_timed_run_and_one_claim_when_runs_overlap(
    pack: None,
    analyst: Any,
    officer: Any,
    spans: Any,  # noqa: F811 (the observability tests' fixture, imported above)
) -> None:
    before = scrape()
    width = 2
    case = scripted_case(
        analyst,
        officer,
        [
            {
                "key": f"l{layer}-{i}",
                "depends_on": [f"l0-{k}" for k in range(width)] if layer else [],
            }
            for layer in range(2)
            for i in range(width)
        ],
    )

    execution.execute_leaf(_first(case).pk, worker="w")

    after = scrape()
    nodes = PlanNode.objects.filter(version=case.current_version, kind="leaf")
    assert {n.status for n in nodes} == {NodeStatus.SUCCEEDED}
    leaves = [s for s in spans.get_finished_spans() if s.name == "casehub.leaf"]
    assert sorted(s.attributes["casehub.leaf.key"] for s in leaves) == sorted(n.key for n in nodes)
    assert {s.attributes["casehub.outcome"] for s in leaves} == {"succeeded"}
    runs = delta(
        before, after, "casehub_leaf_duration_seconds_count", kind="tool", outcome="succeeded"
    )
    assert runs == len(nodes)
    assert delta(before, after, "casehub_leaf_events_total", event="claimed") == len(nodes)


def test_each_thread_that_runs_leaves_has_a_completer_of_its_own() -> None:
    """On the threads pool one task's completions do not wait behind another task's."""
    import threading

    from execution.worker import _completer

    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(_completer())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(c) for c in seen}) == 2
    assert _completer() is _completer()
    assert _completer() not in seen
