"""The estate the incident tools act on: its port, an in-memory port, and the demo estate.

The Django side supplies a database-backed port (`planning.catalogue.DatabaseInfrastructure`)
over the same estate, loaded from `DEMO_INFRASTRUCTURE`: its fail-overs, isolations and notices
last from one step to the next, once per the acting leaf's idempotency key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from planning.core.catalogue import ToolCall

# The demo estate. orders-db's primary is down and its replica up: a fail-over restores it.
# inventory-db's primary and replica are both down: a fail-over promotes a replica that does not
# answer, so the service stays down. billing-db is healthy. web-2 shows a break-in in its logs.
DEMO_INFRASTRUCTURE: Mapping[str, Any] = {
    "databases": {
        "orders-db": {
            "primary": "db-orders-1",
            "replica": "db-orders-2",
            "description": "primary db-orders-1 down, replica db-orders-2 up: a fail-over "
            "restores it",
        },
        "inventory-db": {
            "primary": "db-inventory-1",
            "replica": "db-inventory-2",
            "description": "primary db-inventory-1 and replica db-inventory-2 both down: a "
            "fail-over does not restore it",
        },
        "billing-db": {
            "primary": "db-billing-1",
            "replica": "db-billing-2",
            "description": "healthy: primary db-billing-1 and replica db-billing-2 both up",
        },
    },
    "down_hosts": ("db-orders-1", "db-inventory-1", "db-inventory-2"),
    "hosts": {
        "web-1": "web server",
        "web-2": "web server; its logs show a break-in",
        "db-orders-1": "a host of orders-db (down)",
        "db-orders-2": "a host of orders-db",
        "db-inventory-1": "a host of inventory-db (down)",
        "db-inventory-2": "a host of inventory-db (down)",
        "db-billing-1": "a host of billing-db",
        "db-billing-2": "a host of billing-db",
    },
    "owners": {
        "orders-db": ("orders-team@example.com", "cto@example.com"),
        "inventory-db": ("warehouse-team@example.com", "cto@example.com"),
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

# Who hears of an incident on a service that names no owners.
DEFAULT_OWNERS: tuple[str, ...] = ("oncall@example.com",)


class Infrastructure(Protocol):
    """Operations access for the incident tools and the pack's goal check.

    The effects (`fail_over`, `isolate`, `send`) happen once per idempotency key of the leaf
    the port acts for (`with_call`); a repeated call returns what the first one did.
    """

    def has_host(self, host: str) -> bool: ...

    def has_database(self, service: str) -> bool: ...

    def hosts(self) -> Mapping[str, str]:
        """Return the hosts by name, each with what it is (for people choosing one)."""
        ...

    def databases(self) -> Mapping[str, str]:
        """Return the database services by name, each with what it is."""
        ...

    def fail_over(self, service: str) -> tuple[str, str]:
        """Promote the other host of `service` to primary; return (old, new) primary.

        Raises LookupError for an unknown service.
        """
        ...

    def is_reachable(self, host: str) -> bool: ...

    def primary(self, service: str) -> str:
        """Return the current primary of `service`; raise LookupError for an unknown one."""
        ...

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
    # What each idempotency key did, shared by the ports `with_call` returns.
    done: dict[tuple[str, str], Any] = field(default_factory=dict)
    key: str = ""

    def __post_init__(self) -> None:
        for service, db in self.data["databases"].items():
            self.primaries.setdefault(service, db["primary"])

    def with_call(self, call: ToolCall) -> InMemoryInfrastructure:
        """Return this estate acting for one leaf: its effects happen once per the leaf's key."""
        return replace(self, key=call.idempotency_key)

    def has_host(self, host: str) -> bool:
        return host in self.data["hosts"]

    def has_database(self, service: str) -> bool:
        return service in self.data["databases"]

    def hosts(self) -> Mapping[str, str]:
        return dict(self.data["hosts"])

    def databases(self) -> Mapping[str, str]:
        return {name: db.get("description", "") for name, db in self.data["databases"].items()}

    def primary(self, service: str) -> str:
        if service not in self.primaries:
            raise LookupError(f"unknown database service {service!r}")
        return self.primaries[service]

    def fail_over(self, service: str) -> tuple[str, str]:
        if self.key and ("fail_over", self.key) in self.done:
            return self.done[("fail_over", self.key)]  # type: ignore[no-any-return]
        db = self.data["databases"].get(service)
        if db is None:
            raise LookupError(f"unknown database service {service!r}")
        old = self.primary(service)
        new = db["replica"] if old == db["primary"] else db["primary"]
        self.primaries[service] = new
        if self.key:
            self.done[("fail_over", self.key)] = (old, new)
        return old, new

    def is_reachable(self, host: str) -> bool:
        return (
            host in self.data["hosts"]
            and host not in self.data["down_hosts"]
            and host not in self.isolated
        )

    def isolate(self, hosts: Sequence[str]) -> Sequence[str]:
        if self.key and ("isolate", self.key) in self.done:
            return self.done[("isolate", self.key)]  # type: ignore[no-any-return]
        known = tuple(h for h in dict.fromkeys(hosts) if h in self.data["hosts"])
        self.isolated.update(known)
        if self.key:
            self.done[("isolate", self.key)] = known
        return known

    def logs(self, host: str) -> Sequence[str]:
        return tuple(self.data["logs"].get(host, ()))

    def owners(self, service: str) -> Sequence[str]:
        return tuple(self.data["owners"].get(service, DEFAULT_OWNERS))

    def send(self, recipients: Sequence[str], message: str) -> None:
        if self.key and ("send", self.key) in self.done:
            return
        self.sent.append((tuple(recipients), message))
        if self.key:
            self.done[("send", self.key)] = True
