"""Read-side queries of oversight with separation of duties built in: whose gates wait for whom."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, Group, User
from django.db.models import Q, QuerySet
from django.http import Http404

from oversight.models import (
    OPEN_GATE_STATUSES,
    Gate,
    GateDecision,
    Notification,
    PolicyVersion,
    PolicyWhatIf,
)
from planning.models import Case, NodeStatus, PlanNode, PlanVersion
from planning.queries import visible_cases

DECIDE_GATE = "oversight.decide_gate"
CONFIGURE = "oversight.configure"


def inbox_for(user: User | AnonymousUser) -> QuerySet[Gate]:
    """Return the open gates that wait for this user's decision.

    Separation of duties is part of the query (R1): never a gate of a case the user submitted or
    of a case with a version the user edited (an edit stays in every later version), never one
    the user already decided; only gates of the user's groups (the escalation group too, once
    the gate escalated). None for admins and for users who do not decide gates.

    Every exclusion is an uncorrelated subquery over the user's own few rows, so the query reads
    the gate table alone, in deadline order from its index: 10,000 open gates cost what 100 do.
    Only gates of current plan versions (an edit also voids the replaced version's gates in its
    transaction, and `decide_gate` checks again).
    """
    if not user.is_authenticated or not user.is_active:
        return Gate.objects.none()
    if user.has_perm(CONFIGURE) or not user.has_perm(DECIDE_GATE):
        return Gate.objects.none()
    groups = Group.objects.filter(user=user).values("pk")
    own_cases = Case.objects.filter(submitter_id=user.pk).values("pk")
    edited_cases = PlanVersion.objects.filter(edited_by_id=user.pk).values("case_id")
    decided = GateDecision.objects.filter(decider_id=user.pk).values("gate_id")
    current = Case.objects.filter(current_version__isnull=False).values("current_version_id")
    return (
        Gate.objects.filter(status__in=OPEN_GATE_STATUSES, version_id__in=current)
        .filter(
            Q(approver_group__in=groups)
            | Q(escalated_at__isnull=False, escalation_group__in=groups)
        )
        .exclude(case_id__in=own_cases)
        .exclude(case_id__in=edited_cases)
        .exclude(pk__in=decided)
    )


def visible_gate(user: User | AnonymousUser, gate_id: int) -> Gate:
    """Return one gate of a case the user may read, with its case, version and node loaded.

    Raises Http404 when the gate does not exist or its case is not the user's to see.
    """
    try:
        return Gate.objects.select_related(
            "case", "case__submitter", "case__current_version", "version", "node", "node__parent"
        ).get(pk=gate_id, case__in=visible_cases(user))
    except (Gate.DoesNotExist, ValueError, TypeError):
        raise Http404("No such gate") from None


def unread_notifications(user: User | AnonymousUser) -> QuerySet[Notification]:
    """Return the user's notifications not read yet (none for visitors)."""
    if not user.is_authenticated:
        return Notification.objects.none()
    return Notification.objects.filter(user_id=user.pk, read_at__isnull=True)


def upstream_outputs_of(nodes: list[PlanNode]) -> dict[int, dict[str, object]]:
    """Return, by node id, the outputs of every succeeded leaf upstream of each node.

    One query for all the nodes' plan versions, however many nodes (a list of work items).
    """
    versions = {node.version_id for node in nodes}
    rows: dict[int, dict[str, tuple[list[str], str, object]]] = {v: {} for v in versions}
    for version_id, key, deps, status, output in (
        PlanNode.objects.filter(version_id__in=versions, kind=PlanNode.Kind.LEAF)
        .order_by("position")
        .values_list("version_id", "key", "depends_on", "status", "output")
    ):
        rows[version_id][key] = (list(deps or []), status, output)
    found: dict[int, dict[str, object]] = {}
    for node in nodes:
        leaves = rows[node.version_id]
        upstream: set[str] = set()
        frontier = set(node.depends_on)
        while frontier:
            upstream |= frontier
            frontier = {d for k in frontier for d in leaves.get(k, ([], "", None))[0]} - upstream
        found[node.pk] = {
            key: output
            for key, (_, status, output) in leaves.items()
            if key in upstream and status == NodeStatus.SUCCEEDED
        }
    return found


def may_configure(user: User | AnonymousUser) -> bool:
    """Tell whether the user is an active admin (configures agents, tools and the policy)."""
    return bool(user.is_authenticated and user.is_active and user.has_perm(CONFIGURE))


def whatifs_for(user: User | AnonymousUser) -> QuerySet[PolicyWhatIf]:
    """Return the policy what-if reports the user may read: every one for admins, else none."""
    if not may_configure(user):
        return PolicyWhatIf.objects.none()
    return PolicyWhatIf.objects.select_related("policy_version", "base_version", "created_by")


def policy_versions_for(user: User | AnonymousUser) -> QuerySet[PolicyVersion]:
    """Return the policy versions the user may read: every one for admins, else none."""
    if not may_configure(user):
        return PolicyVersion.objects.none()
    return PolicyVersion.objects.all()
