"""Invoice verification (seed 002).

Extract the invoice fields → look up the supplier → duplicate-payment, totals and
purchase-order checks in parallel → audit report → (gated, financial) payment hold when the
report recommends one. The static method and the goal-oriented capabilities (facts
`invoice_fields` → `supplier_record` → `duplicate_checked` / `totals_checked` /
`po_checked` → `audit_report` → `hold_decided`) produce the same shape; the hold decision
can also be left to the accounts-payable reviewer, at a higher cost. Tools read an ERP
through the `ErpData` port; `InMemoryErp` over `DEMO_ERP` serves tests and the demo, and the
Django side supplies a database-backed port.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from planning.core.catalogue import AgentSpec, DomainPack, ToolSpec
from planning.core.goal import Capability
from planning.core.static import Method, MethodLibrary, Step
from planning.core.validation import ref

INVOICE_ID = r"^INV-[0-9]{4,}$"
SUPPLIER_ID = r"^SUP-[0-9]{4,}$"
PO_NUMBER = r"^PO-[0-9]{4,}$"


# -- demo ERP data and port ---------------------------------------------------------------

DEMO_ERP: Mapping[str, Any] = {
    "suppliers": (
        {
            "supplier_id": "SUP-1001",
            "name": "Acme Office Supplies",
            "status": "active",
            "bank_account": "DE89 3704 0044 0532 0130 00",
        },
        {
            "supplier_id": "SUP-1002",
            "name": "Globex Logistics",
            "status": "active",
            "bank_account": "FR14 2004 1010 0505 0001 3M02 606",
        },
        {
            "supplier_id": "SUP-1003",
            "name": "Initech Consulting",
            "status": "active",
            "bank_account": "GB29 NWBK 6016 1331 9268 19",
        },
        {
            "supplier_id": "SUP-1004",
            "name": "Umbrella Catering",
            "status": "blocked",
            "bank_account": "NL91 ABNA 0417 1643 00",
        },
    ),
    "purchase_orders": (
        {
            "po_number": "PO-5001",
            "supplier_id": "SUP-1001",
            "amount": "1000.00",
            "invoiced": "1000.00",
        },
        {"po_number": "PO-5002", "supplier_id": "SUP-1002", "amount": "500.00", "invoiced": "0.00"},
        {"po_number": "PO-5003", "supplier_id": "SUP-1003", "amount": "300.00", "invoiced": "0.00"},
    ),
    # Raw invoice documents as received; `extract_invoice_fields` parses them.
    "documents": {
        "INV-1042": (
            "INVOICE INV-1042\nSupplier: SUP-1001\nPO: PO-5001\nDate: 2026-09-28\nCurrency: EUR\n"
            "Line: A4 paper (box) | 10 | 25.00\nLine: Toner cartridge | 5 | 150.00\n"
            "Total: 1000.00\n"
        ),
        "INV-1043": (
            "INVOICE INV-1043\nSupplier: SUP-1002\nPO: PO-5002\nDate: 2026-10-03\nCurrency: EUR\n"
            "Line: Pallet transport | 4 | 125.00\nTotal: 540.00\n"
        ),
        "INV-1044": (
            "INVOICE INV-1044\nSupplier: SUP-1003\nPO: PO-5003\nDate: 2026-10-05\nCurrency: EUR\n"
            "Line: Process review workshop | 2 | 150.00\nTotal: 300.00\n"
        ),
        "INV-1045": (
            "INVOICE INV-1045\nSupplier: SUP-1004\nPO: PO-5999\nDate: 2026-10-06\nCurrency: EUR\n"
            "Line: Catering | 1 | 80.00\nTotal: 80.00\n"
        ),
    },
    # INV-1042 was paid twice, a week apart: the duplicate the checks must find.
    "payments": (
        {
            "payment_id": "PAY-7001",
            "invoice_id": "INV-1042",
            "supplier_id": "SUP-1001",
            "amount": "1000.00",
            "paid_on": "2026-10-02",
        },
        {
            "payment_id": "PAY-7002",
            "invoice_id": "INV-1042",
            "supplier_id": "SUP-1001",
            "amount": "1000.00",
            "paid_on": "2026-10-09",
        },
        {
            "payment_id": "PAY-7003",
            "invoice_id": "INV-0977",
            "supplier_id": "SUP-1002",
            "amount": "500.00",
            "paid_on": "2026-08-14",
        },
    ),
}


class ErpData(Protocol):
    """Read (and hold) access to the ERP that the invoice tools need."""

    def invoice_document(self, invoice_id: str) -> str: ...

    def supplier(self, supplier_id: str) -> Mapping[str, Any] | None: ...

    def purchase_order(self, po_number: str) -> Mapping[str, Any] | None: ...

    def payments(self, supplier_id: str) -> Sequence[Mapping[str, Any]]: ...

    def place_hold(self, invoice_id: str, reason: str) -> str: ...


@dataclass
class InMemoryErp:
    """An `ErpData` port over plain Python data (the demo dataset by default)."""

    data: Mapping[str, Any] = field(default_factory=lambda: DEMO_ERP)
    holds: list[dict[str, str]] = field(default_factory=list)

    def invoice_document(self, invoice_id: str) -> str:
        documents: Mapping[str, str] = self.data["documents"]
        if invoice_id not in documents:
            raise LookupError(f"no invoice document {invoice_id!r}")
        return documents[invoice_id]

    def supplier(self, supplier_id: str) -> Mapping[str, Any] | None:
        return next((s for s in self.data["suppliers"] if s["supplier_id"] == supplier_id), None)

    def purchase_order(self, po_number: str) -> Mapping[str, Any] | None:
        return next((p for p in self.data["purchase_orders"] if p["po_number"] == po_number), None)

    def payments(self, supplier_id: str) -> Sequence[Mapping[str, Any]]:
        return [p for p in self.data["payments"] if p["supplier_id"] == supplier_id]

    def place_hold(self, invoice_id: str, reason: str) -> str:
        hold_id = f"HOLD-{len(self.holds) + 1:04d}"
        self.holds.append({"hold_id": hold_id, "invoice_id": invoice_id, "reason": reason})
        return hold_id


# -- tool models ----------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InvoiceRef(_Model):
    invoice_id: str = Field(pattern=INVOICE_ID)


class LineItem(_Model):
    description: str
    quantity: int = Field(ge=1)
    unit_price: Decimal = Field(ge=0)


class InvoiceFields(_Model):
    invoice_id: str = Field(pattern=INVOICE_ID)
    supplier_id: str = Field(pattern=SUPPLIER_ID)
    po_number: str | None = Field(default=None, pattern=PO_NUMBER)
    invoice_date: str
    currency: str = Field(min_length=3, max_length=3)
    total: Decimal
    line_items: list[LineItem]


class SupplierQuery(_Model):
    supplier_id: str = Field(pattern=SUPPLIER_ID)


class SupplierRecord(_Model):
    supplier_id: str
    found: bool
    name: str = ""
    status: str = "missing"
    bank_account: str = ""


class DuplicateCheckInput(_Model):
    invoice: InvoiceFields


class DuplicateCheckResult(_Model):
    is_duplicate: bool
    matching_payments: list[str]
    paid_total: Decimal


class TotalsCheckInput(_Model):
    invoice: InvoiceFields


class TotalsCheckResult(_Model):
    matches: bool
    stated_total: Decimal
    computed_total: Decimal
    difference: Decimal


class PurchaseOrderCheckInput(_Model):
    invoice: InvoiceFields


class PurchaseOrderCheckResult(_Model):
    found: bool
    po_number: str | None
    matches_supplier: bool
    within_amount: bool
    remaining_amount: Decimal


class AuditReportInput(_Model):
    invoice: InvoiceFields
    supplier: SupplierRecord
    duplicate: DuplicateCheckResult
    totals: TotalsCheckResult
    purchase_order: PurchaseOrderCheckResult | None = None


class AuditReport(_Model):
    invoice_id: str
    findings: list[str]
    recommendation: Literal["approve", "hold"]


class PaymentHoldInput(_Model):
    report: AuditReport


class PaymentHoldResult(_Model):
    invoice_id: str
    placed: bool
    hold_id: str | None = None


# -- tool functions -------------------------------------------------------------------------

_FIELD = re.compile(r"^(?P<name>[A-Za-z ]+):\s*(?P<value>.+?)\s*$")


def extract_invoice_fields(args: InvoiceRef, erp: ErpData) -> InvoiceFields:
    """Parse the invoice document into structured fields; raise `LookupError` if missing."""
    values: dict[str, str] = {}
    lines: list[LineItem] = []
    for raw in erp.invoice_document(args.invoice_id).splitlines():
        match = _FIELD.match(raw)
        if not match:
            continue
        name, value = match["name"].strip().lower(), match["value"]
        if name == "line":
            description, quantity, price = (part.strip() for part in value.split("|"))
            lines.append(
                LineItem(description=description, quantity=int(quantity), unit_price=Decimal(price))
            )
        else:
            values[name] = value
    return InvoiceFields(
        invoice_id=args.invoice_id,
        supplier_id=values["supplier"],
        po_number=values.get("po"),
        invoice_date=values["date"],
        currency=values["currency"],
        total=Decimal(values["total"]),
        line_items=lines,
    )


def get_supplier(args: SupplierQuery, erp: ErpData) -> SupplierRecord:
    """Return the supplier master record (found=False when unknown)."""
    record = erp.supplier(args.supplier_id)
    if record is None:
        return SupplierRecord(supplier_id=args.supplier_id, found=False)
    return SupplierRecord(
        supplier_id=args.supplier_id,
        found=True,
        name=record["name"],
        status=record["status"],
        bank_account=record["bank_account"],
    )


def check_duplicate_payment(args: DuplicateCheckInput, erp: ErpData) -> DuplicateCheckResult:
    """Find earlier payments of this invoice (same number, or same amount and date window)."""
    invoice = args.invoice
    matches = [
        p for p in erp.payments(invoice.supplier_id) if p["invoice_id"] == invoice.invoice_id
    ]
    paid = sum((Decimal(p["amount"]) for p in matches), Decimal("0"))
    # Paid more than once, or paid at all when it arrives for verification again.
    return DuplicateCheckResult(
        is_duplicate=len(matches) > 1 or (len(matches) == 1 and paid >= invoice.total),
        matching_payments=[p["payment_id"] for p in matches],
        paid_total=paid,
    )


def check_totals(args: TotalsCheckInput, erp: ErpData) -> TotalsCheckResult:
    """Compare the stated total with the sum of the line items."""
    invoice = args.invoice
    computed = sum((li.unit_price * li.quantity for li in invoice.line_items), Decimal("0"))
    return TotalsCheckResult(
        matches=computed == invoice.total,
        stated_total=invoice.total,
        computed_total=computed,
        difference=invoice.total - computed,
    )


def check_purchase_order(args: PurchaseOrderCheckInput, erp: ErpData) -> PurchaseOrderCheckResult:
    """Check the PO exists, belongs to the supplier and covers the invoice amount."""
    invoice = args.invoice
    po = erp.purchase_order(invoice.po_number) if invoice.po_number else None
    if po is None:
        return PurchaseOrderCheckResult(
            found=False,
            po_number=invoice.po_number,
            matches_supplier=False,
            within_amount=False,
            remaining_amount=Decimal("0"),
        )
    remaining = Decimal(po["amount"]) - Decimal(po["invoiced"])
    return PurchaseOrderCheckResult(
        found=True,
        po_number=invoice.po_number,
        matches_supplier=po["supplier_id"] == invoice.supplier_id,
        within_amount=invoice.total <= remaining,
        remaining_amount=remaining,
    )


def compile_audit_report(args: AuditReportInput, erp: ErpData) -> AuditReport:
    """Summarise the checks into findings and a recommendation."""
    findings: list[str] = []
    if not args.supplier.found:
        findings.append(f"supplier {args.supplier.supplier_id} is not in the supplier master")
    elif args.supplier.status != "active":
        findings.append(f"supplier {args.supplier.supplier_id} is {args.supplier.status}")
    if args.duplicate.is_duplicate:
        findings.append(
            "duplicate payment: already paid by "
            + ", ".join(args.duplicate.matching_payments)
            + f" (total {args.duplicate.paid_total})"
        )
    if not args.totals.matches:
        findings.append(
            f"stated total {args.totals.stated_total} differs from line items "
            f"{args.totals.computed_total}"
        )
    po = args.purchase_order
    if po is not None:
        if not po.found:
            findings.append(f"purchase order {po.po_number} not found")
        else:
            if not po.matches_supplier:
                findings.append(f"purchase order {po.po_number} belongs to another supplier")
            if not po.within_amount:
                findings.append(
                    f"invoice exceeds the remaining amount {po.remaining_amount} of {po.po_number}"
                )
    return AuditReport(
        invoice_id=args.invoice.invoice_id,
        findings=findings,
        recommendation="hold" if findings else "approve",
    )


def place_payment_hold(args: PaymentHoldInput, erp: ErpData) -> PaymentHoldResult:
    """Place a payment hold when the report recommends one (a financial write)."""
    report = args.report
    if report.recommendation != "hold":
        return PaymentHoldResult(invoice_id=report.invoice_id, placed=False)
    hold_id = erp.place_hold(report.invoice_id, "; ".join(report.findings))
    return PaymentHoldResult(invoice_id=report.invoice_id, placed=True, hold_id=hold_id)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="extract_invoice_fields",
        description="Parse an invoice document into fields",
        input_model=InvoiceRef,
        output_model=InvoiceFields,
        risk="read",
        func=extract_invoice_fields,
    ),
    ToolSpec(
        name="get_supplier",
        description="Look up the supplier master record",
        input_model=SupplierQuery,
        output_model=SupplierRecord,
        risk="read",
        func=get_supplier,
    ),
    ToolSpec(
        name="check_duplicate_payment",
        description="Search payment history for this invoice",
        input_model=DuplicateCheckInput,
        output_model=DuplicateCheckResult,
        risk="read",
        func=check_duplicate_payment,
    ),
    ToolSpec(
        name="check_totals",
        description="Recompute the invoice total from its lines",
        input_model=TotalsCheckInput,
        output_model=TotalsCheckResult,
        risk="read",
        func=check_totals,
    ),
    ToolSpec(
        name="check_purchase_order",
        description="Match the invoice to its purchase order",
        input_model=PurchaseOrderCheckInput,
        output_model=PurchaseOrderCheckResult,
        risk="read",
        func=check_purchase_order,
    ),
    ToolSpec(
        name="compile_audit_report",
        description="Summarise checks into an audit report",
        input_model=AuditReportInput,
        output_model=AuditReport,
        risk="read",
        func=compile_audit_report,
    ),
    ToolSpec(
        name="place_payment_hold",
        description="Block payment of an invoice",
        input_model=PaymentHoldInput,
        output_model=PaymentHoldResult,
        risk="financial",
        func=place_payment_hold,
    ),
)

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


class InvoiceCaseInput(_Model):
    """The case inputs of an invoice verification."""

    invoice_id: str = Field(pattern=INVOICE_ID)
    check_purchase_order: bool = True
    hold_on_findings: bool = True


def build_state(inputs: InvoiceCaseInput) -> dict[str, Any]:
    """Return the planning state of an invoice case."""
    return inputs.model_dump(mode="json")


def _verify(state: Mapping[str, Any]) -> list[Step]:
    invoice = ref("extract-fields")
    checks = ["check-duplicate", "check-totals"]
    steps = [
        Step(
            key="extract-fields",
            agent="invoice-extractor",
            task="Extract the invoice fields",
            tool="extract_invoice_fields",
            inputs={"invoice_id": state["invoice_id"]},
            expected_output="InvoiceFields",
            rationale="every later check needs the structured fields",
            effects={"fields_extracted": True},
        ),
        Step(
            key="lookup-supplier",
            agent="erp-connector",
            task="Look up the verified supplier",
            tool="get_supplier",
            inputs={"supplier_id": ref("extract-fields", "supplier_id")},
            expected_output="SupplierRecord",
            failure_policy="continue",
            reads=frozenset({"fields_extracted"}),
            effects={"supplier_checked": True},
        ),
        Step(
            key="check-duplicate",
            agent="payments-auditor",
            task="Check payment history for a duplicate payment",
            tool="check_duplicate_payment",
            inputs={"invoice": invoice},
            depends_on=("lookup-supplier",),
            expected_output="DuplicateCheckResult",
            failure_policy="retry",
            reads=frozenset({"supplier_checked"}),
            effects={"duplicate_checked": True},
        ),
        Step(
            key="check-totals",
            agent="payments-auditor",
            task="Recompute the total from the line items",
            tool="check_totals",
            inputs={"invoice": invoice},
            depends_on=("lookup-supplier",),
            expected_output="TotalsCheckResult",
            reads=frozenset({"supplier_checked"}),
            effects={"totals_checked": True},
        ),
    ]
    report_inputs: dict[str, Any] = {
        "invoice": invoice,
        "supplier": ref("lookup-supplier"),
        "duplicate": ref("check-duplicate"),
        "totals": ref("check-totals"),
    }
    if state.get("check_purchase_order", True):
        checks.append("check-po")
        steps.append(
            Step(
                key="check-po",
                agent="erp-connector",
                task="Match the invoice to its purchase order",
                tool="check_purchase_order",
                inputs={"invoice": invoice},
                depends_on=("lookup-supplier",),
                expected_output="PurchaseOrderCheckResult",
                reads=frozenset({"supplier_checked"}),
                effects={"po_checked": True},
            )
        )
        report_inputs["purchase_order"] = ref("check-po")
    steps.append(
        Step(
            key="audit-report",
            agent="audit-reporter",
            task="Compile the audit report",
            tool="compile_audit_report",
            inputs=report_inputs,
            depends_on=tuple(checks),
            expected_output="AuditReport",
            reads=frozenset({"duplicate_checked", "totals_checked", "po_checked"}),
            effects={"report_ready": True},
        )
    )
    if state.get("hold_on_findings", True):
        steps.append(
            Step(
                key="place-hold",
                agent="payments-clerk",
                task="Place a payment hold if the report recommends one",
                tool="place_payment_hold",
                inputs={"report": ref("audit-report")},
                expected_output="PaymentHoldResult",
                failure_policy="escalate",
                risk="financial",
                reads=frozenset({"report_ready"}),
                effects={"hold_decided": True},
            )
        )
    return steps


METHODS = MethodLibrary(
    [
        Method(
            name="verify-invoice-standard",
            task="verify-invoice",
            decompose=_verify,
            cost=1.0,
            duration_s=30.0,
            description="extract → supplier → parallel checks → report → hold",
        ),
    ]
)

# -- goal-oriented capabilities -------------------------------------------------------------

CHECK_FACTS = frozenset({"invoice_fields", "supplier_record"})


def capabilities(state: Mapping[str, Any]) -> tuple[Capability, ...]:
    """Return the goal-oriented capabilities for the invoice case in `state`.

    The purchase-order check (and the report's use of it) is offered only when the case asks
    for it. Raises `KeyError` when the state has no `invoice_id`.
    """
    invoice = ref("extract-fields")
    check_po = bool(state.get("check_purchase_order", True))
    caps = [
        Capability(
            name="extract-fields",
            agent="invoice-extractor",
            task="Extract the invoice fields",
            inputs=frozenset({"invoice_id"}),
            outputs=frozenset({"invoice_fields"}),
            cost=1.0,
            rationale="every later check needs the structured fields",
            tool="extract_invoice_fields",
            tool_inputs={"invoice_id": state["invoice_id"]},
            expected_output="InvoiceFields",
        ),
        Capability(
            name="lookup-supplier",
            agent="erp-connector",
            task="Look up the verified supplier",
            inputs=frozenset({"invoice_fields"}),
            outputs=frozenset({"supplier_record"}),
            cost=1.0,
            rationale="the checks and the report need the supplier master record",
            tool="get_supplier",
            tool_inputs={"supplier_id": ref("extract-fields", "supplier_id")},
            expected_output="SupplierRecord",
            failure_policy="continue",
        ),
        Capability(
            name="check-duplicate",
            agent="payments-auditor",
            task="Check payment history for a duplicate payment",
            inputs=CHECK_FACTS,
            outputs=frozenset({"duplicate_checked"}),
            cost=1.0,
            rationale="an invoice paid before must not be paid again",
            tool="check_duplicate_payment",
            tool_inputs={"invoice": invoice},
            expected_output="DuplicateCheckResult",
            failure_policy="retry",
        ),
        Capability(
            name="check-totals",
            agent="payments-auditor",
            task="Recompute the total from the line items",
            inputs=CHECK_FACTS,
            outputs=frozenset({"totals_checked"}),
            cost=1.0,
            rationale="the stated total must equal the sum of the line items",
            tool="check_totals",
            tool_inputs={"invoice": invoice},
            expected_output="TotalsCheckResult",
        ),
    ]
    report_inputs: dict[str, Any] = {
        "invoice": invoice,
        "supplier": ref("lookup-supplier"),
        "duplicate": ref("check-duplicate"),
        "totals": ref("check-totals"),
    }
    report_facts = CHECK_FACTS | {"duplicate_checked", "totals_checked"}
    if check_po:
        caps.append(
            Capability(
                name="check-po",
                agent="erp-connector",
                task="Match the invoice to its purchase order",
                inputs=CHECK_FACTS,
                outputs=frozenset({"po_checked"}),
                cost=1.0,
                rationale="the purchase order must exist, match the supplier and cover the amount",
                tool="check_purchase_order",
                tool_inputs={"invoice": invoice},
                expected_output="PurchaseOrderCheckResult",
            )
        )
        report_inputs["purchase_order"] = ref("check-po")
        report_facts |= {"po_checked"}
    caps += [
        Capability(
            name="audit-report",
            agent="audit-reporter",
            task="Compile the audit report",
            inputs=report_facts,
            outputs=frozenset({"audit_report"}),
            cost=1.0,
            rationale="summarise every check into findings and a recommendation",
            tool="compile_audit_report",
            tool_inputs=report_inputs,
            expected_output="AuditReport",
        ),
        Capability(
            name="place-hold",
            agent="payments-clerk",
            task="Place a payment hold if the report recommends one",
            inputs=frozenset({"audit_report"}),
            outputs=frozenset({"hold_decided"}),
            cost=1.0,
            rationale="the payment clerk acts on the report's recommendation",
            tool="place_payment_hold",
            tool_inputs={"report": ref("audit-report")},
            expected_output="PaymentHoldResult",
            failure_policy="escalate",
            risk="financial",
        ),
        Capability(
            name="review-hold",
            agent="ap-reviewer",
            task="Read the audit report and decide by hand whether to hold the payment",
            inputs=frozenset({"audit_report"}),
            outputs=frozenset({"hold_decided"}),
            cost=5.0,
            rationale="a person decides the hold when no clerk can act on the report",
            failure_policy="escalate",
        ),
    ]
    return tuple(caps)


def goal_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the facts that finish the invoice case in `state`."""
    wanted = {"audit_report"}
    if state.get("hold_on_findings", True):
        wanted.add("hold_decided")
    return frozenset(wanted)


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
    build_state=build_state,
    demo_port=InMemoryErp,
    capabilities_from=capabilities,
    goal_facts_from=goal_facts,
)
