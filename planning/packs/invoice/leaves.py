"""Every leaf of invoice verification, written once.

The static method (`methods`) and the goal-oriented capabilities (`goals`) both build their
leaves from these; each adds only its own wiring (sibling order and state effects, or facts
and costs).
"""

from __future__ import annotations

from typing import Any

from planning.core.refs import ref
from planning.core.static import Step

INVOICE = ref("extract-fields")


def extract_fields(invoice_id: str) -> Step:
    """Return the leaf that parses the invoice document into fields."""
    return Step(
        key="extract-fields",
        agent="invoice-extractor",
        task="Extract the invoice fields",
        rationale="every later check needs the structured fields",
        tool="extract_invoice_fields",
        inputs={"invoice_id": invoice_id},
        expected_output="InvoiceFields",
    )


def lookup_supplier() -> Step:
    """Return the leaf that reads the supplier master record of the extracted supplier."""
    return Step(
        key="lookup-supplier",
        agent="erp-connector",
        task="Look up the verified supplier",
        rationale="the checks and the report need the supplier master record",
        tool="get_supplier",
        inputs={"supplier_id": ref("extract-fields", "supplier_id")},
        expected_output="SupplierRecord",
        failure_policy="continue",
    )


def check_duplicate() -> Step:
    """Return the leaf that searches the payment history for this invoice."""
    return Step(
        key="check-duplicate",
        agent="payments-auditor",
        task="Check payment history for a duplicate payment",
        rationale="an invoice paid before must not be paid again",
        tool="check_duplicate_payment",
        inputs={"invoice": INVOICE},
        expected_output="DuplicateCheckResult",
        failure_policy="retry",
    )


def check_totals() -> Step:
    """Return the leaf that recomputes the total from the line items."""
    return Step(
        key="check-totals",
        agent="payments-auditor",
        task="Recompute the total from the line items",
        rationale="the stated total must equal the sum of the line items",
        tool="check_totals",
        inputs={"invoice": INVOICE},
        expected_output="TotalsCheckResult",
    )


def check_po() -> Step:
    """Return the leaf that matches the invoice to its purchase order."""
    return Step(
        key="check-po",
        agent="erp-connector",
        task="Match the invoice to its purchase order",
        rationale="the purchase order must exist, match the supplier and cover the amount",
        tool="check_purchase_order",
        inputs={"invoice": INVOICE},
        expected_output="PurchaseOrderCheckResult",
    )


def audit_report(*, with_po: bool) -> Step:
    """Return the leaf that compiles every check (the PO check `with_po`) into a report."""
    inputs: dict[str, Any] = {
        "invoice": INVOICE,
        "supplier": ref("lookup-supplier"),
        "duplicate": ref("check-duplicate"),
        "totals": ref("check-totals"),
    }
    if with_po:
        inputs["purchase_order"] = ref("check-po")
    return Step(
        key="audit-report",
        agent="audit-reporter",
        task="Compile the audit report",
        rationale="summarise every check into findings and a recommendation",
        tool="compile_audit_report",
        inputs=inputs,
        expected_output="AuditReport",
    )


def place_hold() -> Step:
    """Return the (financial) leaf that places a payment hold when the report recommends one."""
    return Step(
        key="place-hold",
        agent="payments-clerk",
        task="Place a payment hold if the report recommends one",
        rationale="the payment clerk acts on the report's recommendation",
        tool="place_payment_hold",
        inputs={"report": ref("audit-report")},
        expected_output="PaymentHoldResult",
        failure_policy="escalate",
        risk="financial",
    )


def review_hold() -> Step:
    """Return the human leaf in which accounts payable decide the hold by hand."""
    return Step(
        key="review-hold",
        agent="ap-reviewer",
        task="Read the audit report and decide by hand whether to hold the payment",
        rationale="a person decides the hold when no clerk can act on the report",
        failure_policy="escalate",
    )
