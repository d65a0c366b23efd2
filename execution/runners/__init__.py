"""How a claimed leaf runs, per agent kind.

`tool`: the registered tool with its validated inputs (`runners.tool`). `llm`: the agent's model
in a bounded conversation (`runners.llm`). `human`: a work item for the agent's group; the leaf
waits until a person completes it (`runners.human`). Output is checked against the leaf's
expected-output schema (`execution.outputs`). Errors come back as `LeafError` with their class.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from execution.common import Claim, ErrorClass, LeafError, LeafTimeLimit
from execution.outputs import check_output
from execution.runners.human import run_human
from execution.runners.llm import run_llm_leaf, upstream_outputs
from execution.runners.tool import referenced_outputs, run_tool
from planning.models import Agent, PlanNode


@contextmanager
def soft_time_limit(seconds: float) -> Iterator[None]:
    """Raise LeafTimeLimit in the running leaf after `seconds` (main thread only).

    A prefork or solo worker runs leaves on its main thread, where SIGALRM interrupts them;
    elsewhere the lease does: it is not renewed past the hard limit and the reconciler ends the
    leaf as timed out.
    """
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise LeafTimeLimit(f"soft time limit of {seconds:g} s exceeded")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Running ---------------------------------------------------------------------------------------


def run(claim: Claim) -> dict[str, Any]:
    """Run a claimed leaf and return its checked output.

    Raises LeafError (classified), LeafStopped at a safe point, WaitingForPerson for a human
    leaf handed to its group.
    """
    node = claim.node or PlanNode.objects.select_related("version").get(pk=claim.node_id)
    agent = claim.agent_row or Agent.objects.filter(slug=node.agent).first()
    if agent is None or not agent.enabled:
        raise LeafError(ErrorClass.POLICY_DENIAL, f"agent {node.agent!r} is unknown or disabled")
    if agent.kind == Agent.Kind.HUMAN:
        run_human(claim, agent)
    if agent.kind == Agent.Kind.LLM:
        return check_output(node, run_llm_leaf(claim, node, agent, upstream_outputs(node)))
    if not node.tool:
        raise LeafError(ErrorClass.INVALID_INPUT, f"tool agent {agent.slug} has no tool to call")
    return check_output(node, run_tool(claim, node, agent, referenced_outputs(node)))
