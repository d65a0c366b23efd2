"""Steps that ended in an earlier plan version, kept in a new one (a re-plan's, or an edit's).

A step the new version holds unchanged (same key, same content hash) that ended already keeps its
status and output there: nothing that succeeded runs again (RELIABILITY S1). Its gate is void (it
needs no approval any more) and the open steps downstream of a kept step that failed or was
skipped are blocked. `planning.versions.kept_steps` finds them; the caller's event names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from audit.chain import NewEvent, case_chain
from audit.transitions import Audit, audited
from oversight.actions.notifications import read_gate_notices
from oversight.models import Gate, GateKind, GateStatus
from oversight.transitions import move_gate
from planning.models import NodeStatus, PlanNode, PlanVersion
from planning.transitions import block_nodes, move_node
from planning.versions import CARRIED_FIELDS

LEAF = PlanNode.Kind.LEAF


def carry_results(version: PlanVersion, kept: Mapping[str, PlanNode], *, audit: Audit) -> None:
    """Give the new version's unchanged ended steps their old status and output.

    `kept` maps keys to the earlier version's rows. `audit` is the block of the caller's event,
    which names the kept steps: it covers their moves. Call after the version's gates are open,
    in the transaction that stored it.
    """
    rows = {
        row.key: row
        for row in PlanNode.objects.filter(version=version, kind=LEAF, key__in=list(kept))
    }
    for key, old in kept.items():
        carried = {name: getattr(old, name) for name in CARRIED_FIELDS if name != "status"}
        move_node(rows[key], to=old.status, audit=audit, **carried)
    # A step that ended needs no gate any more (a policy change may have gated it meanwhile).
    gates = Gate.objects.filter(
        version=version, kind=GateKind.STEP, status=GateStatus.PENDING, node__key__in=list(kept)
    )
    with audited(chain=case_chain(version.case_id)) as audit:
        for gate in gates:
            before = move_gate(gate, to=GateStatus.VOID, audit=audit)
            audit.add(
                NewEvent(
                    "oversight.gate.voided",
                    None,
                    {
                        "gate": gate.pk,
                        "why": "the step ended in an earlier version",
                        "before": {"status": before},
                        "after": {"status": GateStatus.VOID},
                    },
                )
            )
    if gates:
        read_gate_notices(case_id=version.case_id)
    _block_after(version, [k for k, row in kept.items() if row.status != NodeStatus.SUCCEEDED])


def _block_after(version: PlanVersion, ended: Iterable[str]) -> None:
    """Block the open steps downstream of steps that failed or were skipped."""
    depends = dict(
        PlanNode.objects.filter(version=version, kind=LEAF).values_list("key", "depends_on")
    )
    blocked: set[str] = set()
    frontier = set(ended)
    while frontier:
        frontier = {k for k, deps in depends.items() if set(deps) & frontier} - blocked
        blocked |= frontier
    if blocked:
        with audited(chain=case_chain(version.case_id)) as audit:
            block_nodes(
                PlanNode.objects.filter(version=version, key__in=blocked),
                from_=(NodeStatus.PENDING,),
                audit=audit,
                why="a step it needs ended without success in an earlier version",
            )


__all__ = ["carry_results"]
