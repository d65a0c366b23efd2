"""The estate the incident tools act on: its port, an in-memory port, and the demo estate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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

    def has_host(self, host: str) -> bool: ...

    def has_database(self, service: str) -> bool: ...

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

    def has_host(self, host: str) -> bool:
        return host in self.data["hosts"]

    def has_database(self, service: str) -> bool:
        return service in self.data["databases"]

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
