"""How an `llm` agent runs a leaf (being built: until then such leaves fail as policy denials)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oversight.actions.execution import Claim, ErrorClass
from planning.models import Agent, PlanNode


def run_llm_leaf(
    claim: Claim, node: PlanNode, agent: Agent, outputs: Mapping[str, Any]
) -> dict[str, Any]:
    """Run a leaf with the agent's model; raise LeafError (not available in this build)."""
    from oversight.runners import LeafError

    raise LeafError(ErrorClass.POLICY_DENIAL, f"llm agent {agent.slug} cannot run leaves yet")
