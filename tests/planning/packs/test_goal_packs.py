"""Goal-oriented (GOAP) planning over the domain packs' capabilities."""

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from planning.core.dag import DagPlan
from planning.core.errors import GoalAlreadySatisfied, NoMethodMatched
from planning.core.goal import Capability, GoalOrientedDecomposition
from planning.core.pack import DomainPack
from planning.core.refs import resolve_inputs
from planning.core.static import StaticDecomposition
from planning.core.validation import validate_plan
from planning.packs import PACKS, fraud, incident, invoice
from planning.packs.fraud.data import InMemoryFraudData
from planning.packs.incident.infrastructure import InMemoryInfrastructure
from planning.packs.invoice.erp import InMemoryErp

DEMO_INPUTS: dict[str, list[dict[str, Any]]] = {
    "invoice": [
        {"invoice_id": "INV-1042"},
        {"invoice_id": "INV-1044", "check_purchase_order": False, "hold_on_findings": False},
    ],
    "fraud": [
        {"account_id": "ACC-300", "amount": "12500"},
        {"account_id": "ACC-410", "amount": "120"},
    ],
    "incident": [
        {"kind": "database-outage", "service": "orders-db"},
        {"kind": "database-outage", "service": "orders-db", "severity": "sev1"},
        {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]},
    ],
}


def goal_plan(
    pack: DomainPack,
    inputs: Mapping[str, Any],
    capabilities: tuple[Capability, ...] | None = None,
) -> DagPlan:
    state = pack.initial_state(inputs)
    caps = pack.capabilities_for(state) if capabilities is None else capabilities
    plan = GoalOrientedDecomposition(caps, pack.goal_facts_for(state)).plan(pack.goal(), state)
    validate_plan(plan, pack.catalogue())
    return plan


def plan_statically(pack: DomainPack, state: Mapping[str, Any]) -> DagPlan:
    return StaticDecomposition(pack.methods).plan(pack.goal(), state)


def with_cost(caps: tuple[Capability, ...], name: str, cost: float) -> tuple[Capability, ...]:
    assert name in {c.name for c in caps}
    return tuple(dataclasses.replace(c, cost=cost) if c.name == name else c for c in caps)


def without(caps: tuple[Capability, ...], name: str) -> tuple[Capability, ...]:
    assert name in {c.name for c in caps}
    return tuple(c for c in caps if c.name != name)


def run_tools(pack: DomainPack, plan: DagPlan, port: Any) -> dict[str, Any]:
    """Run every tool leaf in dependency order (human and LLM leaves produce nothing here)."""
    outputs: dict[str, Any] = {}
    for key in plan.topological_order():
        leaf = plan.leaf(key)
        if leaf.tool is not None:
            outputs[key] = pack.tool(leaf.tool).run(resolve_inputs(leaf.inputs, outputs), port)
    return outputs


@pytest.mark.parametrize(
    ("slug", "inputs"),
    [(slug, inputs) for slug, cases in DEMO_INPUTS.items() for inputs in cases],
)
def test_every_pack_plans_its_demo_cases_goal_oriented(slug, inputs):
    pack = PACKS[slug]
    state = pack.initial_state(inputs)
    plan = pack.goal_planner(state).plan(pack.goal(), state)
    validate_plan(plan, pack.catalogue())
    assert plan.root.key == pack.root_task
    assert plan.root.provenance.strategy == "goal"
    assert all(leaf.provenance.strategy == "goal" for leaf in plan.leaves)
    assert all(leaf.provenance.source == leaf.key for leaf in plan.leaves)


@pytest.mark.parametrize("slug", sorted(DEMO_INPUTS))
def test_every_capability_uses_an_agent_and_tool_of_its_pack(slug):
    pack = PACKS[slug]
    catalogue = pack.catalogue()
    for inputs in DEMO_INPUTS[slug]:
        caps = pack.capabilities_for(pack.initial_state(inputs))
        assert caps
        for cap in caps:
            agent = catalogue.agents[cap.agent]
            if cap.tool is None:
                assert agent.kind in ("llm", "human"), cap.name
            else:
                assert cap.tool in agent.tools, cap.name
                assert cap.expected_output == catalogue.tools[cap.tool].output_model.__name__
                if catalogue.tools[cap.tool].risk in ("financial", "destructive"):
                    assert cap.risk == catalogue.tools[cap.tool].risk, cap.name


@pytest.mark.parametrize(
    ("slug", "inputs"),
    [(slug, inputs) for slug, cases in DEMO_INPUTS.items() for inputs in cases],
)
def test_static_and_goal_oriented_plans_run_the_same_leaf_wherever_both_have_it(slug, inputs):
    pack = PACKS[slug]
    state = pack.initial_state(inputs)
    static = {leaf.key: leaf for leaf in plan_statically(pack, state).leaves}
    goal = {leaf.key: leaf for leaf in pack.goal_planner(state).plan(pack.goal(), state).leaves}
    shared = static.keys() & goal.keys()
    assert len(shared) >= 3
    for key in shared:
        for name in ("agent", "task", "tool", "inputs", "expected_output", "failure_policy"):
            assert getattr(static[key], name) == getattr(goal[key], name), (key, name)
        assert static[key].risk == goal[key].risk, key
        if static[key].rationale:
            assert static[key].rationale == goal[key].rationale, key


# -- invoice ---------------------------------------------------------------------------------


def test_invoice_goal_plan_has_the_seed_002_shape():
    plan = goal_plan(invoice.PACK, {"invoice_id": "INV-1042"})
    deps = plan.dependencies
    assert set(deps) == {
        "extract-fields",
        "lookup-supplier",
        "check-duplicate",
        "check-totals",
        "check-po",
        "audit-report",
        "place-hold",
    }
    assert deps["extract-fields"] == set()
    assert deps["lookup-supplier"] == {"extract-fields"}
    for check in ("check-duplicate", "check-totals", "check-po"):
        assert deps[check] == {"extract-fields", "lookup-supplier"}
    assert deps["audit-report"] == {
        "extract-fields",
        "lookup-supplier",
        "check-duplicate",
        "check-totals",
        "check-po",
    }
    assert deps["place-hold"] == {"audit-report"}
    assert plan.ready({"extract-fields", "lookup-supplier"}) == {
        "check-duplicate",
        "check-totals",
        "check-po",
    }
    assert plan.width() == 3
    assert len(plan.critical_path()) == 5
    assert plan.leaf("place-hold").risk == "financial"


def test_invoice_goal_plan_orders_leaves_like_the_static_method():
    inputs = {"invoice_id": "INV-1042"}
    goal = goal_plan(invoice.PACK, inputs)
    static = StaticDecomposition(invoice.PACK.methods).plan(
        invoice.PACK.goal(), invoice.PACK.initial_state(inputs)
    )
    assert set(goal.dependencies) == set(static.dependencies)
    for key in static.dependencies:
        assert goal.upstream(key) == static.upstream(key), key
        assert goal.leaf(key).tool == static.leaf(key).tool
        assert goal.leaf(key).agent == static.leaf(key).agent


def test_invoice_goal_plan_runs_on_the_demo_erp_and_holds_the_duplicate():
    plan = goal_plan(invoice.PACK, {"invoice_id": "INV-1042"})
    erp = InMemoryErp()
    out = run_tools(invoice.PACK, plan, erp)
    assert out["lookup-supplier"].name == "Acme Office Supplies"
    assert out["check-duplicate"].matching_payments == ["PAY-7001", "PAY-7002"]
    assert out["check-po"].found is True
    assert out["audit-report"].recommendation == "hold"
    assert out["place-hold"].placed is True
    assert [h["invoice_id"] for h in erp.holds] == ["INV-1042"]


def test_invoice_goal_plan_without_po_check_or_hold():
    plan = goal_plan(
        invoice.PACK,
        {"invoice_id": "INV-1044", "check_purchase_order": False, "hold_on_findings": False},
    )
    assert set(plan.dependencies) == {
        "extract-fields",
        "lookup-supplier",
        "check-duplicate",
        "check-totals",
        "audit-report",
    }
    assert plan.width() == 2
    assert "purchase_order" not in plan.leaf("audit-report").inputs
    out = run_tools(invoice.PACK, plan, InMemoryErp())
    assert out["audit-report"].recommendation == "approve"


def test_invoice_goal_facts_follow_the_case_inputs():
    state = invoice.PACK.initial_state({"invoice_id": "INV-1042"})
    assert invoice.PACK.goal_facts_for(state) == {
        "verify-invoice": {"audit_report", "hold_decided"}
    }
    state = invoice.PACK.initial_state({"invoice_id": "INV-1042", "hold_on_findings": False})
    assert invoice.PACK.goal_facts_for(state) == {"verify-invoice": {"audit_report"}}


def test_invoice_cheapest_hold_decision_is_chosen():
    state = invoice.PACK.initial_state({"invoice_id": "INV-1042"})
    caps = invoice.PACK.capabilities_for(state)
    costs = {c.name: c.cost for c in caps}
    assert costs["place-hold"] < costs["review-hold"]
    plan = goal_plan(invoice.PACK, {"invoice_id": "INV-1042"}, caps)
    assert "place-hold" in plan.dependencies
    assert "review-hold" not in plan.dependencies
    # Once the clerk's route costs more, the reviewer decides instead.
    dearer = goal_plan(invoice.PACK, {"invoice_id": "INV-1042"}, with_cost(caps, "place-hold", 9))
    assert "place-hold" not in dearer.dependencies
    assert dearer.dependencies["review-hold"] == {"audit-report"}
    assert dearer.leaf("review-hold").agent == "ap-reviewer"
    assert dearer.leaf("review-hold").tool is None


def test_invoice_goal_already_satisfied_is_an_error():
    state = invoice.PACK.initial_state({"invoice_id": "INV-1042"})
    done = {**state, "audit_report": {"recommendation": "approve"}, "hold_decided": True}
    with pytest.raises(GoalAlreadySatisfied):
        invoice.PACK.goal_planner(done).plan(invoice.PACK.goal(), done)


# -- fraud -----------------------------------------------------------------------------------


def test_fraud_serious_case_goal_plan_screens_in_parallel_and_freezes_last():
    plan = goal_plan(fraud.PACK, {"account_id": "ACC-300", "amount": "12500"})
    deps = plan.dependencies
    assert plan.ready(set()) == {"pull-transactions", "detect-anomalies", "screen-sanctions"}
    assert plan.width() == 3
    assert deps["interview-customer"] == {"pull-transactions"}
    assert deps["draft-findings"] == {
        "pull-transactions",
        "detect-anomalies",
        "screen-sanctions",
        "interview-customer",
    }
    assert deps["legal-review"] == {"draft-findings"}
    assert deps["freeze-account"] == {"legal-review"}
    assert "review-anomalies" not in deps
    assert "summarise-findings" not in deps
    assert plan.critical_path() == (
        "pull-transactions",
        "interview-customer",
        "draft-findings",
        "legal-review",
        "freeze-account",
    )


def test_fraud_repeat_flags_also_get_the_full_goal():
    plan = goal_plan(fraud.PACK, {"account_id": "ACC-300", "amount": "50", "prior_flags": 2})
    assert "freeze-account" in plan.dependencies


def test_fraud_light_case_goal_plan_summarises_without_freezing():
    plan = goal_plan(fraud.PACK, {"account_id": "ACC-410", "amount": "120"})
    assert dict(plan.dependencies) == {
        "pull-transactions": set(),
        "detect-anomalies": set(),
        "summarise-findings": {"pull-transactions", "detect-anomalies"},
    }
    assert plan.width() == 2


def test_fraud_goal_plan_tools_find_the_sanctioned_counterparty_and_freeze():
    plan = goal_plan(fraud.PACK, {"account_id": "ACC-300", "amount": "12500"})
    data = InMemoryFraudData()
    out = run_tools(fraud.PACK, plan, data)
    assert out["screen-sanctions"].hits == ["Oceanic Holdings Ltd"]
    assert out["detect-anomalies"].anomalous_transactions == ["TX-4", "TX-5"]
    assert [f["account_id"] for f in data.frozen] == ["ACC-300"]


def test_fraud_cheapest_anomaly_source_is_chosen():
    inputs = {"account_id": "ACC-300", "amount": "12500"}
    caps = fraud.PACK.capabilities_for(fraud.PACK.initial_state(inputs))
    plan = goal_plan(fraud.PACK, inputs, caps)
    assert "detect-anomalies" in plan.dependencies
    assert "review-anomalies" not in plan.dependencies
    dearer = goal_plan(fraud.PACK, inputs, with_cost(caps, "detect-anomalies", 10))
    assert "detect-anomalies" not in dearer.dependencies
    assert dearer.dependencies["review-anomalies"] == {"pull-transactions"}
    assert "review-anomalies" in dearer.dependencies["draft-findings"]
    assert dearer.width() == 2


# -- incident --------------------------------------------------------------------------------


def test_outage_goal_plan_fails_over_verifies_and_notifies():
    plan = goal_plan(incident.PACK, {"kind": "database-outage", "service": "orders-db"})
    assert dict(plan.dependencies) == {
        "fail-over": set(),
        "verify-connectivity": {"fail-over"},
        "notify-stakeholders": {"verify-connectivity"},
    }
    infra = InMemoryInfrastructure()
    out = run_tools(incident.PACK, plan, infra)
    assert out["fail-over"].new_primary == "db-orders-2"
    assert out["verify-connectivity"].reachable is True
    assert infra.sent == [
        (
            ("orders-team@example.com", "cto@example.com"),
            "Outage of orders-db: orders-db answers on its primary db-orders-2; "
            "it is back in service",
        ),
    ]


def test_sev1_outage_alerts_stakeholders_while_failing_over():
    inputs = {"kind": "database-outage", "service": "orders-db", "severity": "sev1"}
    plan = goal_plan(incident.PACK, inputs)
    assert plan.ready(set()) == {"alert-stakeholders", "fail-over"}
    assert plan.width() == 2
    infra = InMemoryInfrastructure()
    run_tools(incident.PACK, plan, infra)
    assert [message for _, message in infra.sent] == [
        "orders-db is down; recovery under way",
        "Outage of orders-db: orders-db answers on its primary db-orders-2; it is back in service",
    ]


def test_outage_prefers_the_fail_over_to_a_manual_restore():
    inputs = {"kind": "database-outage", "service": "orders-db"}
    caps = incident.PACK.capabilities_for(incident.PACK.initial_state(inputs))
    assert "restore-by-hand" not in goal_plan(incident.PACK, inputs, caps).dependencies
    manual = goal_plan(incident.PACK, inputs, without(caps, "fail-over"))
    assert manual.dependencies["verify-connectivity"] == {"restore-by-hand"}
    assert manual.leaf("restore-by-hand").agent == "incident-commander"


def test_breach_goal_plan_announces_containment_alongside_forensics():
    inputs = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
    plan = goal_plan(incident.PACK, inputs)
    assert dict(plan.dependencies) == {
        "isolate-systems": set(),
        "collect-logs": {"isolate-systems"},
        "analyse-attack-path": {"collect-logs"},
        "announce-containment": {"isolate-systems"},
    }
    assert plan.ready({"isolate-systems"}) == {"collect-logs", "announce-containment"}
    assert plan.width() == 2
    assert plan.leaf("analyse-attack-path").agent == "forensic-analyst"
    infra = InMemoryInfrastructure()
    out = run_tools(incident.PACK, plan, infra)
    assert out["isolate-systems"].isolated == ["web-2"]
    assert len(out["collect-logs"].entries["web-2"]) == 3
    assert "web-2" in infra.sent[0][1]


def test_breach_forensics_fall_to_the_commander_only_when_cheaper():
    inputs = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
    caps = incident.PACK.capabilities_for(incident.PACK.initial_state(inputs))
    assert "review-logs-by-hand" not in goal_plan(incident.PACK, inputs, caps).dependencies
    cheaper = goal_plan(incident.PACK, inputs, with_cost(caps, "review-logs-by-hand", 1))
    assert cheaper.dependencies["review-logs-by-hand"] == {"collect-logs"}
    assert "analyse-attack-path" not in cheaper.dependencies


def test_breach_without_affected_hosts_has_no_goal_plan():
    state = incident.PACK.initial_state({"kind": "security-breach", "service": "web"})
    with pytest.raises(NoMethodMatched, match="nothing produces hosts_isolated") as exc:
        incident.PACK.goal_planner(state).plan(incident.PACK.goal(), state)
    assert exc.value.task == "respond-to-incident"


def test_breach_without_affected_hosts_offers_neither_isolation_nor_log_collection():
    # both tools need at least one host: offering them would plan a leaf their input model refuses
    state = incident.PACK.initial_state({"kind": "security-breach", "service": "web"})
    names = {cap.name for cap in incident.PACK.capabilities_for(state)}
    assert not names & {"isolate-systems", "collect-logs"}
    with_hosts = incident.PACK.initial_state(
        {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
    )
    names = {cap.name for cap in incident.PACK.capabilities_for(with_hosts)}
    assert {"isolate-systems", "collect-logs"} <= names


def test_other_incident_kinds_have_no_goal_plan():
    state = incident.PACK.initial_state({"kind": "ddos", "service": "web"})
    assert incident.PACK.goal_facts_for(state) == {"respond-to-incident": {"incident_resolved"}}
    with pytest.raises(NoMethodMatched, match="nothing produces incident_resolved"):
        incident.PACK.goal_planner(state).plan(incident.PACK.goal(), state)


# -- DomainPack API --------------------------------------------------------------------------


def test_a_pack_without_goal_hooks_has_no_goal_oriented_plan():
    pack = DomainPack(
        slug="bare",
        name="Bare invoices",
        description="the invoice methods without goal-oriented capabilities",
        input_schema=invoice.PACK.input_schema,
        root_task=invoice.PACK.root_task,
        methods=invoice.PACK.methods,
        agents=invoice.PACK.agents,
        tools=invoice.PACK.tools,
    )
    state = pack.initial_state({"invoice_id": "INV-1044"})
    assert pack.capabilities_for(state) == ()
    assert pack.goal_facts_for(state) == {}
    with pytest.raises(NoMethodMatched, match="no goal facts are declared"):
        pack.goal_planner(state).plan(pack.goal(), state)


def test_goal_planner_passes_its_search_budget_on():
    state = fraud.PACK.initial_state({"account_id": "ACC-300", "amount": "12500"})
    planner = fraud.PACK.goal_planner(state, max_expansions=7)
    assert planner.max_expansions == 7
    assert planner.goals == fraud.PACK.goal_facts_for(state)
