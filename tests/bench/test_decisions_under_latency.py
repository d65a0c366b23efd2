"""Ten officers deciding one gate at once through 200 ms of added database latency (P4, small)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from accounts import roles
from audit.chain import case_chain
from audit.models import AuditEvent
from bench.delay_proxy import ProxyThread
from oversight.actions import gates
from oversight.actions.gates import DecisionInput
from oversight.models import Gate, GateDecision, GateKind
from tests import personas
from tests.cases import planned_invoice_case

OFFICERS = 10
DELAY_EACH_WAY_S = 0.1  # 200 ms added to every round trip to PostgreSQL


@pytest.mark.scenario("P4")
@pytest.mark.django_db(transaction=True)
def test_ten_officers_racing_through_added_latency_make_exactly_one_decision() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the delay sits on the TCP path to PostgreSQL (CI runs it)")
    case = planned_invoice_case(personas.analyst())
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
    officers = [personas.make_user(f"officer-{i}", roles.OFFICER) for i in range(OFFICERS)]
    proxies = ProxyThread()
    target = connection.settings_dict
    proxy = proxies.add("127.0.0.1", int(target.get("PORT") or 5432), delay_s=DELAY_EACH_WAY_S)
    barrier = threading.Barrier(OFFICERS)
    outcomes: list[str] = []

    def decide(user: Any, decision: str) -> None:
        # This thread's own connection goes through the proxy to the same test database.
        connection.settings_dict = {**target, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
        try:
            barrier.wait()
            gates.decide_gate(
                gate_id=gate.pk,
                user=user,
                decision=DecisionInput(decision=decision, reason_code="incorrect"),
            )
            outcomes.append("decided")
        except gates.GateConflict:
            outcomes.append("conflict")
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(user, "approve" if i % 2 else "reject"))
        for i, user in enumerate(officers)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        proxies.close()
    assert proxy.connections >= OFFICERS  # every decision went through the delay
    assert sorted(outcomes) == ["conflict"] * (OFFICERS - 1) + ["decided"]
    assert GateDecision.objects.filter(gate=gate).count() == 1
    decided = AuditEvent.objects.filter(chain=case_chain(case.pk), action="oversight.gate.decided")
    assert decided.count() == 1
