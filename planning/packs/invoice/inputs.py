"""The case inputs of an invoice verification, and their check against the ERP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from planning.packs.invoice.erp import ErpData
from planning.packs.invoice.tools import InvoiceId
from planning.packs.schema import PackModel


class InvoiceCaseInput(PackModel):
    """The case inputs of an invoice verification."""

    invoice_id: Annotated[
        InvoiceId, Field(title="Invoice number", description="The ERP's invoice number.")
    ]
    check_purchase_order: bool = Field(
        default=True,
        title="Check the purchase order",
        description="Compare the invoice with its purchase order.",
    )
    hold_on_findings: bool = Field(
        default=True,
        title="Propose a payment hold on findings",
        description="Add a payment-hold step (a financial write) when a check finds a problem.",
    )


def check_inputs(values: Mapping[str, Any], erp: ErpData) -> dict[str, list[str]]:
    """Return the problems of the accepted case inputs against the ERP, by field."""
    invoice_id = values.get("invoice_id")
    if isinstance(invoice_id, str) and not erp.has_invoice(invoice_id):
        return {"invoice_id": [f"{invoice_id} is not in the ERP."]}
    return {}


def suggest_inputs(erp: ErpData) -> dict[str, Mapping[str, str]]:
    """Return the invoices the ERP holds, to offer for a case."""
    return {"invoice_id": dict.fromkeys(erp.invoices(), "")}
