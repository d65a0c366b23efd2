"""The static methods of incident response.

A database outage fails over, verifies connectivity and notifies stakeholders; a security
breach isolates the systems, runs a forensic analysis and announces the containment. Any
other incident kind has no method on purpose, so hybrid planning asks the LLM for that
subtree. Both the breach and its forensics from the hosts' logs need affected hosts: without
any, nothing can be isolated and there are no logs to collect, so no method applies and hybrid
planning asks the LLM (which is not offered those tools either, `goals`). Where the installation
has no LLM provider (the state says so: `has_llm_provider`), the incident commander reads the
logs instead of the `llm` agent forensic-analyst, whose step could not run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from planning.core.pack import has_llm_provider
from planning.core.static import Item, Method, MethodLibrary, Step, TaskRef
from planning.packs.incident import leaves
from planning.packs.incident.inputs import DATABASE_OUTAGE, SECURITY_BREACH


def _hosts(state: Mapping[str, Any]) -> list[str]:
    return list(state.get("affected_hosts") or ())


def _outage(state: Mapping[str, Any]) -> Sequence[Item]:
    service = state["service"]
    return [
        replace(leaves.fail_over(service), effects={"failed_over": True}),
        replace(
            leaves.verify_connectivity(service),
            reads=frozenset({"failed_over"}),
            effects={"connectivity_verified": True},
        ),
        replace(leaves.notify_recovery(service), reads=frozenset({"connectivity_verified"})),
    ]


def _breach(state: Mapping[str, Any]) -> Sequence[Item]:
    return [
        replace(leaves.isolate_systems(_hosts(state)), effects={"isolated": True}),
        TaskRef(
            task="forensic-analysis",
            description="establish the attack path from the affected hosts' logs",
        ),
        replace(
            leaves.announce_containment(state["service"]),
            reads=frozenset({"isolated", "forensics_done"}),
        ),
    ]


def _forensics(state: Mapping[str, Any]) -> Sequence[Item]:
    return _forensics_read_by(state, leaves.analyse_attack_path())


def _forensics_by_hand(state: Mapping[str, Any]) -> Sequence[Item]:
    return _forensics_read_by(state, leaves.review_logs_by_hand())


def _forensics_read_by(state: Mapping[str, Any], reading: Step) -> Sequence[Item]:
    return [
        replace(
            leaves.collect_logs(_hosts(state)),
            reads=frozenset({"isolated"}),
            effects={"logs_collected": True},
        ),
        replace(reading, reads=frozenset({"logs_collected"}), effects={"forensics_done": True}),
    ]


METHODS = MethodLibrary(
    [
        Method(
            name="database-outage-response",
            task="respond-to-incident",
            guard=lambda s: s.get("kind") == DATABASE_OUTAGE,
            decompose=_outage,
        ),
        Method(
            name="security-breach-response",
            task="respond-to-incident",
            guard=lambda s: s.get("kind") == SECURITY_BREACH and bool(s.get("affected_hosts")),
            decompose=_breach,
        ),
        Method(
            name="forensics-from-logs-by-hand",
            task="forensic-analysis",
            guard=lambda s: bool(s.get("affected_hosts")) and not has_llm_provider(s),
            decompose=_forensics_by_hand,
            description="no LLM provider is configured: the incident commander reads the logs",
        ),
        Method(
            name="forensics-from-logs",
            task="forensic-analysis",
            guard=lambda s: bool(s.get("affected_hosts")),
            decompose=_forensics,
        ),
    ]
)
