"""Random sequences of oversight and execution actions keep the invariants (RELIABILITY S12).

A Hypothesis state machine drives the real actions, the ones views, the API and tasks call:
submitting and planning cases of the scripted packs (tests/fakes: `execution_pack`, whose tools
count effects by idempotency key, and `replan_pack`, whose steps fail into a re-plan), deciding
gates (approve, reject with each reason code), editing a step, cancelling, the global stop and
resume, running a leaf as a worker does (`execute_leaf`: claim, run the fake tool, complete, and
the next claim), failing an attempt under each failure policy, expiring an approval, losing a
worker (a claim abandoned, its lease in the past), delivering a leaf's message twice, and the
reconciler. After every rule:

- every attempt claimed in the rule had, at its claim, a live approval: the plan gate of its
  version for that version's content hash, and its own step gate (or the escalation approved
  after that gate's rejection) for its content hash, none of them expired, and no newer version;
- no effect happened twice, and none without a success recorded (the effect files per key);
- every status of a case, node, gate or work item that changed has an audit event of the rule
  naming it;
- every chain the rule wrote to verifies;
- after a reconciler pass, no case is stuck (`execution.liveness.why_stuck`), and every case that
  awaits approval has an open gate.

The normal run is derandomized with 100 sequences (about two minutes); `make fuzz` runs many more
(`CASEHUB_FUZZ_EXAMPLES`, `CASEHUB_FUZZ_STEPS`). PostgreSQL only: row locks and SKIP LOCKED are
what the actions rely on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from accounts.roles import SUPERVISOR
from audit.chain import verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from execution.liveness import stuck_cases
from execution.models import LeafAttempt, WorkItem
from oversight.actions.edits import EditInvalid, EditRefused, can_edit, edit_plan
from oversight.actions.gates import (
    DecisionDenied,
    DecisionInput,
    GateConflict,
    can_decide,
    decide_gate,
)
from oversight.models import OPEN_GATE_STATUSES, Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from tests import personas
from tests.fakes import execution_pack, replan_pack

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("CASEHUB_FUZZ_EXAMPLES", "100"))
STEPS = int(os.environ.get("CASEHUB_FUZZ_STEPS", "40"))
POLICIES = ("abort", "continue", "retry", "escalate", "replan")
REJECT_CODES = (
    "incorrect",
    "incomplete",
    "too-risky",
    "wrong-agent",
    "duplicate",
    "policy",
    "other",
)


def effect_name(case_id: int, key: str) -> str:
    """The effect file of a step (EffectsPort's naming, from the documented idempotency key)."""
    return hashlib.sha256(f"casehub:case-{case_id}:leaf-{key}".encode()).hexdigest()[:32]


def snapshot() -> dict[tuple[str, int], tuple[int, str]]:
    """Every status of cases, nodes, gates and work items: (kind, id) → (case id, status)."""
    rows: dict[tuple[str, int], tuple[int, str]] = {}
    for pk, status in Case.objects.values_list("pk", "status"):
        rows["case", pk] = (pk, status)
    for pk, case_id, status in PlanNode.objects.values_list("pk", "version__case_id", "status"):
        rows["node", pk] = (case_id, status)
    for pk, case_id, status in Gate.objects.values_list("pk", "case_id", "status"):
        rows["gate", pk] = (case_id, status)
    for pk, case_id, status in WorkItem.objects.values_list("pk", "case_id", "status"):
        rows["work_item", pk] = (case_id, status)
    return rows


def named_nodes(data: dict[str, Any]) -> set[str]:
    """The step keys an event's data names."""
    names: set[str] = set()
    if isinstance(data.get("node"), str):
        names.add(data["node"])
    for field in ("nodes", "blocked", "released", "cancelled", "kept", "carried"):
        value = data.get(field)
        if isinstance(value, list):
            names |= {v for v in value if isinstance(v, str)}
    for field in ("claimed", "claimed_ahead"):
        claimed = data.get(field)
        if isinstance(claimed, dict) and isinstance(claimed.get("node"), str):
            names.add(claimed["node"])
    return names


# Case-level events under which a node's status may change without the event naming it: a case
# that ends cancels its open steps; a plan version stored brings its steps (and the case awaits
# its approval).
CASE_ENDED = {
    "planning.case.cancelled",
    "planning.case.failed",
    "planning.case.completed",
    "planning.case.rejected",
    "execution.case.stuck",
}
PLAN_STORED = {"planning.plan.materialised", "planning.plan.edited", "planning.plan.replanned"}


class Oversight(RuleBasedStateMachine):
    """The cases of one example, driven through the real actions."""

    def __init__(self) -> None:
        super().__init__()
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        self.effects = Path(tempfile.mkdtemp(prefix="casehub-fuzz-"))
        os.environ["CASEHUB_TEST_EFFECTS_DIR"] = str(self.effects)
        self.cases: list[int] = []
        self.users = USERS
        self.mark()

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)
        shutil.rmtree(self.effects, ignore_errors=True)

    # What a rule changed -----------------------------------------------------------------------

    def mark(self) -> None:
        self.before = snapshot()
        self.last_event = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
        self.last_attempt = (
            LeafAttempt.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        )

    def new_events(self) -> list[AuditEvent]:
        return list(AuditEvent.objects.filter(pk__gt=self.last_event or 0).order_by("pk"))

    # Picking -----------------------------------------------------------------------------------

    def leaves(self, *statuses: str) -> list[PlanNode]:
        return list(
            PlanNode.objects.filter(
                version__case_id__in=self.cases, kind=PlanNode.Kind.LEAF, status__in=statuses
            )
            .select_related("version__case")
            .order_by("pk")
        )

    def current(self, nodes: list[PlanNode]) -> list[PlanNode]:
        return [n for n in nodes if n.version.case.current_version_id == n.version_id]

    def open_gates(self) -> list[Gate]:
        return list(
            Gate.objects.filter(case_id__in=self.cases, status__in=OPEN_GATE_STATUSES)
            .select_related("case", "version", "node")
            .order_by("pk")
        )

    def decider(self, gate: Gate) -> Any | None:
        for user in (self.users["officer"], self.users["second"], self.users["supervisor"]):
            if can_decide(user, gate) is None:
                return user
        return None

    # Rules -------------------------------------------------------------------------------------

    @initialize(
        script=st.lists(
            st.tuples(
                st.sampled_from(("effect", "flaky", "fail")),
                st.sampled_from(POLICIES),
                st.sampled_from((None, None, "write")),
                st.sets(st.integers(0, 3), max_size=2),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def first_case(self, script: list[tuple[str, str, str | None, set[int]]]) -> None:
        self.submit_script(script)

    @precondition(lambda self: len(self.cases) < 3)
    @rule(
        failing=st.sets(st.sampled_from(("primary", "mirror"))),
        policy=st.sampled_from(POLICIES),
        parallel=st.booleans(),
    )
    def submit_replan_case(self, failing: set[str], policy: str, parallel: bool) -> None:
        self.submit(
            replan_pack.SLUG,
            {
                "sources": ["primary", "mirror"],
                "failing": sorted(failing),
                "failure_policy": policy,
                "parallel": parallel,
            },
        )

    def submit_script(self, script: list[tuple[str, str, str | None, set[int]]]) -> None:
        leaves = [
            {
                "key": f"s{i}",
                "tool": tool,
                "failures": 1 if tool == "flaky" else 0,
                "failure_policy": policy,
                "risk": risk,
                "depends_on": [f"s{d}" for d in sorted(deps) if d < i],
            }
            for i, (tool, policy, risk, deps) in enumerate(script)
        ]
        self.submit(execution_pack.SLUG, {"leaves": leaves})

    def submit(self, domain: str, inputs: dict[str, Any]) -> None:
        case = submit_case(
            submitter=self.users["analyst"],
            title="Fuzzed",
            goal="Run the fuzzed plan",
            domain=domain,
            strategy="static",
            inputs=inputs,
        )
        materialise_plan(case.pk)
        self.cases.append(case.pk)

    @rule(i=st.integers(0, 20), password=st.booleans())
    def approve(self, i: int, password: bool) -> None:
        gates = self.open_gates()
        if not gates:
            return
        gate = gates[i % len(gates)]
        user = self.decider(gate)
        if user is None:
            return
        secret = personas.PASSWORD if password or gate.needs_signature else None
        with contextlib.suppress(GateConflict, DecisionDenied):
            decide_gate(
                gate_id=gate.pk,
                user=user,
                decision=DecisionInput(decision="approve", password=secret),
            )

    @rule(i=st.integers(0, 20), code=st.sampled_from(REJECT_CODES), go=st.integers(0, 3))
    def reject(self, i: int, code: str, go: int) -> None:
        gates = self.open_gates()
        if not gates:
            return
        gate = gates[i % len(gates)]
        if gate.kind == GateKind.PLAN and go:
            return  # a rejected plan ends its case: rarer, so that cases get to run
        user = self.decider(gate)
        if user is None:
            return
        decision = DecisionInput(decision="reject", reason_code=code, reason=f"fuzzed: {code}")
        with contextlib.suppress(GateConflict, DecisionDenied):
            decide_gate(gate_id=gate.pk, user=user, decision=decision)

    @rule(i=st.integers(0, 20), j=st.integers(0, 20))
    def edit_a_step(self, i: int, j: int) -> None:
        cases = list(
            Case.objects.filter(pk__in=self.cases, status=CaseStatus.AWAITING_APPROVAL).order_by(
                "pk"
            )
        )
        if not cases:
            return
        case = cases[i % len(cases)]
        leaves = list(
            PlanNode.objects.filter(version_id=case.current_version_id, kind=PlanNode.Kind.LEAF)
            .order_by("pk")
            .values_list("key", flat=True)
        )
        key = leaves[j % len(leaves)]
        user = next(
            u for u in (self.users["officer"], self.users["second"]) if can_edit(u, case) is None
        )
        with contextlib.suppress(EditRefused, EditInvalid, DecisionDenied):
            edit_plan(
                case_id=case.pk,
                user=user,
                node_key=key,
                changes={"task": f"do {key}, edited ({j})"},
                reason_code="incomplete",
                reason="fuzzed edit",
            )

    @rule(i=st.integers(0, 20), go=st.integers(0, 4))
    def cancel(self, i: int, go: int) -> None:
        if not self.cases or go:
            return  # a cancel ends its case: rarer, so that cases get to run
        case_id = self.cases[i % len(self.cases)]
        with contextlib.suppress(execution.CaseNotRunning):
            execution.cancel_case(
                case_id=case_id, user=self.users["officer"], reason_code="duplicate", reason="x"
            )

    @rule(go=st.integers(0, 3))
    def stop_or_resume(self, go: int) -> None:
        # Stopping is rarer than resuming, so that cases get to run.
        execution.set_stopped(stopped=not go, user=self.users["admin"], reason="fuzzed")

    @rule(i=st.integers(0, 20))
    def progress(self, i: int) -> None:
        """Approve an open gate, then run every ready leaf once, as busy officers and workers do."""
        self.approve(i, password=True)
        for node in self.leaves(NodeStatus.READY):
            execution.execute_leaf(node.pk, worker="busy")

    @rule(j=st.integers(0, 20))
    def run_leaf(self, j: int) -> None:
        ready = self.leaves(NodeStatus.READY, NodeStatus.RETRYING)
        if ready:
            execution.execute_leaf(ready[j % len(ready)].pk, worker="fuzz")

    @rule(j=st.integers(0, 20), error_class=st.sampled_from(("transient", "tool_failure")))
    def fail_leaf(self, j: int, error_class: str) -> None:
        ready = self.leaves(NodeStatus.READY)
        if not ready:
            return
        try:
            claim = execution.claim_leaf(ready[j % len(ready)].pk, worker="fuzz")
        except execution.ClaimRefused:
            return
        execution.fail_leaf(claim.node_id, claim.attempt, error_class=error_class, error="fuzzed")

    @rule(i=st.integers(0, 20))
    def expire_approval(self, i: int) -> None:
        if not self.cases:
            return
        case_id = self.cases[i % len(self.cases)]
        Gate.objects.filter(case_id=case_id, status=GateStatus.APPROVED).update(
            approval_expires_at=timezone.now() - timedelta(seconds=1)
        )

    @rule(j=st.integers(0, 20))
    def lose_a_worker(self, j: int) -> None:
        ready = self.leaves(NodeStatus.READY)
        if not ready:
            return
        try:
            claim = execution.claim_leaf(ready[j % len(ready)].pk, worker="doomed")
        except execution.ClaimRefused:
            return
        PlanNode.objects.filter(pk=claim.node_id).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )

    @rule(j=st.integers(0, 20))
    def duplicate_message(self, j: int) -> None:
        ready = self.leaves(NodeStatus.READY)
        if not ready:
            return
        node = ready[j % len(ready)]
        execution.execute_leaf(node.pk, worker="first")
        before = self.invocations()
        outcomes = execution.execute_leaf(node.pk, worker="second")
        node.refresh_from_db()
        if node.status != NodeStatus.READY:
            # The leaf is not ready again (the first delivery ran it): the second runs nothing.
            assert outcomes == [f"{node.pk} refused: the leaf is {node.status}"], outcomes
            assert self.invocations() == before

    @rule()
    def reconcile(self) -> None:
        execution.reconcile_execution()
        stuck = stuck_cases()
        assert not stuck, f"stuck after a reconciler pass: {stuck}"

    # Invariants --------------------------------------------------------------------------------

    def invocations(self) -> dict[str, int]:
        return {p.name: len(p.read_text().splitlines()) for p in self.effects.glob("*.invocations")}

    @invariant()
    def after_each_rule(self) -> None:
        try:
            self.claims_were_approved()
            self.effects_once()
            self.changes_audited()
            self.chains_verify()
            self.awaiting_cases_have_a_gate()
        finally:
            self.mark()

    def claims_were_approved(self) -> None:
        attempts = LeafAttempt.objects.filter(pk__gt=self.last_attempt).select_related(
            "node__version"
        )
        for attempt in attempts:
            problem = approval_problem(attempt.node, attempt.started_at)
            assert problem is None, f"{attempt.node.key} attempt {attempt.number}: {problem}"

    def effects_once(self) -> None:
        expected: dict[str, tuple[int, str]] = {}
        for case_id, key in PlanNode.objects.filter(
            version__case_id__in=self.cases, kind=PlanNode.Kind.LEAF
        ).values_list("version__case_id", "key"):
            expected[effect_name(case_id, key)] = (case_id, key)
        effects = sorted(p.stem for p in self.effects.glob("*.effect"))
        for name in effects:
            assert name in expected, f"an effect under an unknown idempotency key: {name}"
            case_id, key = expected[name]
            succeeded = PlanNode.objects.filter(
                version__case_id=case_id, key=key, status=NodeStatus.SUCCEEDED
            )
            # An attempt may act and then lose its lease: its successor succeeds without acting.
            ran = LeafAttempt.objects.filter(node__version__case_id=case_id, node__key=key)
            assert succeeded.exists() or ran.exists(), f"{key} of case {case_id} acted unclaimed"
        for output in PlanNode.objects.filter(
            version__case_id__in=self.cases, status=NodeStatus.SUCCEEDED, kind=PlanNode.Kind.LEAF
        ).values_list("output", flat=True):
            assert output.get("effects") == 1, f"an effect happened {output.get('effects')} times"

    def changes_audited(self) -> None:
        after = snapshot()
        events = self.new_events()
        by_chain: dict[str, list[AuditEvent]] = {}
        for event in events:
            by_chain.setdefault(event.chain, []).append(event)
        keys = dict(
            PlanNode.objects.filter(version__case_id__in=self.cases).values_list("pk", "key")
        )
        problems = []
        for (kind, pk), (case_id, status) in after.items():
            was = self.before.get((kind, pk))
            if was is not None and was[1] == status:
                continue
            mine = by_chain.get(f"case:{case_id}", [])
            if not audited(kind, pk, keys.get(pk, ""), was is None, status, mine):
                problems.append(
                    f"{kind} {pk} ({keys.get(pk, '')}) of case {case_id}: "
                    f"{was[1] if was else 'new'} → {status}; events: {[e.action for e in mine]}"
                )
        assert not problems, "status changes without an audit event:\n" + "\n".join(problems)

    def chains_verify(self) -> None:
        for chain in {e.chain for e in self.new_events()}:
            assert verify_chain(chain) == [], chain

    def awaiting_cases_have_a_gate(self) -> None:
        for case in Case.objects.filter(pk__in=self.cases, status=CaseStatus.AWAITING_APPROVAL):
            assert Gate.objects.filter(
                version_id=case.current_version_id, status__in=OPEN_GATE_STATUSES
            ).exists(), f"case {case.pk} awaits approval with no open gate"


def audited(kind: str, pk: int, key: str, new: bool, status: str, events: list[AuditEvent]) -> bool:
    """Tell whether one of the rule's events of the case records this status change."""
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        after = data.get("after")
        if kind == "case":
            if isinstance(after, dict) and after.get("status") == status:
                return True
            if event.action in PLAN_STORED and status == CaseStatus.AWAITING_APPROVAL:
                return True
        elif kind == "gate":
            if pk in (data.get("gate"), data.get("replaces")):
                return True
        elif kind == "node":
            if key in named_nodes(data):
                return True
            if new and event.action in PLAN_STORED:
                return True
            if status == NodeStatus.CANCELLED and event.action in CASE_ENDED:
                return True
        elif key in named_nodes(data) or pk in (data.get("work_item"), data.get("item")):
            return True
    return False


def live_at(gates: list[Gate], when: datetime) -> Gate | None:
    """The newest of the gates opened by then."""
    opened = [g for g in gates if g.opened_at <= when]
    return max(opened, key=lambda g: g.pk) if opened else None


def approved_at(gate: Gate, when: datetime, content_hash: str) -> str | None:
    """Why the gate did not hold an approval of `content_hash` at `when`, or None."""
    if gate.status not in (GateStatus.APPROVED, GateStatus.VOID) or gate.decided_at is None:
        return f"gate {gate.pk} ({gate.kind}) is {gate.status}, not approved"
    if gate.decided_at > when:
        return f"gate {gate.pk} ({gate.kind}) was approved after the claim"
    if gate.approval_expires_at is not None and gate.approval_expires_at <= when:
        return f"gate {gate.pk} ({gate.kind}) approval had expired"
    if gate.content_hash != content_hash:
        return f"gate {gate.pk} ({gate.kind}) approved another content hash"
    return None


def approval_problem(node: PlanNode, when: datetime) -> str | None:
    """Why a claim of `node` at `when` ran without a current, unexpired approval, or None."""
    version = node.version
    newer = PlanVersion.objects.filter(
        case_id=version.case_id, number__gt=version.number, created_at__lte=when
    )
    if newer.exists():
        return f"plan version {version.number} was replaced before the claim"
    gates = list(Gate.objects.filter(version=version).order_by("pk"))
    plan = live_at([g for g in gates if g.kind == GateKind.PLAN], when)
    if plan is None:
        return "no plan gate"
    if (why := approved_at(plan, when, version.content_hash)) is not None:
        return why
    step = live_at([g for g in gates if g.kind == GateKind.STEP and g.node_id == node.pk], when)
    if step is None:
        return None
    if step.status == GateStatus.REJECTED and step.decided_at and step.decided_at <= when:
        escalations = [
            g
            for g in gates
            if g.kind == GateKind.ESCALATION and g.node_id == node.pk and g.pk > step.pk
        ]
        escalation = live_at(escalations, when)
        if escalation is None:
            return "its step gate was rejected and no escalation approved it"
        return approved_at(escalation, when, node.content_hash)
    return approved_at(step, when, node.content_hash)


USERS: dict[str, Any] = {}


@pytest.fixture
def fuzz_setup(settings: Any) -> Iterator[None]:
    if connection.vendor != "postgresql":
        pytest.skip("row locks and SKIP LOCKED need PostgreSQL (CI runs it)")
    settings.CASEHUB_EXTRA_PACKS = [
        "tests.fakes.execution_pack.PACK",
        replan_pack.PATH,
    ]
    settings.CASEHUB_LEAF_RETRY_BASE_S = 0
    settings.CASEHUB_LEAF_RETRY_MAX_S = 0
    settings.CASEHUB_GOAL_JUDGE_MODEL = ""
    sync_packs()
    USERS.update(
        analyst=personas.analyst(),
        officer=personas.officer(),
        second=personas.second_officer(),
        supervisor=personas.make_user("sue", SUPERVISOR),
        admin=personas.admin(),
    )
    saved = os.environ.get("CASEHUB_TEST_EFFECTS_DIR")
    yield
    USERS.clear()
    if saved is None:
        os.environ.pop("CASEHUB_TEST_EFFECTS_DIR", None)
    else:
        os.environ["CASEHUB_TEST_EFFECTS_DIR"] = saved


@pytest.mark.scenario("S12", "S8")
def test_random_sequences_of_actions_keep_the_invariants(fuzz_setup: None) -> None:
    run_state_machine_as_test(
        Oversight,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            derandomize=os.environ.get("CASEHUB_FUZZ_EXAMPLES") is None,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
