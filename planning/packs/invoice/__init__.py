"""Invoice verification (seed 002).

Extract the invoice fields → look up the supplier → duplicate-payment, totals and
purchase-order checks in parallel → audit report → (gated, financial) payment hold when the
report recommends one. The static method (`methods`) and the goal-oriented capabilities
(`goals`) produce the same shape from the same leaves (`leaves`). Tools (`tools`) read an ERP
through the `ErpData` port (`erp`); `InMemoryErp` over `DEMO_ERP` serves tests, and the
Django side supplies a database-backed port. A case names an invoice the ERP must hold.
"""

from __future__ import annotations

from planning.core.catalogue import AgentSpec, DomainPack
from planning.packs.invoice import goals
from planning.packs.invoice.erp import InMemoryErp
from planning.packs.invoice.inputs import InvoiceCaseInput, check_inputs
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
    capabilities=goals.capabilities,
    goal_facts=goals.goal_facts,
)
