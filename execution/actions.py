"""Execution: approved leaves become ready, are claimed by workers, end, and release their
dependents; the reconciler recovers what a lost message or a dead worker left behind.

The database is the truth about what must run (DESIGN §5). A claim is a compare-and-set
`ready → running` that bumps the leaf's attempt number: the number is the worker's fencing
token, and a result sent with an older number is refused. Every claim re-checks, in its own
transaction, that the case still runs, the global stop switch is off, and the approvals the leaf
needs still hold for exactly this version and content hash (R3, R4, O4, O5). Side effects carry an
idempotency key that does not depend on the attempt, so a leaf run twice acts once.

The parts: `common` (settings, errors, results, the stop switch), `claiming` (start, release,
claim), `ending` (completion with the worker's next claim, failure policies, stops), `work_items`
(human leaves), `cases` (a case's end and its cancellation), `reconcile` (beat) and `worker` (the
loop a Celery task runs). Trust learned from outcomes is `execution.trust_actions`.
"""

from execution.cases import cancel_case, cancel_open_leaves, finish_if_done
from execution.claiming import (
    check_safe_point,
    claim_leaf,
    lease_holds,
    release_ready,
    renew_lease,
    start_execution,
)
from execution.common import (
    ENDED_LEAF_STATUSES,
    OPEN_LEAF_STATUSES,
    RUNNING_CASE_STATUSES,
    CaseNotRunning,
    Claim,
    ClaimRefused,
    Ended,
    ErrorClass,
    LeafStopped,
    StaleResult,
    WorkItemConflict,
    hard_limit_s,
    idempotency_key,
    is_stopped,
    lease_s,
    max_attempts,
    max_deliveries,
    redispatch_after_s,
    retry_delay_s,
    set_stopped,
    soft_limit_s,
)
from execution.ending import (
    complete_leaf,
    fail_and_block,
    fail_leaf,
    on_escalation_rejected,
    on_step_approved,
    record_stale,
    stop_at_safe_point,
)
from execution.reconcile import Reconciled, reconcile_execution
from execution.trust_actions import effective_trust, record_outcome
from execution.work_items import (
    complete_work_item,
    open_work_item,
    sweep_work_items,
)
from execution.worker import execute_leaf, inline_s

__all__ = [
    "ENDED_LEAF_STATUSES",
    "OPEN_LEAF_STATUSES",
    "RUNNING_CASE_STATUSES",
    "CaseNotRunning",
    "Claim",
    "ClaimRefused",
    "Ended",
    "ErrorClass",
    "LeafStopped",
    "Reconciled",
    "StaleResult",
    "WorkItemConflict",
    "cancel_case",
    "cancel_open_leaves",
    "check_safe_point",
    "claim_leaf",
    "complete_leaf",
    "complete_work_item",
    "effective_trust",
    "execute_leaf",
    "fail_and_block",
    "fail_leaf",
    "finish_if_done",
    "hard_limit_s",
    "idempotency_key",
    "inline_s",
    "is_stopped",
    "lease_holds",
    "lease_s",
    "max_attempts",
    "max_deliveries",
    "on_escalation_rejected",
    "on_step_approved",
    "open_work_item",
    "reconcile_execution",
    "record_outcome",
    "record_stale",
    "redispatch_after_s",
    "release_ready",
    "renew_lease",
    "retry_delay_s",
    "set_stopped",
    "soft_limit_s",
    "start_execution",
    "stop_at_safe_point",
    "sweep_work_items",
]
