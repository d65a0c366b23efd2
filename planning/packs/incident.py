"""Incident response.

A database outage fails over, verifies connectivity and notifies stakeholders; a security
breach isolates the systems, runs a forensic analysis and notifies stakeholders. Any other
incident kind has no method on purpose, so hybrid planning asks the LLM for that subtree.

Goal-oriented planning declares one set of capabilities for both known kinds and picks the
goal facts by kind: an outage wants `recovery_announced` (and, at sev1, an
`outage_announced` alert sent while the fail-over runs); a breach wants `attack_path_known`
and `containment_announced`, which run side by side once the hosts are isolated. Any other
kind wants `incident_resolved`, which no capability produces, so the goal-oriented planner
raises `NoMethodMatched` just as the static methods do. Without affected hosts nothing can
be isolated, so a breach has no goal-oriented plan either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from planning.core.catalogue import AgentSpec, DomainPack, ToolSpec
from planning.core.goal import Capability
from planning.core.static import Item, Method, MethodLibrary, Step, TaskRef
from planning.core.validation import ref

DEMO_INFRASTRUCTURE: Mapping[str, Any] = {
    "databases": {
        "orders-db": {"primary": "db-orders-1", "replica": "db-orders-2"},
        "billing-db": {"primary": "db-billing-1", "replica": "db-billing-2"},
    },
    "down_hosts": ("db-orders-1",),
    "hosts": ("web-1", "web-2", "db-orders-1", "db-orders-2", "db-billing-1", "db-billing-2"),
    "owners": {
        "orders-db": ("orders-team@example.com", "cto@example.com"),
        "billing-db": ("billing-team@example.com", "cfo@example.com"),
    },
    "logs": {
        "web-2": (
            "02:14 ssh login root from 203.0.113.9",
            "02:16 /etc/passwd read",
            "02:20 outbound 4.2 GB to 203.0.113.9",
        ),
    },
}


class Infrastructure(Protocol):
    """Operations access for the incident tools."""

    def fail_over(self, service: str) -> tuple[str, str]: ...

    def is_reachable(self, host: str) -> bool: ...

    def primary(self, service: str) -> str: ...

    def isolate(self, hosts: Sequence[str]) -> Sequence[str]: ...

    def logs(self, host: str) -> Sequence[str]: ...

    def owners(self, service: str) -> Sequence[str]: ...

    def send(self, recipients: Sequence[str], message: str) -> None: ...


@dataclass
class InMemoryInfrastructure:
    """An `Infrastructure` port over plain Python data (the demo estate by default)."""

    data: Mapping[str, Any] = field(default_factory=lambda: DEMO_INFRASTRUCTURE)
    primaries: dict[str, str] = field(default_factory=dict)
    isolated: set[str] = field(default_factory=set)
    sent: list[tuple[tuple[str, ...], str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for service, db in self.data["databases"].items():
            self.primaries.setdefault(service, db["primary"])

    def primary(self, service: str) -> str:
        if service not in self.primaries:
            raise LookupError(f"unknown database service {service!r}")
        return self.primaries[service]

    def fail_over(self, service: str) -> tuple[str, str]:
        db = self.data["databases"][service]
        old = self.primary(service)
        new = db["replica"] if old == db["primary"] else db["primary"]
        self.primaries[service] = new
        return old, new

    def is_reachable(self, host: str) -> bool:
        return (
            host in self.data["hosts"]
            and host not in self.data["down_hosts"]
            and host not in self.isolated
        )

    def isolate(self, hosts: Sequence[str]) -> Sequence[str]:
        known = [h for h in hosts if h in self.data["hosts"]]
        self.isolated.update(known)
        return known

    def logs(self, host: str) -> Sequence[str]:
        return tuple(self.data["logs"].get(host, ()))

    def owners(self, service: str) -> Sequence[str]:
        return tuple(self.data["owners"].get(service, ("oncall@example.com",)))

    def send(self, recipients: Sequence[str], message: str) -> None:
        self.sent.append((tuple(recipients), message))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FailoverInput(_Model):
    service: str = Field(min_length=1)


class FailoverResult(_Model):
    service: str
    old_primary: str
    new_primary: str


class ConnectivityInput(_Model):
    service: str = Field(min_length=1)


class ConnectivityResult(_Model):
    service: str
    primary: str
    reachable: bool


class IsolateInput(_Model):
    hosts: list[str] = Field(min_length=1)


class IsolateResult(_Model):
    isolated: list[str]


class LogsInput(_Model):
    hosts: list[str] = Field(min_length=1)


class LogsResult(_Model):
    entries: dict[str, list[str]]


class NotifyInput(_Model):
    service: str = Field(min_length=1)
    summary: str = Field(min_length=3)
    detail: dict[str, Any] | None = None


class NotifyResult(_Model):
    recipients: list[str]


def fail_over_database(args: FailoverInput, infra: Infrastructure) -> FailoverResult:
    """Promote the replica of `service` to primary."""
    old, new = infra.fail_over(args.service)
    return FailoverResult(service=args.service, old_primary=old, new_primary=new)


def verify_connectivity(args: ConnectivityInput, infra: Infrastructure) -> ConnectivityResult:
    """Check that the current primary of `service` answers."""
    primary = infra.primary(args.service)
    return ConnectivityResult(
        service=args.service, primary=primary, reachable=infra.is_reachable(primary)
    )


def isolate_hosts(args: IsolateInput, infra: Infrastructure) -> IsolateResult:
    """Cut the hosts off the network."""
    return IsolateResult(isolated=list(infra.isolate(args.hosts)))


def collect_logs(args: LogsInput, infra: Infrastructure) -> LogsResult:
    """Collect the hosts' security logs for forensics."""
    return LogsResult(entries={h: list(infra.logs(h)) for h in args.hosts})


def notify_stakeholders(args: NotifyInput, infra: Infrastructure) -> NotifyResult:
    """Send the incident summary to the service's owners."""
    recipients = list(infra.owners(args.service))
    message = args.summary if args.detail is None else f"{args.summary}: {args.detail}"
    infra.send(recipients, message)
    return NotifyResult(recipients=recipients)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="fail_over_database",
        description="Promote a database replica",
        input_model=FailoverInput,
        output_model=FailoverResult,
        risk="destructive",
        func=fail_over_database,
    ),
    ToolSpec(
        name="verify_connectivity",
        description="Check a database primary answers",
        input_model=ConnectivityInput,
        output_model=ConnectivityResult,
        risk="read",
        func=verify_connectivity,
    ),
    ToolSpec(
        name="isolate_hosts",
        description="Cut hosts off the network",
        input_model=IsolateInput,
        output_model=IsolateResult,
        risk="destructive",
        func=isolate_hosts,
    ),
    ToolSpec(
        name="collect_logs",
        description="Collect security logs from hosts",
        input_model=LogsInput,
        output_model=LogsResult,
        risk="read",
        func=collect_logs,
    ),
    ToolSpec(
        name="notify_stakeholders",
        description="Email the service owners",
        input_model=NotifyInput,
        output_model=NotifyResult,
        risk="external",
        func=notify_stakeholders,
    ),
)

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


class IncidentCaseInput(_Model):
    """The case inputs of an incident."""

    kind: str = Field(min_length=1, description="e.g. database-outage, security-breach")
    service: str = Field(min_length=1)
    severity: Literal["sev1", "sev2", "sev3"] = "sev2"
    affected_hosts: list[str] = Field(default_factory=list)


def build_state(inputs: IncidentCaseInput) -> dict[str, Any]:
    """Return the planning state of an incident."""
    return inputs.model_dump(mode="json")


def _outage(state: Mapping[str, Any]) -> Sequence[Item]:
    service = state["service"]
    return [
        Step(
            key="fail-over",
            agent="db-operator",
            task=f"Fail over {service}",
            tool="fail_over_database",
            inputs={"service": service},
            risk="destructive",
            failure_policy="escalate",
            effects={"failed_over": True},
        ),
        Step(
            key="verify-connectivity",
            agent="db-operator",
            task=f"Verify {service} answers on the new primary",
            tool="verify_connectivity",
            inputs={"service": service},
            failure_policy="retry",
            reads=frozenset({"failed_over"}),
            effects={"connectivity_verified": True},
        ),
        Step(
            key="notify-stakeholders",
            agent="comms-officer",
            task="Notify the stakeholders",
            tool="notify_stakeholders",
            inputs={
                "service": service,
                "summary": f"{service} failed over",
                "detail": ref("verify-connectivity"),
            },
            reads=frozenset({"connectivity_verified"}),
        ),
    ]


def _breach(state: Mapping[str, Any]) -> Sequence[Item]:
    hosts = list(state.get("affected_hosts") or ())
    return [
        Step(
            key="isolate-systems",
            agent="network-guard",
            task="Isolate the affected systems",
            tool="isolate_hosts",
            inputs={"hosts": hosts},
            risk="destructive",
            failure_policy="escalate",
            effects={"isolated": True},
        ),
        TaskRef(
            task="forensic-analysis",
            key="forensic-analysis",
            description="establish the attack path from the affected hosts' logs",
        ),
        Step(
            key="notify-stakeholders",
            agent="comms-officer",
            task="Notify the stakeholders",
            tool="notify_stakeholders",
            inputs={"service": state["service"], "summary": "security breach contained"},
            reads=frozenset({"forensics_done"}),
        ),
    ]


def _forensics(state: Mapping[str, Any]) -> Sequence[Item]:
    hosts = list(state.get("affected_hosts") or ())
    return [
        Step(
            key="collect-logs",
            agent="network-guard",
            task="Collect the security logs",
            tool="collect_logs",
            inputs={"hosts": hosts},
            reads=frozenset({"isolated"}),
            effects={"logs_collected": True},
        ),
        Step(
            key="analyse-attack-path",
            agent="forensic-analyst",
            task="Reconstruct the attack path from the logs",
            reads=frozenset({"logs_collected"}),
            effects={"forensics_done": True},
        ),
    ]


METHODS = MethodLibrary(
    [
        Method(
            name="database-outage-response",
            task="respond-to-incident",
            guard=lambda s: s.get("kind") == "database-outage",
            decompose=_outage,
        ),
        Method(
            name="security-breach-response",
            task="respond-to-incident",
            guard=lambda s: s.get("kind") == "security-breach" and bool(s.get("affected_hosts")),
            decompose=_breach,
        ),
        Method(name="forensics-from-logs", task="forensic-analysis", decompose=_forensics),
    ]
)

# -- goal-oriented capabilities -------------------------------------------------------------


def capabilities(state: Mapping[str, Any]) -> tuple[Capability, ...]:
    """Return the goal-oriented capabilities for the incident in `state`.

    Raises `KeyError` when the state has no `service`.
    """
    service = state["service"]
    hosts = list(state.get("affected_hosts") or ())
    caps = [
        Capability(
            name="alert-stakeholders",
            agent="comms-officer",
            task="Alert the stakeholders that the service is down",
            inputs=frozenset({"service"}),
            outputs=frozenset({"outage_announced"}),
            cost=1.0,
            rationale="a sev1 outage is announced at once, while recovery runs",
            tool="notify_stakeholders",
            tool_inputs={"service": service, "summary": f"{service} is down; recovery under way"},
            expected_output="NotifyResult",
        ),
        Capability(
            name="fail-over",
            agent="db-operator",
            task=f"Fail over {service}",
            inputs=frozenset({"service"}),
            outputs=frozenset({"service_restored"}),
            cost=2.0,
            rationale="promoting the replica is the fastest way back",
            tool="fail_over_database",
            tool_inputs={"service": service},
            expected_output="FailoverResult",
            failure_policy="escalate",
            risk="destructive",
        ),
        Capability(
            name="restore-by-hand",
            agent="incident-commander",
            task=f"Restore the primary of {service} by hand",
            inputs=frozenset({"service"}),
            outputs=frozenset({"service_restored"}),
            cost=8.0,
            rationale="a manual restore when no fail-over is possible",
            failure_policy="escalate",
        ),
        Capability(
            name="verify-connectivity",
            agent="db-operator",
            task=f"Verify {service} answers on its primary",
            inputs=frozenset({"service_restored"}),
            outputs=frozenset({"connectivity_verified"}),
            cost=1.0,
            rationale="announce recovery only once the primary answers",
            tool="verify_connectivity",
            tool_inputs={"service": service},
            expected_output="ConnectivityResult",
            failure_policy="retry",
        ),
        Capability(
            name="notify-stakeholders",
            agent="comms-officer",
            task="Notify the stakeholders that the service is back",
            inputs=frozenset({"connectivity_verified"}),
            outputs=frozenset({"recovery_announced"}),
            cost=1.0,
            tool="notify_stakeholders",
            tool_inputs={
                "service": service,
                "summary": f"{service} is back in service",
                "detail": ref("verify-connectivity"),
            },
            expected_output="NotifyResult",
        ),
        Capability(
            name="collect-logs",
            agent="network-guard",
            task="Collect the security logs",
            inputs=frozenset({"hosts_isolated"}),
            outputs=frozenset({"logs_collected"}),
            cost=1.0,
            rationale="the logs of the isolated hosts are the evidence",
            tool="collect_logs",
            tool_inputs={"hosts": hosts},
            expected_output="LogsResult",
        ),
        Capability(
            name="analyse-attack-path",
            agent="forensic-analyst",
            task="Reconstruct the attack path from the logs",
            inputs=frozenset({"logs_collected"}),
            outputs=frozenset({"attack_path_known"}),
            cost=2.0,
        ),
        Capability(
            name="review-logs-by-hand",
            agent="incident-commander",
            task="Read the collected logs and reconstruct the attack path by hand",
            inputs=frozenset({"logs_collected"}),
            outputs=frozenset({"attack_path_known"}),
            cost=6.0,
        ),
        Capability(
            name="announce-containment",
            agent="comms-officer",
            task="Notify the stakeholders that the breach is contained",
            inputs=frozenset({"hosts_isolated"}),
            outputs=frozenset({"containment_announced"}),
            cost=1.0,
            rationale="stakeholders hear of the containment while forensics continue",
            tool="notify_stakeholders",
            tool_inputs={
                "service": service,
                "summary": "security breach contained",
                "detail": ref("isolate-systems"),
            },
            expected_output="NotifyResult",
        ),
    ]
    if hosts:
        caps.append(
            Capability(
                name="isolate-systems",
                agent="network-guard",
                task="Isolate the affected systems",
                inputs=frozenset({"affected_hosts"}),
                outputs=frozenset({"hosts_isolated"}),
                cost=1.0,
                rationale="cut the attacker off before anything else",
                tool="isolate_hosts",
                tool_inputs={"hosts": hosts},
                expected_output="IsolateResult",
                failure_policy="escalate",
                risk="destructive",
            )
        )
    return tuple(caps)


def goal_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the facts that close the incident in `state`, chosen by its kind."""
    kind = state.get("kind")
    if kind == "database-outage":
        if state.get("severity") == "sev1":
            return frozenset({"outage_announced", "recovery_announced"})
        return frozenset({"recovery_announced"})
    if kind == "security-breach":
        return frozenset({"attack_path_known", "containment_announced"})
    return frozenset({"incident_resolved"})


PACK = DomainPack(
    slug="incident",
    name="Incident response",
    description="Respond to an operational or security incident",
    input_schema=IncidentCaseInput,
    root_task="respond-to-incident",
    methods=METHODS,
    agents=AGENTS,
    tools=TOOLS,
    build_state=build_state,
    demo_port=InMemoryInfrastructure,
    capabilities_from=capabilities,
    goal_facts_from=goal_facts,
)
