"""Cases whose execution reached a person: a human step waiting as a work item, for API and page
tests. The plan runs through the real actions; only the first step is made a person's job."""

from __future__ import annotations

from typing import Any

from execution import actions as execution
from execution.models import WorkItem
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.models import Case, PlanNode
from tests.cases import planned_invoice_case

# The invoice pack's accounts-payable reviewer: a human agent, so its steps go to the analysts.
HUMAN_AGENT = "ap-reviewer"


def approve_plan(case: Case, officer: Any) -> None:
    """Approve the case's pending plan gate: the case executes and its first step is ready."""
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING)
    decide_gate(gate_id=gate.pk, user=officer, decision=DecisionInput(decision="approve"))


def waiting_work_item(submitter: Any, officer: Any) -> WorkItem:
    """Return the open work item of an executing INV-1042 case whose first step is a person's.

    The step `extract-fields` is given to the human agent (no tool) before it runs; it keeps its
    expected output, InvoiceFields, so the person's output is checked against that schema.
    """
    case = planned_invoice_case(submitter)
    approve_plan(case, officer)
    node = PlanNode.objects.get(version_id=case.current_version_id, key="extract-fields")
    PlanNode.objects.filter(pk=node.pk).update(agent=HUMAN_AGENT, tool="")
    outcome = execution.execute_leaf(node.pk, worker="test")
    assert outcome == [f"{node.pk} waits for a person"], outcome
    return WorkItem.objects.select_related("case", "node").get(node=node)


# What the demo ERP's INV-1042 looks like, as a person would type it from the document.
INVOICE_FIELDS = {
    "invoice_id": "INV-1042",
    "supplier_id": "SUP-1001",
    "po_number": "PO-5001",
    "invoice_date": "2026-09-28",
    "currency": "EUR",
    "total": "1000.00",
    "line_items": [
        {"description": "A4 paper (box)", "quantity": 10, "unit_price": "25.00"},
        {"description": "Toner cartridge", "quantity": 5, "unit_price": "150.00"},
    ],
}
