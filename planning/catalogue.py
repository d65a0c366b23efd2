"""The database side of the catalogue: packs, agents and tools from code into rows, rows back
into the planning core's specs, and the database-backed ports the pack tools read and act on
(the invoice ERP, the incident estate, the fraud account data), with their demo data."""

from __future__ import annotations

import dataclasses
import functools
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Model
from django.utils.module_loading import import_string

from audit.chain import append_event
from planning.core.catalogue import TOOL_RISKS, AgentSpec, Catalogue, ToolCall, ToolSpec
from planning.core.pack import DomainPack
from planning.models import (
    Agent,
    DecompositionCacheEntry,
    ErpInvoiceDocument,
    ErpPayment,
    ErpPaymentHold,
    ErpPurchaseOrder,
    ErpSupplier,
    EstateDatabase,
    EstateFailover,
    EstateHost,
    EstateIsolation,
    EstateNotice,
    FraudAccount,
    FraudAccountFreeze,
    FraudSanctionedParty,
    FraudTransaction,
)
from planning.models import DomainPack as DomainPackRow
from planning.models import Tool as ToolRow
from planning.packs import PACKS
from planning.packs.fraud import PACK as FRAUD_PACK
from planning.packs.fraud.data import DEMO_FRAUD_DATA
from planning.packs.incident import PACK as INCIDENT_PACK
from planning.packs.incident.infrastructure import DEFAULT_OWNERS, DEMO_INFRASTRUCTURE
from planning.packs.invoice import PACK as INVOICE_PACK
from planning.packs.invoice.erp import DEMO_ERP


@functools.cache
def _packs(extra: tuple[str, ...]) -> Mapping[str, DomainPack]:
    packs = dict(PACKS)
    for path in extra:
        pack = import_string(path)
        if not isinstance(pack, DomainPack) or pack.slug in packs:
            raise ImproperlyConfigured(f"CASEHUB_EXTRA_PACKS: {path} is not a new DomainPack")
        packs[pack.slug] = pack
    return MappingProxyType(packs)


def registered_packs() -> Mapping[str, DomainPack]:
    """Return the code packs: CaseHub's own and those `CASEHUB_EXTRA_PACKS` names (dotted paths
    to a `DomainPack`), by slug.

    Raises ImproperlyConfigured for a path that is not a DomainPack or repeats a slug.
    """
    return _packs(tuple(getattr(settings, "CASEHUB_EXTRA_PACKS", ())))


def enabled_pack(slug: str) -> DomainPack | None:
    """Return the code pack for an enabled pack row, or None when unknown or disabled."""
    packs = registered_packs()
    if slug not in packs:
        return None
    if not DomainPackRow.objects.filter(slug=slug, enabled=True).exists():
        return None
    return packs[slug]


@transaction.atomic
def sync_packs() -> list[str]:
    """Register the code packs, their tools and agents as rows; keep admins' edits.

    New rows are created (and audited); existing rows keep what admins changed.
    Returns the names of what was created.
    """
    created: list[str] = []
    for pack in registered_packs().values():
        row, is_new = DomainPackRow.objects.get_or_create(
            slug=pack.slug, defaults={"name": pack.name, "description": pack.description}
        )
        if is_new:
            created.append(f"pack {pack.slug}")
            append_event("config.pack.registered", data={"pack": pack.slug, "name": pack.name})
        for tool in pack.tools:
            _, is_new = ToolRow.objects.get_or_create(
                name=tool.name,
                defaults={"description": tool.description, "pack": row, "risk": tool.risk},
            )
            if is_new:
                created.append(f"tool {tool.name}")
                append_event(
                    "config.tool.registered",
                    data={"tool": tool.name, "pack": pack.slug, "risk": tool.risk},
                )
        for agent in pack.agents:
            _, is_new = Agent.objects.get_or_create(
                slug=agent.slug,
                defaults={
                    "name": agent.name,
                    "description": agent.description,
                    "kind": agent.kind,
                    "capabilities": list(agent.capabilities),
                    "tools": list(agent.tools),
                    "trust": agent.trust,
                    "enabled": agent.enabled,
                    "pack": row,
                },
            )
            if is_new:
                created.append(f"agent {agent.slug}")
                append_event(
                    "config.agent.created",
                    data={"agent": agent.slug, "kind": agent.kind, "pack": pack.slug},
                )
    return created


def agent_spec(agent: Agent) -> AgentSpec:
    """Return the planning core's view of an agent row."""
    return AgentSpec(
        slug=agent.slug,
        name=agent.name,
        description=agent.description,
        kind=agent.kind,  # type: ignore[arg-type]
        capabilities=tuple(agent.capabilities),
        tools=tuple(agent.tools),
        trust=agent.trust,
        enabled=agent.enabled,
    )


def all_tool_specs() -> dict[str, ToolSpec]:
    """Return every code tool with the risk class admins set on its row."""
    risks = dict(ToolRow.objects.values_list("name", "risk"))
    specs: dict[str, ToolSpec] = {}
    for pack in registered_packs().values():
        for tool in pack.tools:
            stored = risks.get(tool.name, tool.risk)
            risk = next((r for r in TOOL_RISKS if r == stored), tool.risk)
            specs[tool.name] = dataclasses.replace(tool, risk=risk) if risk != tool.risk else tool
    return specs


def current_catalogue() -> Catalogue:
    """Return the agents (enabled or not, as configured) and tools plans are validated against."""
    return Catalogue.from_specs(
        [agent_spec(a) for a in Agent.objects.all()], all_tool_specs().values()
    )


def planning_agents(pack: DomainPack | None) -> list[AgentSpec]:
    """Return the enabled agents an LLM may assign: the pack's own, or all without a pack."""
    agents = Agent.objects.filter(enabled=True)
    if pack is not None:
        agents = agents.filter(pack__slug=pack.slug)
    return [agent_spec(a) for a in agents]


class DatabaseDecompositionCache:
    """The decomposition cache of the planning core, stored in the database.

    The LLM planner calls it from its thread pool while planning runs outside any transaction.
    Reads go to the database (and close the helper thread's connection); writes wait in memory
    until `flush` stores them in the transaction that stores the plan, on the caller's thread.
    """

    def __init__(self) -> None:
        self._pending: dict[str, str] = {}
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key in self._pending:
                return self._pending[key]
        try:
            response = (
                DecompositionCacheEntry.objects.filter(key=key)
                .values_list("response", flat=True)
                .first()
            )
        finally:
            _close_if_helper_thread()
        if response is not None:
            with self._lock:
                self._hits[key] = self._hits.get(key, 0) + 1
        return response

    def put(self, key: str, response_text: str) -> None:
        with self._lock:
            self._pending[key] = response_text

    def flush(self) -> None:
        """Store the new entries and count the hits (call inside the storing transaction)."""
        with self._lock:
            pending, hits = dict(self._pending), dict(self._hits)
            self._pending.clear()
            self._hits.clear()
        DecompositionCacheEntry.objects.bulk_create(
            [DecompositionCacheEntry(key=k, response=v) for k, v in pending.items()],
            ignore_conflicts=True,
        )
        for key, count in hits.items():
            DecompositionCacheEntry.objects.filter(key=key).update(hits=F("hits") + count)


def _close_if_helper_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        connection.close()


# The invoice pack's demo ERP ------------------------------------------------------------------


@transaction.atomic
def load_demo_erp() -> int:
    """Load the invoice pack's demo ERP rows (idempotent); return how many rows were created."""
    data: Mapping[str, Any] = DEMO_ERP
    created = 0
    for s in data["suppliers"]:
        created += ErpSupplier.objects.get_or_create(supplier_id=s["supplier_id"], defaults=s)[1]
    for po in data["purchase_orders"]:
        created += ErpPurchaseOrder.objects.get_or_create(po_number=po["po_number"], defaults=po)[1]
    for invoice_id, text in data["documents"].items():
        created += ErpInvoiceDocument.objects.get_or_create(
            invoice_id=invoice_id, defaults={"text": text}
        )[1]
    for p in data["payments"]:
        created += ErpPayment.objects.get_or_create(payment_id=p["payment_id"], defaults=p)[1]
    if created:
        append_event("planning.demo_erp.loaded", data={"rows": created})
    return created


def _money(value: Decimal) -> str:
    return f"{value:.2f}"


def _once[M: Model](model: type[M], call: ToolCall | None, act: Callable[[], M]) -> M:
    """Run `act` (which creates a `model` row under the call's key) once per key; return the row.

    An effect already recorded under the leaf's idempotency key is returned as it is; otherwise
    the leaf's safe point comes first. Two attempts racing: the loser's row fails the key's unique
    constraint and the winner's is the one effect. Without a call (no leaf) every call acts.
    """
    if call is not None:
        done = model._default_manager.filter(idempotency_key=call.idempotency_key).first()
        if done is not None:
            return done
        call.checkpoint()
    try:
        with transaction.atomic():
            return act()
    except IntegrityError:
        if call is None:
            raise
        return model._default_manager.get(idempotency_key=call.idempotency_key)


class DatabaseErp:
    """The invoice pack's `ErpData` port over the ERP tables.

    Bound to a leaf (`with_call`), its one effect — a payment hold — happens once per the
    leaf's idempotency key, after the leaf's safe point.
    """

    def __init__(self, call: ToolCall | None = None) -> None:
        self.call = call

    def with_call(self, call: ToolCall) -> DatabaseErp:
        """Return the port acting for one leaf."""
        return DatabaseErp(call)

    def has_invoice(self, invoice_id: str) -> bool:
        return ErpInvoiceDocument.objects.filter(invoice_id=invoice_id).exists()

    def invoices(self) -> Sequence[str]:
        return list(
            ErpInvoiceDocument.objects.order_by("invoice_id").values_list("invoice_id", flat=True)
        )

    def invoice_document(self, invoice_id: str) -> str:
        document = ErpInvoiceDocument.objects.filter(invoice_id=invoice_id).first()
        if document is None:
            raise LookupError(f"no invoice document {invoice_id!r}")
        return document.text

    def supplier(self, supplier_id: str) -> Mapping[str, Any] | None:
        return (
            ErpSupplier.objects.filter(supplier_id=supplier_id)
            .values("supplier_id", "name", "status", "bank_account")
            .first()
        )

    def purchase_order(self, po_number: str) -> Mapping[str, Any] | None:
        po = ErpPurchaseOrder.objects.filter(po_number=po_number).first()
        if po is None:
            return None
        return {
            "po_number": po.po_number,
            "supplier_id": po.supplier_id,
            "amount": _money(po.amount),
            "invoiced": _money(po.invoiced),
        }

    def payments(self, supplier_id: str) -> Sequence[Mapping[str, Any]]:
        return [
            {
                "payment_id": p.payment_id,
                "invoice_id": p.invoice_id,
                "supplier_id": p.supplier_id,
                "amount": _money(p.amount),
                "paid_on": p.paid_on.isoformat(),
            }
            for p in ErpPayment.objects.filter(supplier_id=supplier_id).order_by("paid_on")
        ]

    def place_hold(self, invoice_id: str, reason: str) -> str:
        key = self.call.idempotency_key if self.call is not None else None

        def act() -> ErpPaymentHold:
            return ErpPaymentHold.objects.create(
                hold_id=f"HOLD-{uuid.uuid4().hex[:10].upper()}",
                invoice_id=invoice_id,
                reason=reason,
                idempotency_key=key,
            )

        return _once(ErpPaymentHold, self.call, act).hold_id


# The incident pack's demo estate --------------------------------------------------------------


@transaction.atomic
def load_demo_estate() -> int:
    """Load the incident pack's demo estate (idempotent); return how many rows were created."""
    data: Mapping[str, Any] = DEMO_INFRASTRUCTURE
    created = 0
    for name, description in data["hosts"].items():
        created += EstateHost.objects.get_or_create(
            name=name,
            defaults={
                "description": description,
                "is_down": name in data["down_hosts"],
                "logs": list(data["logs"].get(name, ())),
            },
        )[1]
    for service, db in data["databases"].items():
        created += EstateDatabase.objects.get_or_create(
            service=service,
            defaults={
                "description": db.get("description", ""),
                "primary_host": db["primary"],
                "replica_host": db["replica"],
                "current_primary": db["primary"],
                "owners": list(data["owners"].get(service, ())),
            },
        )[1]
    if created:
        append_event("planning.demo_estate.loaded", data={"rows": created})
    return created


class DatabaseInfrastructure:
    """The incident pack's `Infrastructure` port over the estate tables.

    Bound to a leaf (`with_call`), its effects — a fail-over, an isolation, a notice — happen
    once per the leaf's idempotency key, after the leaf's safe point, and the next step sees them.
    """

    def __init__(self, call: ToolCall | None = None) -> None:
        self.call = call

    def with_call(self, call: ToolCall) -> DatabaseInfrastructure:
        """Return the port acting for one leaf."""
        return DatabaseInfrastructure(call)

    @property
    def _key(self) -> str | None:
        return self.call.idempotency_key if self.call is not None else None

    def has_host(self, host: str) -> bool:
        return EstateHost.objects.filter(name=host).exists()

    def has_database(self, service: str) -> bool:
        return EstateDatabase.objects.filter(service=service).exists()

    def hosts(self) -> Mapping[str, str]:
        return dict(EstateHost.objects.order_by("name").values_list("name", "description"))

    def databases(self) -> Mapping[str, str]:
        return dict(
            EstateDatabase.objects.order_by("service").values_list("service", "description")
        )

    def primary(self, service: str) -> str:
        primary = (
            EstateDatabase.objects.filter(service=service)
            .values_list("current_primary", flat=True)
            .first()
        )
        if primary is None:
            raise LookupError(f"unknown database service {service!r}")
        return primary

    def fail_over(self, service: str) -> tuple[str, str]:
        def act() -> EstateFailover:
            db = EstateDatabase.objects.select_for_update().filter(service=service).first()
            if db is None:
                raise LookupError(f"unknown database service {service!r}")
            old = db.current_primary
            new = db.replica_host if old == db.primary_host else db.primary_host
            up = set(
                EstateHost.objects.filter(
                    name__in=(old, new), is_down=False, is_isolated=False
                ).values_list("name", flat=True)
            )
            state = {host: "up" if host in up else "down" for host in (old, new)}
            EstateDatabase.objects.filter(pk=db.pk).update(
                current_primary=new,
                # The seeded description told what a fail-over would do; now it says what is.
                description=f"failed over: primary {new} {state[new]}, replica {old} {state[old]}",
            )
            return EstateFailover.objects.create(
                service=service, old_primary=old, new_primary=new, idempotency_key=self._key
            )

        done = _once(EstateFailover, self.call, act)
        return done.old_primary, done.new_primary

    def is_reachable(self, host: str) -> bool:
        return EstateHost.objects.filter(name=host, is_down=False, is_isolated=False).exists()

    def isolate(self, hosts: Sequence[str]) -> Sequence[str]:
        def act() -> EstateIsolation:
            known = set(EstateHost.objects.filter(name__in=hosts).values_list("name", flat=True))
            isolated = [h for h in dict.fromkeys(hosts) if h in known]
            EstateHost.objects.filter(name__in=isolated).update(is_isolated=True)
            return EstateIsolation.objects.create(hosts=isolated, idempotency_key=self._key)

        return tuple(_once(EstateIsolation, self.call, act).hosts)

    def logs(self, host: str) -> Sequence[str]:
        logs = EstateHost.objects.filter(name=host).values_list("logs", flat=True).first()
        return tuple(logs or ())

    def owners(self, service: str) -> Sequence[str]:
        owners = (
            EstateDatabase.objects.filter(service=service).values_list("owners", flat=True).first()
        )
        return tuple(owners or DEFAULT_OWNERS)

    def send(self, recipients: Sequence[str], message: str) -> None:
        def act() -> EstateNotice:
            return EstateNotice.objects.create(
                recipients=list(recipients), message=message, idempotency_key=self._key
            )

        _once(EstateNotice, self.call, act)


# The fraud pack's demo account data -----------------------------------------------------------


@transaction.atomic
def load_demo_accounts() -> int:
    """Load the fraud pack's demo account data (idempotent); return how many rows were created."""
    data: Mapping[str, Any] = DEMO_FRAUD_DATA
    created = 0
    for account_id, description in data["accounts"].items():
        created += FraudAccount.objects.get_or_create(
            account_id=account_id, defaults={"description": description}
        )[1]
    for tx in data["transactions"]:
        created += FraudTransaction.objects.get_or_create(tx_id=tx["tx_id"], defaults=tx)[1]
    for name in data["sanctioned"]:
        created += FraudSanctionedParty.objects.get_or_create(name=name)[1]
    if created:
        append_event("planning.demo_accounts.loaded", data={"rows": created})
    return created


class DatabaseFraudData:
    """The fraud pack's `FraudData` port over the account tables.

    Bound to a leaf (`with_call`), its one effect — a freeze — happens once per the leaf's
    idempotency key, after the leaf's safe point.
    """

    def __init__(self, call: ToolCall | None = None) -> None:
        self.call = call

    def with_call(self, call: ToolCall) -> DatabaseFraudData:
        """Return the port acting for one leaf."""
        return DatabaseFraudData(call)

    def has_account(self, account_id: str) -> bool:
        return FraudAccount.objects.filter(account_id=account_id).exists()

    def accounts(self) -> Mapping[str, str]:
        return dict(
            FraudAccount.objects.order_by("account_id").values_list("account_id", "description")
        )

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]:
        return [
            {
                "tx_id": t.tx_id,
                "account_id": t.account_id,
                "amount": _money(t.amount),
                "counterparty": t.counterparty,
            }
            for t in FraudTransaction.objects.filter(account_id=account_id).order_by("pk")
        ]

    def sanctioned(self) -> Sequence[str]:
        return tuple(FraudSanctionedParty.objects.order_by("name").values_list("name", flat=True))

    def freeze(self, account_id: str, reason: str) -> str:
        key = self.call.idempotency_key if self.call is not None else None

        def act() -> FraudAccountFreeze:
            return FraudAccountFreeze.objects.create(
                freeze_id=f"FRZ-{uuid.uuid4().hex[:10].upper()}",
                account_id=account_id,
                reason=reason,
                idempotency_key=key,
            )

        return _once(FraudAccountFreeze, self.call, act).freeze_id

    def freezes(self, account_id: str) -> Sequence[str]:
        return tuple(
            FraudAccountFreeze.objects.filter(account_id=account_id)
            .order_by("created_at", "pk")
            .values_list("freeze_id", flat=True)
        )


def load_demo_systems() -> dict[str, int]:
    """Load every pack's demo systems (idempotent): the rows created, by pack."""
    return {
        INVOICE_PACK.slug: load_demo_erp(),
        INCIDENT_PACK.slug: load_demo_estate(),
        FRAUD_PACK.slug: load_demo_accounts(),
    }


# Every CaseHub pack's systems live in the database; an extra pack reads its own demo port.
_DATABASE_PORTS: Mapping[str, Callable[[], Any]] = MappingProxyType(
    {
        INVOICE_PACK.slug: DatabaseErp,
        INCIDENT_PACK.slug: DatabaseInfrastructure,
        FRAUD_PACK.slug: DatabaseFraudData,
    }
)


def data_port(pack: DomainPack, *, call: ToolCall | None = None) -> Any | None:
    """Return the port a pack's tools and input checks read: the database's, else its demo's.

    With `call`, a port that has effects (`with_call`) acts for that leaf: once per its
    idempotency key. None when the pack has neither.
    """
    factory = _DATABASE_PORTS.get(pack.slug, pack.demo_port)
    if factory is None:
        return None
    port = factory()
    if call is not None and hasattr(port, "with_call"):
        port = port.with_call(call)
    return port
