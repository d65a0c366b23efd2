"""Fraud investigation (seed 000's "investigate-fraud").

Static methods (`methods`) choose a full or a light investigation from the case inputs; the
goal-oriented capabilities (`goals`) use the same rule to choose the goal facts. Both build
their leaves from `leaves`. Tools (`tools`) read account activity through the `FraudData`
port (`data`). A case names an account the data knows. Once every step ended, `goal_check`
reads the account data: a freeze the case made must be recorded on the account.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planning.core.catalogue import AgentSpec
from planning.core.pack import DomainPack, GoalFindings
from planning.packs.fraud import goals
from planning.packs.fraud.data import FraudData, InMemoryFraudData
from planning.packs.fraud.inputs import FraudCaseInput, check_inputs, suggest_inputs
from planning.packs.fraud.methods import METHODS
from planning.packs.fraud.tools import TOOLS

AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec(
        slug="transaction-monitor",
        name="Transaction monitor",
        kind="tool",
        description="Reads account activity and flags anomalies",
        capabilities=("transactions.read", "transactions.analyse"),
        tools=("pull_transactions", "detect_anomalies"),
        trust=0.85,
    ),
    AgentSpec(
        slug="sanctions-screener",
        name="Sanctions screener",
        kind="tool",
        description="Screens counterparties against sanctions lists",
        capabilities=("sanctions.screen",),
        tools=("screen_sanctions",),
        trust=0.9,
    ),
    AgentSpec(
        slug="account-controls",
        name="Account controls",
        kind="tool",
        description="Freezes and unfreezes accounts",
        capabilities=("account.freeze",),
        tools=("freeze_account",),
        trust=0.6,
    ),
    AgentSpec(
        slug="fraud-analyst",
        name="Fraud analyst",
        kind="llm",
        description="Reviews evidence and drafts investigation findings",
        capabilities=("fraud.analyse", "report.draft"),
        trust=0.6,
    ),
    AgentSpec(
        slug="investigator",
        name="Investigator",
        kind="human",
        description="A fraud investigator who interviews customers",
        capabilities=("customer.interview",),
        trust=0.9,
    ),
    AgentSpec(
        slug="legal-counsel",
        name="Legal counsel",
        kind="human",
        description="Reviews findings before action is taken",
        capabilities=("legal.review",),
        trust=0.95,
    ),
)


def goal_check(outputs: Mapping[str, Any], data: FraudData) -> GoalFindings:
    """Return what keeps a fraud investigation from having reached its goal, and what held.

    What a case decides must be recorded on the account: every freeze a step made (an output
    with a `freeze_id`, whatever the step's key) is on the account it names.
    """
    problems: list[str] = []
    held: list[str] = []
    for output in outputs.values():
        if not isinstance(output, Mapping) or not {"account_id", "freeze_id"} <= output.keys():
            continue
        account, freeze_id = str(output["account_id"]), str(output["freeze_id"])
        if freeze_id not in data.freezes(account):
            problems.append(f"{account} is not frozen: freeze {freeze_id} is not on the account")
        else:
            held.append(f"{account} is frozen: freeze {freeze_id} is on the account")
    if not problems and not held:
        held.append("no step decided to act on the account, and none did")
    return GoalFindings(problems=tuple(problems), held=tuple(held))


PACK = DomainPack(
    slug="fraud",
    name="Fraud investigation",
    description="Investigate suspected fraud on an account",
    input_schema=FraudCaseInput,
    root_task="investigate-fraud",
    methods=METHODS,
    agents=AGENTS,
    tools=TOOLS,
    demo_port=InMemoryFraudData,
    check_data=check_inputs,
    suggest_inputs=suggest_inputs,
    capabilities=goals.capabilities,
    goal_facts=goals.goal_facts,
    # LLM and hybrid planning of this pack use this agent's model and system prompt when set.
    planner_agent="fraud-analyst",
    goal_check=goal_check,
)
