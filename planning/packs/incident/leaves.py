"""Every leaf of incident response, written once.

The static methods (`methods`) and the goal-oriented capabilities (`goals`) both build their
leaves from these; each adds only its own wiring (sibling order and state effects, or facts
and costs).
"""

from __future__ import annotations

from collections.abc import Sequence

from planning.core.refs import ref
from planning.core.static import Step


def alert_stakeholders(service: str) -> Step:
    """Return the leaf that tells the service's owners it is down while recovery runs."""
    return Step(
        key="alert-stakeholders",
        agent="comms-officer",
        task="Alert the stakeholders that the service is down",
        rationale="a sev1 outage is announced at once, while recovery runs",
        tool="notify_stakeholders",
        inputs={"service": service, "summary": f"{service} is down; recovery under way"},
        expected_output="NotifyResult",
    )


def fail_over(service: str) -> Step:
    """Return the (destructive) leaf that promotes the database's replica."""
    return Step(
        key="fail-over",
        agent="db-operator",
        task=f"Fail over {service}",
        rationale="promoting the replica is the fastest way back",
        tool="fail_over_database",
        inputs={"service": service},
        expected_output="FailoverResult",
        failure_policy="escalate",
        risk="destructive",
    )


def restore_by_hand(service: str) -> Step:
    """Return the human leaf in which the incident commander restores the primary."""
    return Step(
        key="restore-by-hand",
        agent="incident-commander",
        task=f"Restore the primary of {service} by hand",
        rationale="a manual restore when no fail-over is possible",
        failure_policy="escalate",
    )


def verify_connectivity(service: str) -> Step:
    """Return the leaf that checks the service's primary answers."""
    return Step(
        key="verify-connectivity",
        agent="db-operator",
        task=f"Verify {service} answers on its primary",
        rationale="announce recovery only once the primary answers",
        tool="verify_connectivity",
        inputs={"service": service},
        expected_output="ConnectivityResult",
        failure_policy="retry",
    )


def notify_recovery(service: str) -> Step:
    """Return the leaf that tells the service's owners whether it is back: the connectivity check.

    The summary claims nothing: the notice says what the check found (`tools.notify_stakeholders`).
    """
    return Step(
        key="notify-stakeholders",
        agent="comms-officer",
        task="Notify the stakeholders that the service is back",
        tool="notify_stakeholders",
        inputs={
            "service": service,
            "summary": f"Outage of {service}",
            "detail": ref("verify-connectivity"),
        },
        expected_output="NotifyResult",
    )


def isolate_systems(hosts: Sequence[str]) -> Step:
    """Return the (destructive) leaf that cuts the affected hosts off the network."""
    return Step(
        key="isolate-systems",
        agent="network-guard",
        task="Isolate the affected systems",
        rationale="cut the attacker off before anything else",
        tool="isolate_hosts",
        inputs={"hosts": list(hosts)},
        expected_output="IsolateResult",
        failure_policy="escalate",
        risk="destructive",
    )


def collect_logs(hosts: Sequence[str]) -> Step:
    """Return the leaf that collects the affected hosts' security logs."""
    return Step(
        key="collect-logs",
        agent="network-guard",
        task="Collect the security logs",
        rationale="the logs of the isolated hosts are the evidence",
        tool="collect_logs",
        inputs={"hosts": list(hosts)},
        expected_output="LogsResult",
    )


def analyse_attack_path() -> Step:
    """Return the leaf in which the forensic analyst reconstructs the attack path."""
    return Step(
        key="analyse-attack-path",
        agent="forensic-analyst",
        task="Reconstruct the attack path from the logs",
    )


def review_logs_by_hand() -> Step:
    """Return the human leaf in which the incident commander reads the logs instead."""
    return Step(
        key="review-logs-by-hand",
        agent="incident-commander",
        task="Read the collected logs and reconstruct the attack path by hand",
    )


def announce_containment(service: str) -> Step:
    """Return the leaf that tells the service's owners the breach is contained."""
    return Step(
        key="announce-containment",
        agent="comms-officer",
        task="Notify the stakeholders that the breach is contained",
        rationale="stakeholders hear of the containment once the hosts are cut off",
        tool="notify_stakeholders",
        inputs={
            "service": service,
            "summary": "security breach contained",
            "detail": ref("isolate-systems"),
        },
        expected_output="NotifyResult",
    )
