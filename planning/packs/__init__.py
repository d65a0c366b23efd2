"""Domain method packs: invoice verification, fraud investigation, incident response."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from planning.core.catalogue import DomainPack
from planning.packs import fraud, incident, invoice


def all_packs() -> Mapping[str, DomainPack]:
    """Return every built-in pack by slug."""
    return MappingProxyType({p.slug: p for p in (invoice.PACK, fraud.PACK, incident.PACK)})


PACKS: Mapping[str, DomainPack] = all_packs()
