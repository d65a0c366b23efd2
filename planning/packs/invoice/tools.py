"""The invoice tools: their pydantic input and output models, the functions, and their specs.

Every tool takes its validated input model and an `ErpData` port.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field

from planning.core.catalogue import ToolSpec
from planning.packs.invoice.erp import ErpData
from planning.packs.schema import Identifier, PackModel

InvoiceId = Annotated[str, Identifier(r"^INV-[0-9]{4,}$", "An invoice number", "INV-1042")]
SupplierId = Annotated[str, Identifier(r"^SUP-[0-9]{4,}$", "A supplier number", "SUP-1001")]
PoNumber = Annotated[str, Identifier(r"^PO-[0-9]{4,}$", "A purchase order number", "PO-5001")]


class InvoiceRef(PackModel):
    invoice_id: InvoiceId


class LineItem(PackModel):
    description: str
    quantity: int = Field(ge=1)
    unit_price: Decimal = Field(ge=0)


class InvoiceFields(PackModel):
    invoice_id: InvoiceId
    supplier_id: SupplierId
    po_number: PoNumber | None = None
    invoice_date: str
    currency: str = Field(min_length=3, max_length=3)
    total: Decimal
    line_items: list[LineItem]


class SupplierQuery(PackModel):
    supplier_id: SupplierId


class SupplierRecord(PackModel):
    supplier_id: str
    found: bool
    name: str = ""
    status: str = "missing"
    bank_account: str = ""


class DuplicateCheckInput(PackModel):
    invoice: InvoiceFields


class DuplicateCheckResult(PackModel):
    is_duplicate: bool
    matching_payments: list[str]
    paid_total: Decimal


class TotalsCheckInput(PackModel):
    invoice: InvoiceFields


class TotalsCheckResult(PackModel):
    matches: bool
    stated_total: Decimal
    computed_total: Decimal
    difference: Decimal


class PurchaseOrderCheckInput(PackModel):
    invoice: InvoiceFields


class PurchaseOrderCheckResult(PackModel):
    found: bool
    po_number: str | None
    matches_supplier: bool
    within_amount: bool
    remaining_amount: Decimal


class AuditReportInput(PackModel):
    invoice: InvoiceFields
    supplier: SupplierRecord
    duplicate: DuplicateCheckResult
    totals: TotalsCheckResult
    purchase_order: PurchaseOrderCheckResult | None = None


class AuditReport(PackModel):
    invoice_id: str
    findings: list[str]
    recommendation: Literal["approve", "hold"]


class PaymentHoldInput(PackModel):
    report: AuditReport


class PaymentHoldResult(PackModel):
    invoice_id: str
    placed: bool
    hold_id: str | None = None


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
