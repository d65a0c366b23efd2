"""Goal-oriented fraud investigation: the leaves as capabilities over facts.

The static methods' rule chooses the goal facts: a light case wants `findings_summarised`, a
serious one `account_frozen`, which needs legally reviewed findings drawn from the anomalies,
the sanctions screening and a customer interview. The three read-only tools take the account
number directly, so pulling, anomaly detection and screening run side by side; the analyst
can stand in for the anomaly detector at a higher cost. Where the installation has no LLM
provider, a person writes the findings and nobody reads in for the detector.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planning.core.goal import Capability
from planning.core.pack import has_llm_provider
from planning.packs.fraud import leaves
from planning.packs.fraud.methods import is_serious


def capabilities(state: Mapping[str, Any]) -> tuple[Capability, ...]:
    """Return the goal-oriented capabilities for the fraud case in `state`.

    Raises `KeyError` when the state has no `account_id`.
    """
    account = state["account_id"]
    evidence = {"transactions", "anomalies", "sanctions_screened", "customer_interviewed"}
    by_person = not has_llm_provider(state)
    # Without an LLM the analyst cannot read in for the detector; a person writes the findings.
    reading = (
        ()
        if by_person
        else (
            Capability.from_step(
                leaves.review_anomalies(), inputs={"transactions"}, outputs={"anomalies"}, cost=4.0
            ),
        )
    )
    return (
        Capability.from_step(
            leaves.pull_transactions(account), inputs={"account_id"}, outputs={"transactions"}
        ),
        Capability.from_step(
            leaves.detect_anomalies(account), inputs={"account_id"}, outputs={"anomalies"}
        ),
        *reading,
        Capability.from_step(
            leaves.screen_sanctions(account),
            inputs={"account_id"},
            outputs={"sanctions_screened"},
        ),
        Capability.from_step(
            leaves.interview_customer(),
            inputs={"transactions"},
            outputs={"customer_interviewed"},
            cost=5.0,
        ),
        Capability.from_step(
            leaves.summarise_findings(by_person=by_person),
            inputs={"transactions", "anomalies"},
            outputs={"findings_summarised"},
        ),
        Capability.from_step(
            leaves.draft_findings(by_person=by_person),
            inputs=evidence,
            outputs={"findings_drafted"},
            cost=2.0,
        ),
        Capability.from_step(
            leaves.legal_review(),
            inputs={"findings_drafted"},
            outputs={"findings_reviewed"},
            cost=3.0,
        ),
        Capability.from_step(
            leaves.freeze_account(account),
            inputs={"findings_reviewed"},
            outputs={"account_frozen"},
        ),
    )


def goal_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the facts that finish the fraud case in `state` (serious cases end frozen)."""
    return frozenset({"account_frozen"} if is_serious(state) else {"findings_summarised"})
