"""The incident tools: their pydantic input and output models, the functions, and their specs.

Every tool takes its validated input model and an `Infrastructure` port.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from planning.core.catalogue import ToolSpec
from planning.packs.incident.infrastructure import Infrastructure
from planning.packs.schema import PackModel


class FailoverInput(PackModel):
    service: str = Field(min_length=1)


class FailoverResult(PackModel):
    service: str
    old_primary: str
    new_primary: str


class ConnectivityInput(PackModel):
    service: str = Field(min_length=1)


class ConnectivityResult(PackModel):
    service: str
    primary: str
    reachable: bool


class IsolateInput(PackModel):
    hosts: list[str] = Field(min_length=1)


class IsolateResult(PackModel):
    isolated: list[str]


class LogsInput(PackModel):
    hosts: list[str] = Field(min_length=1)


class LogsResult(PackModel):
    entries: dict[str, list[str]]


class NotifyInput(PackModel):
    service: str = Field(min_length=1)
    summary: str = Field(min_length=3)
    detail: dict[str, Any] | None = None


class NotifyResult(PackModel):
    service: str
    recipients: list[str]
    message: str


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


def _described(detail: Mapping[str, Any]) -> str:
    # A connectivity check reads as what it found, so a notice never hides that the service
    # still does not answer.
    if {"service", "primary", "reachable"} <= detail.keys():
        if detail["reachable"] is True:
            return (
                f"{detail['service']} answers on its primary {detail['primary']}; "
                "it is back in service"
            )
        return (
            f"{detail['service']} does not answer on its primary {detail['primary']}; "
            "it is still down"
        )
    return str(dict(detail))


def notify_stakeholders(args: NotifyInput, infra: Infrastructure) -> NotifyResult:
    """Send the incident summary to the service's owners, with what the detail found."""
    recipients = list(infra.owners(args.service))
    message = args.summary if args.detail is None else f"{args.summary}: {_described(args.detail)}"
    infra.send(recipients, message)
    return NotifyResult(service=args.service, recipients=recipients, message=message)


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
