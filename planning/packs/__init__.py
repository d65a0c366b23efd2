"""Domain method packs: invoice verification, fraud investigation, incident response.

Each pack is a package: its data port (`erp`, `data`, `infrastructure`), its tools, its case
inputs and their check against its data, its leaves (each written once), the static methods
and the goal-oriented capabilities built from them, and `PACK`, which puts them together.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from planning.core.pack import DomainPack
from planning.packs import fraud, incident, invoice

PACKS: Mapping[str, DomainPack] = MappingProxyType(
    {pack.slug: pack for pack in (invoice.PACK, fraud.PACK, incident.PACK)}
)
