"""The case inputs of an incident, and their check against the estate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from planning.packs.incident.infrastructure import Infrastructure
from planning.packs.schema import PackModel

DATABASE_OUTAGE = "database-outage"
SECURITY_BREACH = "security-breach"


class IncidentCaseInput(PackModel):
    """The case inputs of an incident."""

    kind: str = Field(
        min_length=1,
        title="Kind of incident",
        description=f"e.g. {DATABASE_OUTAGE} or {SECURITY_BREACH}; other kinds need the LLM.",
    )
    service: str = Field(min_length=1, title="Service", description="The affected service.")
    severity: Literal["sev1", "sev2", "sev3"] = Field(default="sev2", title="Severity")
    affected_hosts: list[str] = Field(default_factory=list, title="Affected hosts")


def check_inputs(values: Mapping[str, Any], infra: Infrastructure) -> dict[str, list[str]]:
    """Return the problems of the accepted case inputs against the estate, by field.

    An outage must name a database service the estate runs; affected hosts must exist.
    """
    problems: dict[str, list[str]] = {}
    service = values.get("service")
    is_outage = values.get("kind") == DATABASE_OUTAGE
    if is_outage and isinstance(service, str) and not infra.has_database(service):
        problems["service"] = [f"{service} is not a known database service."]
    for i, host in enumerate(values.get("affected_hosts") or ()):
        if isinstance(host, str) and not infra.has_host(host):
            problems[f"affected_hosts.{i}"] = [f"{host} is not a known host."]
    return problems


def suggest_inputs(infra: Infrastructure) -> dict[str, Mapping[str, str]]:
    """Return the kinds the pack's methods plan, and the estate's services and hosts, to offer."""
    return {
        "kind": {
            DATABASE_OUTAGE: "fail over, verify connectivity, notify the owners",
            SECURITY_BREACH: "isolate the hosts, analyse the logs, notify",
        },
        "service": infra.databases(),
        "affected_hosts": infra.hosts(),
    }
