"""Every leaf of a fraud investigation, written once.

The static methods (`methods`) and the goal-oriented capabilities (`goals`) both build their
leaves from these; each adds only its own wiring (sibling order and state effects, or facts
and costs).
"""

from __future__ import annotations

from planning.core.static import Step

# Who writes up the findings where no LLM provider is configured: the investigator, a person
# (a work item), instead of the `llm` agent fraud-analyst, whose step could not run.
WRITER_WITHOUT_LLM = "investigator"
WITHOUT_LLM = "no LLM provider is configured here, so a person writes the findings"


def pull_transactions(account_id: str) -> Step:
    """Return the leaf that summarises the account's transactions."""
    return Step(
        key="pull-transactions",
        agent="transaction-monitor",
        task="Pull the transactions",
        rationale="the findings and the interview rest on the account's activity",
        tool="pull_transactions",
        inputs={"account_id": account_id},
        expected_output="TransactionSummary",
    )


def detect_anomalies(account_id: str) -> Step:
    """Return the leaf that flags the account's outlier transactions."""
    return Step(
        key="detect-anomalies",
        agent="transaction-monitor",
        task="Detect anomalies",
        rationale="flag the outlier transactions automatically",
        tool="detect_anomalies",
        inputs={"account_id": account_id},
        expected_output="AnomalyReport",
    )


def review_anomalies() -> Step:
    """Return the leaf in which the analyst points out unusual transactions by reading."""
    return Step(
        key="review-anomalies",
        agent="fraud-analyst",
        task="Read the transaction summary and point out unusual transactions",
        rationale="an analyst's reading stands in for the anomaly detector",
    )


def screen_sanctions(account_id: str) -> Step:
    """Return the leaf that screens the account's counterparties against sanctions lists."""
    return Step(
        key="screen-sanctions",
        agent="sanctions-screener",
        task="Screen the counterparties",
        rationale="payments to sanctioned parties change the case entirely",
        tool="screen_sanctions",
        inputs={"account_id": account_id},
        expected_output="SanctionsResult",
    )


def interview_customer() -> Step:
    """Return the human leaf in which an investigator interviews the customer."""
    return Step(
        key="interview-customer",
        agent="investigator",
        task="Interview the customer about the flagged activity",
        rationale="serious cases need the customer's side",
    )


def summarise_findings(*, by_person: bool = False) -> Step:
    """Return the leaf that summarises a light case's findings (by a person: `by_person`)."""
    return Step(
        key="summarise-findings",
        agent=WRITER_WITHOUT_LLM if by_person else "fraud-analyst",
        task="Summarise the findings for the case file",
        rationale=WITHOUT_LLM if by_person else "",
    )


def draft_findings(*, by_person: bool = False) -> Step:
    """Return the leaf that drafts a serious case's findings from all the evidence (by a person:
    `by_person`)."""
    return Step(
        key="draft-findings",
        agent=WRITER_WITHOUT_LLM if by_person else "fraud-analyst",
        task="Draft the findings from the anomalies, sanctions hits and interview",
        rationale=WITHOUT_LLM if by_person else "",
    )


def legal_review() -> Step:
    """Return the human leaf in which legal counsel reviews the findings."""
    return Step(
        key="legal-review",
        agent="legal-counsel",
        task="Review the findings before any action on the account",
    )


def freeze_account(account_id: str) -> Step:
    """Return the (financial) leaf that freezes the account."""
    return Step(
        key="freeze-account",
        agent="account-controls",
        task="Freeze the account",
        rationale="legally reviewed findings justify blocking the funds",
        tool="freeze_account",
        inputs={"account_id": account_id, "reason": "serious fraud investigation findings"},
        expected_output="FreezeResult",
        failure_policy="escalate",
        risk="financial",
    )
