"""Incident response.

Static methods (`methods`) handle a database outage and a security breach; any other kind has
no method on purpose, so hybrid planning asks the LLM for that subtree. The goal-oriented
capabilities (`goals`) pick their goal facts by kind. Both build their leaves from `leaves`.
Tools (`tools`) act on the estate through the `Infrastructure` port (`infrastructure`). An
outage names a database the estate runs, and affected hosts must exist. Once every step ended,
`goal_check` reads the estate: a failed-over service must answer, isolated hosts must not, and
no notice may claim a recovery the estate refutes.
"""

from __future__ import annotations

from planning.core.catalogue import AgentSpec
from planning.core.pack import DomainPack
from planning.packs.incident import goals
from planning.packs.incident.goal_check import goal_check
from planning.packs.incident.infrastructure import InMemoryInfrastructure
from planning.packs.incident.inputs import IncidentCaseInput, check_inputs, suggest_inputs
from planning.packs.incident.methods import METHODS
from planning.packs.incident.tools import TOOLS

AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec(
        slug="db-operator",
        name="Database operator",
        kind="tool",
        description="Fails over databases and checks their health",
        capabilities=("database.failover", "database.health"),
        tools=("fail_over_database", "verify_connectivity"),
        trust=0.7,
    ),
    AgentSpec(
        slug="network-guard",
        name="Network guard",
        kind="tool",
        description="Isolates hosts and collects their logs",
        capabilities=("network.isolate", "logs.collect"),
        tools=("isolate_hosts", "collect_logs"),
        trust=0.7,
    ),
    AgentSpec(
        slug="forensic-analyst",
        name="Forensic analyst",
        kind="llm",
        description="Analyses collected logs for the attack path",
        capabilities=("forensics.analyse",),
        trust=0.5,
    ),
    AgentSpec(
        slug="comms-officer",
        name="Communications officer",
        kind="tool",
        description="Notifies stakeholders about incidents",
        capabilities=("stakeholders.notify",),
        tools=("notify_stakeholders",),
        trust=0.8,
    ),
    AgentSpec(
        slug="incident-commander",
        name="Incident commander",
        kind="human",
        description="The on-call incident commander",
        capabilities=("incident.command",),
        trust=0.95,
    ),
)


PACK = DomainPack(
    slug="incident",
    name="Incident response",
    description="Respond to an operational or security incident",
    input_schema=IncidentCaseInput,
    root_task="respond-to-incident",
    methods=METHODS,
    agents=AGENTS,
    tools=TOOLS,
    demo_port=InMemoryInfrastructure,
    check_data=check_inputs,
    suggest_inputs=suggest_inputs,
    capabilities=goals.capabilities,
    goal_facts=goals.goal_facts,
    goal_check=goal_check,
)
