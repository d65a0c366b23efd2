"""Invoice verification (seed 002).

Extract the invoice fields → look up the supplier → duplicate-payment, totals and
purchase-order checks in parallel → audit report → (gated, financial) payment hold when the
report recommends one. The static method (`methods`) and the goal-oriented capabilities
(`goals`) produce the same shape from the same leaves (`leaves`). Tools (`tools`) read an ERP
through the `ErpData` port (`erp`); `InMemoryErp` over `DEMO_ERP` serves tests, and the
Django side supplies a database-backed port. A case names an invoice the ERP must hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planning.core.catalogue import AgentSpec
from planning.core.pack import DomainPack, GoalFindings
from planning.packs.invoice import goals
from planning.packs.invoice.erp import ErpData, InMemoryErp
from planning.packs.invoice.inputs import InvoiceCaseInput, check_inputs, suggest_inputs
from planning.packs.invoice.methods import METHODS
from planning.packs.invoice.tools import TOOLS

AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec(
        slug="invoice-extractor",
        name="Invoice extractor",
        kind="tool",
        description="Reads invoice documents into structured fields",
        capabilities=("invoice.extract",),
        tools=("extract_invoice_fields",),
        trust=0.8,
    ),
    AgentSpec(
        slug="erp-connector",
        name="ERP connector",
        kind="tool",
        description="Queries supplier master data and purchase orders",
        capabilities=("erp.read",),
        tools=("get_supplier", "check_purchase_order"),
        trust=0.9,
    ),
    AgentSpec(
        slug="payments-auditor",
        name="Payments auditor",
        kind="tool",
        description="Checks payment history and invoice arithmetic",
        capabilities=("payments.audit",),
        tools=("check_duplicate_payment", "check_totals"),
        trust=0.85,
    ),
    AgentSpec(
        slug="audit-reporter",
        name="Audit reporter",
        kind="tool",
        description="Compiles verification findings into an audit report",
        capabilities=("report.compile",),
        tools=("compile_audit_report",),
        trust=0.8,
    ),
    AgentSpec(
        slug="payments-clerk",
        name="Payments clerk",
        kind="tool",
        description="Places and releases payment holds in the ERP",
        capabilities=("payments.hold",),
        tools=("place_payment_hold",),
        trust=0.6,
    ),
    AgentSpec(
        slug="ap-reviewer",
        name="Accounts-payable reviewer",
        kind="human",
        description="A person in accounts payable who resolves discrepancies",
        capabilities=("payments.review",),
        trust=0.9,
    ),
)


def goal_check(outputs: Mapping[str, Any], erp: ErpData | None) -> GoalFindings:
    """Return what keeps a run from having verified its invoice (goal-level verification), and
    what held.

    The audit report must be there, and the payment hold must follow its recommendation: placed
    when it says hold, not placed when it says approve. The outputs say it all: `erp` is unread.
    """
    report = outputs.get("audit-report")
    if not isinstance(report, Mapping):
        return GoalFindings(problems=("no audit report was compiled",))
    recommendation = report.get("recommendation")
    invoice = report.get("invoice_id") or "the invoice"
    findings = report.get("findings") or []
    held = [
        f"the audit report on {invoice} recommends {recommendation!r}"
        + (f" on {len(findings)} finding{'' if len(findings) == 1 else 's'}" if findings else "")
    ]
    problems: list[str] = []
    hold = outputs.get("place-hold")
    if isinstance(hold, Mapping):
        wanted = recommendation == "hold"
        if bool(hold.get("placed")) != wanted:
            problems.append(
                f"the report recommends {recommendation!r} but the hold was "
                + ("not placed" if wanted else "placed")
            )
        else:
            hold_id = f" {hold['hold_id']}" if hold.get("hold_id") else ""
            held.append(
                f"the payment hold{hold_id} follows it: {'placed' if wanted else 'not placed'}"
            )
    if recommendation == "hold" and not findings:
        problems.append("the report recommends a hold without a finding")
    return GoalFindings(problems=tuple(problems), held=tuple(held))


PACK = DomainPack(
    slug="invoice",
    name="Invoice verification",
    description="Verify an invoice against the ERP: supplier, duplicate payments, totals and "
    "purchase order, then report and hold payment when something is wrong",
    input_schema=InvoiceCaseInput,
    root_task="verify-invoice",
    methods=METHODS,
    agents=AGENTS,
    tools=TOOLS,
    demo_port=InMemoryErp,
    check_data=check_inputs,
    suggest_inputs=suggest_inputs,
    capabilities=goals.capabilities,
    goal_facts=goals.goal_facts,
    goal_check=goal_check,
)
