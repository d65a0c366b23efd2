from decimal import Decimal

import pytest
from pydantic import ValidationError

from planning.core.dag import DagPlan
from planning.core.errors import NoMethodMatched
from planning.core.forward import ForwardDecomposition
from planning.core.pack import DomainPack
from planning.core.refs import resolve_inputs
from planning.core.static import StaticDecomposition
from planning.core.validation import validate_plan
from planning.packs import PACKS, fraud, incident, invoice
from planning.packs.fraud.data import InMemoryFraudData
from planning.packs.incident.infrastructure import InMemoryInfrastructure
from planning.packs.invoice.erp import InMemoryErp


def plan_for(pack: DomainPack, inputs: dict, strategy=StaticDecomposition) -> DagPlan:
    plan = strategy(pack.methods).plan(pack.goal(), pack.initial_state(inputs))
    validate_plan(plan, pack.catalogue())
    return plan


def run_tools(pack: DomainPack, plan: DagPlan, port) -> dict:
    """Run every tool leaf in dependency order (human and LLM leaves produce nothing here)."""
    outputs: dict = {}
    for key in plan.topological_order():
        leaf = plan.leaf(key)
        if leaf.tool is not None:
            outputs[key] = pack.tool(leaf.tool).run(resolve_inputs(leaf.inputs, outputs), port)
    return outputs


def test_all_three_packs_are_registered():
    assert set(PACKS) == {"invoice", "fraud", "incident"}
    for slug, pack in PACKS.items():
        assert pack.slug == slug
        assert pack.root_task in pack.methods


def test_invoice_plan_has_the_seed_002_shape():
    plan = plan_for(invoice.PACK, {"invoice_id": "INV-1042"})
    deps = plan.dependencies
    assert [leaf.key for leaf in plan.leaves] == [
        "extract-fields",
        "lookup-supplier",
        "check-duplicate",
        "check-totals",
        "check-po",
        "audit-report",
        "place-hold",
    ]
    assert deps["lookup-supplier"] == {"extract-fields"}
    for check in ("check-duplicate", "check-totals", "check-po"):
        assert deps[check] == {"lookup-supplier"}
    assert deps["audit-report"] == {"check-duplicate", "check-totals", "check-po"}
    assert plan.ready({"extract-fields", "lookup-supplier"}) == {
        "check-duplicate",
        "check-totals",
        "check-po",
    }
    assert plan.width() == 3
    hold = plan.leaf("place-hold")
    assert invoice.PACK.tool(hold.tool).risk == "financial"
    assert all(n.provenance.source == "verify-invoice-standard" for n in plan.leaves)


def test_invoice_forward_plan_derives_the_same_dag():
    static = plan_for(invoice.PACK, {"invoice_id": "INV-1042"})
    forward = plan_for(invoice.PACK, {"invoice_id": "INV-1042"}, ForwardDecomposition)
    assert dict(forward.dependencies) == dict(static.dependencies)


def test_invoice_tools_find_the_real_duplicate_payment_and_hold_it():
    plan = plan_for(invoice.PACK, {"invoice_id": "INV-1042"})
    erp = InMemoryErp()
    out = run_tools(invoice.PACK, plan, erp)
    assert out["extract-fields"].supplier_id == "SUP-1001"
    assert out["lookup-supplier"].name == "Acme Office Supplies"
    assert out["check-duplicate"].is_duplicate is True
    assert out["check-duplicate"].matching_payments == ["PAY-7001", "PAY-7002"]
    assert out["check-totals"].matches is True
    assert out["audit-report"].recommendation == "hold"
    assert out["place-hold"].placed is True
    assert [h["invoice_id"] for h in erp.holds] == ["INV-1042"]


def test_invoice_with_wrong_total_is_flagged_without_a_duplicate():
    plan = plan_for(invoice.PACK, {"invoice_id": "INV-1043"})
    out = run_tools(invoice.PACK, plan, InMemoryErp())
    assert out["check-duplicate"].is_duplicate is False
    assert out["check-totals"].difference == Decimal("40.00")
    assert out["audit-report"].recommendation == "hold"


def test_clean_invoice_is_approved_and_no_hold_is_placed():
    plan = plan_for(invoice.PACK, {"invoice_id": "INV-1044"})
    erp = InMemoryErp()
    out = run_tools(invoice.PACK, plan, erp)
    assert out["audit-report"].findings == []
    assert out["place-hold"].placed is False
    assert erp.holds == []


def test_blocked_supplier_and_missing_po_are_reported():
    plan = plan_for(invoice.PACK, {"invoice_id": "INV-1045"})
    report = run_tools(invoice.PACK, plan, InMemoryErp())["audit-report"]
    assert any("blocked" in f for f in report.findings)
    assert any("PO-5999 not found" in f for f in report.findings)


def test_invoice_without_po_check_or_hold():
    plan = plan_for(
        invoice.PACK,
        {"invoice_id": "INV-1044", "check_purchase_order": False, "hold_on_findings": False},
    )
    assert "check-po" not in plan.dependencies
    assert "place-hold" not in plan.dependencies
    assert plan.dependencies["audit-report"] == {"check-duplicate", "check-totals"}


def test_invoice_case_inputs_are_validated_by_the_schema():
    with pytest.raises(ValidationError):
        invoice.PACK.initial_state({"invoice_id": "1042"})
    with pytest.raises(ValidationError):
        invoice.PACK.initial_state({"invoice_id": "INV-1042", "surprise": 1})


def test_fraud_small_first_case_gets_the_light_investigation():
    plan = plan_for(fraud.PACK, {"account_id": "ACC-410", "amount": "120"})
    assert plan.root.provenance.source == "light-investigation"
    assert [leaf.key for leaf in plan.leaves] == [
        "pull-transactions",
        "detect-anomalies",
        "summarise-findings",
    ]
    assert plan.width() == 2


@pytest.mark.parametrize(
    "inputs",
    [
        {"account_id": "ACC-300", "amount": "12500"},
        {"account_id": "ACC-300", "amount": "50", "prior_flags": 2},
    ],
)
def test_fraud_large_amount_or_repeat_flags_get_the_full_investigation(inputs):
    plan = plan_for(fraud.PACK, inputs)
    assert plan.root.provenance.source == "full-investigation"
    analyse = plan.node("analyse-financial-records")
    assert analyse.provenance.source == "analyse-records"
    assert plan.dependencies["detect-anomalies"] == {"pull-transactions"}
    assert plan.dependencies["screen-sanctions"] == {"pull-transactions"}
    assert plan.dependencies["draft-findings"] == {
        "detect-anomalies",
        "screen-sanctions",
        "interview-customer",
    }
    assert plan.dependencies["freeze-account"] == {"legal-review"}


def test_fraud_tools_find_the_sanctioned_counterparty_and_outliers():
    plan = plan_for(fraud.PACK, {"account_id": "ACC-300", "amount": "12500"})
    data = InMemoryFraudData()
    out = run_tools(fraud.PACK, plan, data)
    assert out["screen-sanctions"].hits == ["Oceanic Holdings Ltd"]
    assert out["detect-anomalies"].anomalous_transactions == ["TX-4", "TX-5"]
    assert out["freeze-account"].account_id == "ACC-300"
    assert [f["account_id"] for f in data.frozen] == ["ACC-300"]


def test_fraud_forward_plan_validates():
    plan = plan_for(fraud.PACK, {"account_id": "ACC-300", "amount": "12500"}, ForwardDecomposition)
    assert plan.dependencies["freeze-account"] == {"legal-review"}


def test_database_outage_fails_over_verifies_and_notifies():
    plan = plan_for(incident.PACK, {"kind": "database-outage", "service": "orders-db"})
    assert [leaf.key for leaf in plan.leaves] == [
        "fail-over",
        "verify-connectivity",
        "notify-stakeholders",
    ]
    infra = InMemoryInfrastructure()
    assert infra.is_reachable(infra.primary("orders-db")) is False
    out = run_tools(incident.PACK, plan, infra)
    assert out["fail-over"].new_primary == "db-orders-2"
    assert out["verify-connectivity"].reachable is True
    assert infra.sent[0][0] == ("orders-team@example.com", "cto@example.com")


def test_security_breach_isolates_analyses_and_notifies():
    inputs = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
    plan = plan_for(incident.PACK, inputs)
    assert [leaf.key for leaf in plan.leaves] == [
        "isolate-systems",
        "collect-logs",
        "analyse-attack-path",
        "announce-containment",
    ]
    assert plan.dependencies["collect-logs"] == {"isolate-systems"}
    assert plan.dependencies["announce-containment"] == {"analyse-attack-path"}
    infra = InMemoryInfrastructure()
    out = run_tools(incident.PACK, plan, infra)
    assert out["isolate-systems"].isolated == ["web-2"]
    assert infra.is_reachable("web-2") is False
    assert len(out["collect-logs"].entries["web-2"]) == 3


def test_other_incident_kinds_have_no_method():
    with pytest.raises(NoMethodMatched) as exc:
        plan_for(incident.PACK, {"kind": "ddos", "service": "web"})
    assert exc.value.task == "respond-to-incident"
    assert exc.value.methods_tried == ("database-outage-response", "security-breach-response")


def test_the_invoice_goal_holds_when_the_hold_follows_the_reports_recommendation() -> None:
    from planning.packs.invoice import goal_check

    erp = InMemoryErp()
    report = {"findings": ["duplicate payment"], "recommendation": "hold"}
    assert (
        list(goal_check({"audit-report": report, "place-hold": {"placed": True}}, erp).problems)
        == []
    )
    assert list(
        goal_check({"audit-report": report, "place-hold": {"placed": False}}, erp).problems
    ) == ["the report recommends 'hold' but the hold was not placed"]
    clean = {"findings": [], "recommendation": "approve"}
    assert (
        list(goal_check({"audit-report": clean, "place-hold": {"placed": False}}, erp).problems)
        == []
    )
    assert list(goal_check({}, erp).problems) == ["no audit report was compiled"]


def test_the_invoice_goal_check_says_what_held() -> None:
    from planning.packs.invoice import goal_check

    report = {"invoice_id": "INV-1042", "findings": ["duplicate payment"], "recommendation": "hold"}
    hold = {"placed": True, "hold_id": "HOLD-1"}
    findings = goal_check({"audit-report": report, "place-hold": hold}, InMemoryErp())
    assert findings.reached
    assert findings.held == (
        "the audit report on INV-1042 recommends 'hold' on 1 finding",
        "the payment hold HOLD-1 follows it: placed",
    )
    refused = goal_check({"audit-report": report, "place-hold": {"placed": False}}, None)
    assert not refused.reached
    assert refused.held == ("the audit report on INV-1042 recommends 'hold' on 1 finding",)
