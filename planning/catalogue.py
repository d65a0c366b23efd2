"""The database side of the catalogue: packs, agents and tools from code into rows, rows back
into the planning core's specs, and the database-backed ports the pack tools read."""

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
from django.db.models import F
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
)
from planning.models import DomainPack as DomainPackRow
from planning.models import Tool as ToolRow
from planning.packs import PACKS
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
        if key is not None:
            done = ErpPaymentHold.objects.filter(idempotency_key=key).first()
            if done is not None:
                return done.hold_id
            self.call.checkpoint()  # type: ignore[union-attr]
        try:
            with transaction.atomic():
                hold = ErpPaymentHold.objects.create(
                    hold_id=f"HOLD-{uuid.uuid4().hex[:10].upper()}",
                    invoice_id=invoice_id,
                    reason=reason,
                    idempotency_key=key,
                )
        except IntegrityError:
            # Another attempt of the same leaf placed it a moment ago: that is the one hold.
            hold = ErpPaymentHold.objects.get(idempotency_key=key)
        return hold.hold_id


# Only the invoice pack's data lives in the database; the others read their demo data.
_DATABASE_PORTS: Mapping[str, Callable[[], Any]] = MappingProxyType(
    {INVOICE_PACK.slug: DatabaseErp}
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
