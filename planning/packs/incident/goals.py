"""Goal-oriented incident response: the leaves as capabilities over facts.

One set of capabilities serves both known kinds, and the goal facts are picked by kind: an
outage wants `recovery_announced` (and, at sev1, an `outage_announced` alert sent while the
fail-over runs); a breach wants `attack_path_known` and `containment_announced`, which run side
by side once the hosts are isolated. Any other kind wants `incident_resolved`, which no
capability produces, so the goal-oriented planner raises `NoMethodMatched` just as the static
methods do. Without affected hosts nothing can be isolated and no logs collected (both tools
need at least one host), so neither capability is offered and a breach has no goal-oriented plan
either. Where the installation has no LLM provider, the forensic analyst's reading is not
offered: the incident commander reads the logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planning.core.goal import Capability
from planning.core.pack import has_llm_provider
from planning.packs.incident import leaves
from planning.packs.incident.inputs import DATABASE_OUTAGE, SECURITY_BREACH


def capabilities(state: Mapping[str, Any]) -> tuple[Capability, ...]:
    """Return the goal-oriented capabilities for the incident in `state`.

    Raises `KeyError` when the state has no `service`.
    """
    service = state["service"]
    hosts = list(state.get("affected_hosts") or ())
    caps = [
        Capability.from_step(
            leaves.alert_stakeholders(service), inputs={"service"}, outputs={"outage_announced"}
        ),
        Capability.from_step(
            leaves.fail_over(service), inputs={"service"}, outputs={"service_restored"}, cost=2.0
        ),
        Capability.from_step(
            leaves.restore_by_hand(service),
            inputs={"service"},
            outputs={"service_restored"},
            cost=8.0,
        ),
        Capability.from_step(
            leaves.verify_connectivity(service),
            inputs={"service_restored"},
            outputs={"connectivity_verified"},
        ),
        Capability.from_step(
            leaves.notify_recovery(service),
            inputs={"connectivity_verified"},
            outputs={"recovery_announced"},
        ),
        *(
            (
                Capability.from_step(
                    leaves.analyse_attack_path(),
                    inputs={"logs_collected"},
                    outputs={"attack_path_known"},
                    cost=2.0,
                ),
            )
            if has_llm_provider(state)
            else ()
        ),
        Capability.from_step(
            leaves.review_logs_by_hand(),
            inputs={"logs_collected"},
            outputs={"attack_path_known"},
            cost=6.0,
        ),
        Capability.from_step(
            leaves.announce_containment(service),
            inputs={"hosts_isolated"},
            outputs={"containment_announced"},
        ),
    ]
    if hosts:
        # both tools act on named hosts: without any, neither is offered (to the goal-oriented
        # planner or, as the pack's actions, to the LLM)
        caps += [
            Capability.from_step(
                leaves.isolate_systems(hosts),
                inputs={"affected_hosts"},
                outputs={"hosts_isolated"},
            ),
            Capability.from_step(
                leaves.collect_logs(hosts), inputs={"hosts_isolated"}, outputs={"logs_collected"}
            ),
        ]
    return tuple(caps)


def goal_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the facts that close the incident in `state`, chosen by its kind."""
    kind = state.get("kind")
    if kind == DATABASE_OUTAGE:
        if state.get("severity") == "sev1":
            return frozenset({"outage_announced", "recovery_announced"})
        return frozenset({"recovery_announced"})
    if kind == SECURITY_BREACH:
        return frozenset({"attack_path_known", "containment_announced"})
    return frozenset({"incident_resolved"})
