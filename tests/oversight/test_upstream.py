"""What a gated step acts on, in words: an output on one line, or why there is none."""

from __future__ import annotations

from oversight.upstream import NOT_RUN, acted_on, output_summary, run_state, shown_input
from planning.models import NodeStatus, PlanNode


def _node(key: str, status: str = NodeStatus.PENDING, **fields: object) -> PlanNode:
    return PlanNode(key=key, kind=PlanNode.Kind.LEAF, status=status, **fields)


def test_an_output_reads_on_one_line_single_values_before_lists() -> None:
    report = {"invoice_id": "INV-1042", "findings": ["a", "b\nc"], "recommendation": "hold"}
    assert output_summary(report) == (
        "invoice id: INV-1042 · recommendation: hold · findings: a; b c"
    )
    assert output_summary({"placed": True, "hold_id": None}) == "placed: yes · hold id: none"
    assert len(output_summary({"text": "x" * 5000})) <= 600
    assert output_summary("plain text from an LLM") == "plain text from an LLM"


def test_a_step_without_an_output_says_why() -> None:
    assert run_state(_node("a")) == NOT_RUN
    assert run_state(_node("a", NodeStatus.READY)) == NOT_RUN
    assert run_state(_node("a", NodeStatus.RUNNING)) == "running: no output yet"
    assert run_state(_node("a", NodeStatus.FAILED, error="ERP down")) == (
        "failed: no output (ERP down)"
    )
    assert run_state(_node("a", NodeStatus.SKIPPED)) == "skipped: it did not run"
    assert run_state(_node("a", NodeStatus.SUCCEEDED, output={"ok": True})) == ""
    assert run_state(None) == "not a step of this plan version"


def test_a_reference_reads_as_the_output_once_its_step_ran() -> None:
    report = _node("audit-report", NodeStatus.SUCCEEDED, output={"recommendation": "hold"})
    hold = _node("place-hold", inputs={"report": {"$ref": "audit-report"}, "note": "x"})
    ref = {"$ref": "audit-report"}
    unrun = {"audit-report": _node("audit-report")}
    assert shown_input(ref, unrun) == "the output of audit-report, once it has run"
    ran = {"audit-report": report}
    assert shown_input(ref, ran) == "the output of audit-report: recommendation: hold"
    assert shown_input(ref | {"field": "recommendation"}, ran) == (
        "the output of audit-report (recommendation): hold"
    )
    assert acted_on(hold, {"audit-report": report}) == (
        "the output of audit-report (recommendation: hold)"
    )
    assert acted_on(hold, {"audit-report": _node("audit-report")}) == (
        "the output of audit-report, not run yet"
    )
