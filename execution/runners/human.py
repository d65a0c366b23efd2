"""How a `human` agent runs a leaf: a work item for the agent's group, completed by a person."""

from __future__ import annotations

from accounts.roles import ANALYST
from execution.common import Claim, WaitingForPerson
from execution.work_items import open_work_item
from planning.models import Agent


def run_human(claim: Claim, agent: Agent) -> None:
    """Hand the leaf to the agent's group as a work item; raise WaitingForPerson.

    The leaf ends when a member of the group completes the work item.
    """
    open_work_item(claim, group_name=human_group(agent))
    raise WaitingForPerson(claim.key)


def human_group(agent: Agent) -> str:
    """Return the user group whose members do a human agent's work items.

    A capability `group:<name>` names it; without one, the analysts (the case workers) do it.
    """
    for capability in agent.capabilities:
        if isinstance(capability, str) and capability.startswith("group:"):
            return capability.removeprefix("group:")
    return ANALYST
