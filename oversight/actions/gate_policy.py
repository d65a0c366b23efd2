"""What the gating policy reads of the rows: the active policy version, the facts of each leaf it
classifies, and the role groups that approve and take escalations."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth.models import Group

from oversight.models import (
    Gate,
    PolicyVersion,
)
from oversight.policy import LeafFacts, PolicySettings
from planning.models import (
    Agent,
    PlanNode,
    Tool,
)

logger = logging.getLogger(__name__)


def active_policy() -> tuple[PolicyVersion, PolicySettings]:
    """Return the active policy version and its settings.

    Falls back to the safe defaults (unsaved version 0) when the table has no active row, which
    only a broken installation has; the gates then record no policy version.
    """
    version = PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE).first()
    if version is None:
        return PolicyVersion(number=0, values={}), policy_settings(None, None)
    return version, policy_settings(version.number, version.values)


# The settings last built, by policy version number: its stored values and the settings. Every
# claim of a leaf reads the active version's values (a claim checks its leaf against them) and
# would otherwise build the same settings again at each leaf.
_built: dict[int, tuple[Any, PolicySettings]] = {}


def policy_settings(number: int | None, values: Any) -> PolicySettings:
    """Return the settings of the active policy version `number` stored as `values` (as
    `active_policy` reads them), or the safe defaults when there is none or it is unreadable."""
    if number is None:
        logger.error("no active gating policy version: the defaults apply")
        return PolicySettings()
    built = _built.get(number)
    if built is not None and built[0] == values:
        return built[1]
    try:
        settings = PolicySettings.from_data(values)
    except ValueError:
        logger.exception("policy version %s is unreadable: the defaults apply", number)
        return PolicySettings()
    _built.clear()  # one version is active at a time: keep only the last
    _built[number] = (copy.deepcopy(values), settings)
    return settings


def gate_settings(gate: Gate) -> PolicySettings:
    """Return the settings of the policy version the gate was opened under (else the active)."""
    if gate.policy_version is not None:
        try:
            return PolicySettings.from_data(gate.policy_version.values)
        except ValueError:
            logger.exception("policy version %s is unreadable", gate.policy_version.number)
    return active_policy()[1]


def leaf_facts(leaves: Sequence[PlanNode]) -> list[LeafFacts]:
    """Gather what the server knows about each leaf: registered risk, agent trust, provenance.

    Two queries whatever the number of leaves.
    """
    tools = dict(
        Tool.objects.filter(name__in={n.tool for n in leaves if n.tool}).values_list("name", "risk")
    )
    trust = dict(
        Agent.objects.filter(slug__in={n.agent for n in leaves}, enabled=True).values_list(
            "slug", "trust"
        )
    )
    return [facts_of(node, tools, trust) for node in leaves]


def registry() -> tuple[dict[str, str], dict[str, float]]:
    """Return every registered tool's risk class and every enabled agent's trust (two queries),
    as `facts_of` reads them: for classifying many plan versions at once."""
    tools = dict(Tool.objects.values_list("name", "risk"))
    trust = dict(Agent.objects.filter(enabled=True).values_list("slug", "trust"))
    return tools, trust


def facts_of(node: PlanNode, tools: Mapping[str, str], trust: Mapping[str, float]) -> LeafFacts:
    """Return the facts of one leaf, given the tools' risk classes and the enabled agents' trust
    (an unregistered tool or an unknown or disabled agent is absent from them)."""
    return LeafFacts(
        key=node.key,
        agent=node.agent,
        tool=node.tool or None,
        tool_risk=tools.get(node.tool) if node.tool else None,
        declared_risk=node.risk or None,
        # Inputs that are not an object are still read for amounts (fail closed).
        inputs=node.inputs if isinstance(node.inputs, dict) else {"inputs": node.inputs},
        agent_trust=trust.get(node.agent),
        strategy=str(_provenance(node).get("strategy", "")),
        source=str(_provenance(node).get("source", "")),
        depth=_depth(node),
    )


def _provenance(node: PlanNode) -> dict[str, Any]:
    return node.provenance if isinstance(node.provenance, dict) else {}


def _depth(node: PlanNode) -> int:
    # A depth that cannot be read counts as deep: the provenance classifier then gates the step.
    try:
        return max(0, int(_provenance(node).get("depth", 0) or 0))
    except (TypeError, ValueError):
        return 1_000


def role_group(name: str) -> Group:
    group, _ = Group.objects.get_or_create(name=name)
    return group
