"""Every audit event code CaseHub writes: the title an auditor reads and the app that writes it.

Pure Python that imports neither Django nor the project, so every app can read it. Each code an
`append_event` names is registered here and each code here is written somewhere:
tests/audit/test_codes.py reads the source for both. An event whose code is not here (one the
CI writes, `ci.audit.checked`, or one an older version wrote) is shown by its code: `title`
never fails on what a database holds.

The app is the concern that writes the event, which is not always its code's prefix: the gates
write `planning.case.approved`, execution writes `planning.case.completed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

__all__ = ["CODES", "EVENT_CODES", "App", "EventCode", "title"]


class App(StrEnum):
    """The concern that writes an event (the apps of STYLE.md's layout)."""

    AUDIT = "audit"
    ACCOUNTS = "accounts"
    PLANNING = "planning"
    OVERSIGHT = "oversight"
    EXECUTION = "execution"


@dataclass(frozen=True, slots=True, kw_only=True)
class EventCode:
    """One event code: the code stored on its events, its title, and the app that writes it."""

    code: str
    title: str
    app: App


def _codes(app: App, titles: Mapping[str, str]) -> tuple[EventCode, ...]:
    return tuple(EventCode(code=code, title=title, app=app) for code, title in titles.items())


EVENT_CODES: tuple[EventCode, ...] = (
    *_codes(
        App.AUDIT,
        {
            "oversight.audit.exported": "Audit trail exported",
            "oversight.audit.broken": "Audit chain found broken",
            "oversight.signing_key.created": "Signing key created",
            "oversight.signing_key.rotated": "Signing key rotated",
        },
    ),
    *_codes(
        App.ACCOUNTS,
        {
            "auth.login.succeeded": "Signed in",
            "auth.login.failed": "Sign-in failed",
            "auth.logout": "Signed out",
            "security.login.throttled": "Sign-in refused after repeated failures",
            "security.login.unlocked": "Sign-in lockout lifted by an admin",
            "security.sessions.ended": "Sessions ended",
            "auth.user.created": "User created",
            "auth.user.changed": "User changed",
            "auth.user.deactivated": "User deactivated",
            "auth.user.deleted": "User deleted",
            "auth.user.flags_changed": "User's active, staff or superuser flag changed",
            "auth.user.groups_changed": "User's groups changed",
            "auth.user.roles_changed": "User's roles changed",
            "auth.user.change_refused": "User change refused",
            "auth.user.password_changed": "Own password changed",
            "auth.user.password_reset": "Password reset by an admin",
            "auth.password_reset.requested": "Password reset requested (needs a second admin)",
            "auth.password_reset.approved": "Password reset approved",
            "auth.password_reset.rejected": "Password reset rejected",
            "auth.password_reset.expired": "Password reset request expired",
            "auth.role_grant.requested": "Role grant requested (needs a second admin)",
            "auth.role_grant.approved": "Role grant approved",
            "auth.role_grant.rejected": "Role grant rejected",
            "auth.role_grant.expired": "Role grant request expired",
            "auth.token.issued": "API token issued",
            "auth.token.revoked": "API tokens revoked",
            "auth.token.expired": "Expired API tokens removed",
            "security.access.denied": "Access denied",
            "security.access.denied.summary": "Access denied again (summary of a minute)",
            "security.signing.locked": "E-signing locked after wrong passwords",
            "security.signing.unlocked": "E-signing unlocked",
            "auth.user.password_sign_in_changed": "Password sign-in turned off or on",
            "auth.oidc.signed_in": "Signed in through the identity provider",
            "auth.oidc.refused": "Sign-in through the identity provider refused",
            "auth.oidc.role_granted": "Role given by the identity provider's group claim",
            "auth.oidc.role_removed": "Role taken away: the group claim no longer maps to it",
            "auth.oidc.mapping.added": "Group mapped to a role",
            "auth.oidc.mapping.requested": "Group mapping proposed (needs a second admin)",
            "auth.oidc.mapping.approved": "Group mapping approved",
            "auth.oidc.mapping.rejected": "Group mapping rejected",
            "auth.oidc.mapping.expired": "Group mapping proposal expired",
            "auth.oidc.mapping.removed": "Group mapping removed",
        },
    ),
    *_codes(
        App.PLANNING,
        {
            "planning.case.submitted": "Case submitted",
            "planning.case.rate_limited": "Case submission refused: too many at once",
            "planning.plan.started": "Planning started",
            "planning.plan.requeued": "Planning sent again",
            "planning.plan.interrupted": "Planning run stopped by an error (to be retried)",
            "planning.plan.failed": "Planning failed",
            "planning.plan.materialised": "Plan drawn up",
            "planning.llm.called": "LLM called",
            "oversight.llm_budget.refused": "LLM call refused: budget spent",
            "planning.method.proposed": "Method proposed for promotion",
            "planning.method.approved": "Promoted method approved",
            "planning.method.rejected": "Method proposal rejected",
            "planning.method.retired": "Promoted method retired",
            "planning.node.blocked": "Step blocked: a step it needs did not succeed",
            "config.pack.registered": "Domain pack registered",
            "config.pack.changed": "Domain pack enabled or disabled",
            "config.tool.registered": "Tool registered",
            "config.tool.risk_changed": "Tool risk changed",
            "config.agent.created": "Agent created",
            "config.agent.changed": "Agent changed",
            "planning.demo_erp.loaded": "Demo ERP data loaded",
            "planning.demo_estate.loaded": "Demo estate loaded (incident response)",
            "planning.demo_accounts.loaded": "Demo account data loaded (fraud investigation)",
        },
    ),
    *_codes(
        App.OVERSIGHT,
        {
            "oversight.gate.opened": "Gate opened",
            "oversight.gate.carried": "Gate carried over to a new plan version",
            "oversight.gate.decided": "Gate decided",
            "oversight.gate.decision_denied": "Gate decision denied",
            "oversight.gate.reminded": "Gate reminder sent",
            "oversight.gate.escalated": "Gate escalated",
            "oversight.gate.held": "Gate past its deadline: case held",
            "oversight.gate.expired": "Gate approval no longer holds",
            "oversight.gate.voided": "Gate voided",
            "oversight.signature.failed": "E-signature failed: wrong password",
            "oversight.signature.refused": "E-signature refused: signing locked",
            "planning.case.approved": "Case approved",
            "planning.case.rejected": "Case rejected",
            "planning.node.skipped": "Step skipped after a rejection",
            "planning.node.failed": "Step failed after a rejection",
            "planning.plan.edited": "Plan edited",
            "oversight.plan.edit_denied": "Plan edit denied",
            "oversight.policy.proposed": "Policy proposed",
            "oversight.policy.approved": "Policy approved",
            "oversight.policy.rejected": "Policy rejected",
            "oversight.policy.activated": "Policy activated",
            "oversight.policy.denied": "Policy change denied",
            "oversight.policy.whatif_requested": "Policy what-if requested",
            "oversight.reason_code.added": "Reason code added",
            "oversight.reason_code.changed": "Reason code changed",
            "oversight.reason_code.denied": "Reason code change denied",
        },
    ),
    *_codes(
        App.EXECUTION,
        {
            "planning.case.executing": "Case execution started",
            "planning.case.verifying": "Case waiting for the goal judge",
            "planning.case.completed": "Case completed",
            "planning.case.failed": "Case failed",
            "planning.case.cancelled": "Case cancelled",
            "planning.case.awaiting_approval": "Case awaiting approval of a new plan",
            "planning.plan.replanned": "Plan revised after a failed step",
            "planning.plan.results_carried": "Step results carried over to a new plan version",
            "execution.leaves.ready": "Steps ready to run",
            "execution.case.stuck": "Case found with no way forward: repaired or escalated",
            "execution.leaf.claimed": "Step started by a worker",
            "execution.leaf.claim_refused": "Step held back: its approval no longer holds",
            "execution.leaf.routing_escalated": "Step routing escalated",
            "execution.leaf.succeeded": "Step succeeded",
            "execution.leaf.attempt_failed": "Step attempt failed",
            "execution.leaf.retrying": "Step to be retried",
            "execution.leaf.retry_ready": "Step ready again after its retry wait",
            "execution.leaf.failed": "Step failed",
            "execution.leaf.escalated": "Step waits for an escalation after its failure",
            "execution.leaf.approved": "Step approved: runs once the steps it needs succeed",
            "execution.leaf.cancelled": "Step cancelled",
            "execution.leaf.stopped": "Step stopped by the stop switch",
            "execution.leaf.recovered": "Step recovered from a lost worker",
            "execution.leaf.dead_lettered": "Step dead-lettered",
            "execution.leaf.result_refused": "Late step result refused",
            "execution.llm.round": "Agent's LLM round",
            "execution.llm.tool_called": "Agent called a tool",
            "execution.llm.tool_refused": "Agent's tool call refused",
            "execution.work_item.opened": "Work item opened",
            "execution.work_item.completed": "Work item completed",
            "execution.work_item.refused": "Work item result refused",
            "execution.work_item.cancelled": "Work item cancelled: its step ended without it",
            "execution.work_item.reminded": "Work item reminder sent",
            "execution.work_item.escalated": "Work item escalated",
            "execution.control.stopped": "Execution stopped (global switch)",
            "execution.control.resumed": "Execution resumed (global switch)",
            "execution.replan.refused": "Replanning refused",
            "execution.goal.judge_started": "Goal judge started",
            "execution.goal.judge_resent": "Goal judge sent again",
            "execution.goal.judged": "Goal judged",
            "execution.goal.verdict_dropped": "Goal verdict dropped: the case had moved on",
        },
    ),
)

CODES: Mapping[str, EventCode] = MappingProxyType({entry.code: entry for entry in EVENT_CODES})


def title(code: str) -> str:
    """Return what an auditor reads for an event code; an unregistered code is its own title."""
    entry = CODES.get(code)
    return entry.title if entry is not None else code
