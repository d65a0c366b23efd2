"""What each pack's goals must leave true, checked against its systems after the last step; and
the in-memory ports' effects, once per idempotency key."""

from __future__ import annotations

from typing import Any

import pytest

from planning.core.catalogue import ToolCall
from planning.core.refs import resolve_inputs
from planning.core.static import StaticDecomposition
from planning.packs import fraud, incident
from planning.packs.fraud.data import InMemoryFraudData
from planning.packs.incident.goal_check import claims_containment, claims_recovery
from planning.packs.incident.infrastructure import InMemoryInfrastructure


def run_plan(pack: Any, inputs: dict[str, Any], port: Any) -> dict[str, Any]:
    """Plan the case statically and run its tool leaves through `port`, each with its own key;
    return the outputs as JSON data, as the case's leaves store them."""
    state = pack.initial_state(inputs)
    plan = StaticDecomposition(pack.methods).plan(pack.goal(), state)
    outputs: dict[str, Any] = {}
    for key in plan.topological_order():
        leaf = plan.leaf(key)
        if leaf.tool is not None:
            acting = port.with_call(ToolCall(idempotency_key=f"case-1:leaf-{key}"))
            result = pack.tool(leaf.tool).run(resolve_inputs(leaf.inputs, outputs), acting)
            outputs[key] = result.model_dump(mode="json")
    return outputs


OUTAGE = {"kind": "database-outage"}


# incident ------------------------------------------------------------------------------------


def test_an_outage_whose_fail_over_restores_the_service_reaches_its_goal() -> None:
    infra = InMemoryInfrastructure()
    outputs = run_plan(incident.PACK, {**OUTAGE, "service": "orders-db"}, infra)
    assert outputs["verify-connectivity"]["reachable"] is True
    assert incident.PACK.goal_check is not None
    findings = incident.PACK.goal_check(outputs, infra)
    assert findings.reached
    assert "orders-db answers on its primary db-orders-2 after the fail-over" in findings.held
    assert any(
        said.startswith("the stakeholders were told")
        and said.endswith("nothing in the estate refutes it")
        for said in findings.held
    ), findings.held


def test_an_outage_whose_fail_over_promotes_a_down_replica_does_not_reach_its_goal() -> None:
    infra = InMemoryInfrastructure()
    outputs = run_plan(incident.PACK, {**OUTAGE, "service": "inventory-db"}, infra)
    assert outputs["fail-over"]["new_primary"] == "db-inventory-2"
    assert outputs["verify-connectivity"]["reachable"] is False
    # The notice says what the check found, so only the outage itself is a finding.
    assert outputs["notify-stakeholders"]["message"] == (
        "Outage of inventory-db: inventory-db does not answer on its primary db-inventory-2; "
        "it is still down"
    )
    assert incident.PACK.goal_check is not None
    assert list(incident.PACK.goal_check(outputs, infra).problems) == [
        "inventory-db does not answer after the fail-over: its primary db-inventory-2 is "
        "unreachable"
    ]


def test_the_check_reads_the_estate_not_the_steps_outputs() -> None:
    infra = InMemoryInfrastructure()
    outputs = run_plan(incident.PACK, {**OUTAGE, "service": "orders-db"}, infra)
    # The service went down again after the last step: the outputs still say reachable.
    infra.primaries["orders-db"] = "db-orders-1"
    assert incident.PACK.goal_check is not None
    assert list(incident.PACK.goal_check(outputs, infra).problems) == [
        "orders-db does not answer after the fail-over: its primary db-orders-1 is unreachable",
        "the stakeholders were told “Outage of orders-db: orders-db answers on its primary "
        "db-orders-2; it is back in service”, but orders-db does not answer: its primary "
        "db-orders-1 is unreachable",
    ]


def test_a_notice_claiming_a_recovery_the_estate_refutes_is_a_finding() -> None:
    infra = InMemoryInfrastructure()
    notice = {
        "service": "inventory-db",
        "recipients": ["warehouse-team@example.com"],
        "message": "inventory-db is back in service",
    }
    assert incident.PACK.goal_check is not None
    assert list(incident.PACK.goal_check({"tell": notice}, infra).problems) == [
        "the stakeholders were told “inventory-db is back in service”, but inventory-db does "
        "not answer: its primary db-inventory-1 is unreachable"
    ]
    honest = {**notice, "message": "inventory-db is not back in service yet"}
    assert list(incident.PACK.goal_check({"tell": honest}, infra).problems) == []
    # The same claim is true of a service that answers.
    true_claim = {**notice, "service": "billing-db", "message": "billing-db is back in service"}
    assert list(incident.PACK.goal_check({"tell": true_claim}, infra).problems) == []


@pytest.mark.parametrize(
    ("text", "claims"),
    [
        ("orders-db is back in service", True),
        ("Service restored at 03:40", True),
        ("orders-db has recovered", True),
        ("orders-db is down; recovery under way", False),
        ("orders-db is not back in service", False),
        ("orders-db has not been restored", False),
        ("orders-db does not answer on its primary db-orders-1; it is still down", False),
        ("security breach contained", False),
    ],
)
def test_a_notice_claims_a_recovery_only_in_words_that_say_so(text: str, claims: bool) -> None:
    assert claims_recovery(text) is claims


@pytest.mark.parametrize(
    ("text", "claims"),
    [
        ("security breach contained: web-2 isolated", True),
        ("the breach is not contained yet", False),
        ("orders-db is back in service", False),
    ],
)
def test_a_notice_claims_a_containment_only_in_words_that_say_so(text: str, claims: bool) -> None:
    assert claims_containment(text) is claims


def test_isolated_hosts_must_no_longer_answer() -> None:
    infra = InMemoryInfrastructure()
    inputs = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
    outputs = run_plan(incident.PACK, inputs, infra)
    assert outputs["isolate-systems"] == {"isolated": ["web-2"]}
    assert incident.PACK.goal_check is not None
    assert list(incident.PACK.goal_check(outputs, infra).problems) == []
    infra.isolated.clear()  # the host came back on the network after the last step
    message = outputs["announce-containment"]["message"]
    assert message.startswith("security breach contained")
    assert list(incident.PACK.goal_check(outputs, infra).problems) == [
        "web-2 still answers on the network after its isolation",
        f"the stakeholders were told “{message}”, but web-2 still answers on the network",
    ]


def test_the_in_memory_estate_acts_once_per_key() -> None:
    infra = InMemoryInfrastructure()
    first = infra.with_call(ToolCall(idempotency_key="leaf-fail-over"))
    assert first.fail_over("orders-db") == ("db-orders-1", "db-orders-2")
    again = infra.with_call(ToolCall(idempotency_key="leaf-fail-over"))
    assert again.fail_over("orders-db") == ("db-orders-1", "db-orders-2")
    assert infra.primary("orders-db") == "db-orders-2"  # not failed back
    other = infra.with_call(ToolCall(idempotency_key="another-leaf"))
    assert other.fail_over("orders-db") == ("db-orders-2", "db-orders-1")
    for _ in range(2):
        infra.with_call(ToolCall(idempotency_key="leaf-notify")).send(["a@example.com"], "hi")
        infra.with_call(ToolCall(idempotency_key="leaf-isolate")).isolate(["web-2", "nope"])
    assert infra.sent == [(("a@example.com",), "hi")]
    assert infra.isolated == {"web-2"}


def test_the_demo_estate_names_a_service_a_fail_over_restores_and_one_it_does_not() -> None:
    infra = InMemoryInfrastructure()
    for service, restored in (("orders-db", True), ("inventory-db", False)):
        assert not infra.is_reachable(infra.primary(service))
        _, new = infra.fail_over(service)
        assert infra.is_reachable(new) is restored
    assert infra.is_reachable(infra.primary("billing-db"))


# fraud ---------------------------------------------------------------------------------------


def test_a_serious_fraud_case_reaches_its_goal_once_the_freeze_is_on_the_account() -> None:
    data = InMemoryFraudData()
    freeze = data.with_call(ToolCall(idempotency_key="leaf-freeze")).freeze("ACC-300", "findings")
    outputs = {"freeze-account": {"account_id": "ACC-300", "freeze_id": freeze}}
    assert fraud.PACK.goal_check is not None
    assert list(fraud.PACK.goal_check(outputs, data).problems) == []
    assert list(fraud.PACK.goal_check(outputs, InMemoryFraudData()).problems) == [
        f"ACC-300 is not frozen: freeze {freeze} is not on the account"
    ]


def test_a_light_fraud_case_decides_nothing_on_the_account() -> None:
    summary = {"account_id": "ACC-410", "count": 1, "total": "60.00", "counterparties": ["Books"]}
    assert fraud.PACK.goal_check is not None
    assert (
        list(fraud.PACK.goal_check({"pull-transactions": summary}, InMemoryFraudData()).problems)
        == []
    )


def test_the_in_memory_account_data_freezes_once_per_key() -> None:
    data = InMemoryFraudData()
    ids = {
        data.with_call(ToolCall(idempotency_key="leaf-freeze")).freeze("ACC-300", "findings")
        for _ in range(3)
    }
    assert len(ids) == 1
    assert data.freezes("ACC-300") == tuple(ids)
    assert data.freezes("ACC-410") == ()
