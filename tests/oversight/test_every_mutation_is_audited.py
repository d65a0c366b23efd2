"""Every mutating URL, API endpoint and admin view writes an audit event (RELIABILITY A8).

The URLconf is walked (the HTML views, the admin through `admin.site.urls`, the API through
django-ninja's path views). A route is mutating when it accepts POST, PUT, PATCH or DELETE, or
when its methods cannot be told (the admin's views): the methods come from
`require_http_methods`-style decorators, a class-based view's handlers, or ninja's operations.
Each admin changelist counts once per list action the admin persona is offered.

Every mutating route is a key of AUDITED (the persona and a request that succeeds, and the
action prefix of the event it must write), of NOT_AUDITED (why it writes none), or of the
admin views that the registry itself disables for an admin (no add, change or delete
permission; checked to answer 403). A new mutating route in none of them fails
`test_every_mutating_route_is_in_the_table`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib import admin
from django.contrib.admin import ModelAdmin
from django.contrib.auth.models import AbstractUser, Group, User
from django.db.models import Model
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from accounts import oidc_mappings, roles, signin, users
from accounts import tokens as api_tokens
from accounts.models import (
    OidcGroupMapping,
    OidcMappingRequest,
    PasswordResetRequest,
    SigningState,
)
from audit.models import AuditEvent
from execution.actions import set_stopped
from execution.models import TrustScore, WorkerHeartbeat, WorkItem
from oversight.actions.gate_policy import active_policy
from oversight.actions.policies import propose_policy
from oversight.forms import PolicyProposalForm
from oversight.models import Gate, GateKind, GateRisk, PolicyVersion, ReasonCode
from planning.catalogue import sync_packs
from planning.models import Agent, Case, DomainPack, PlanNode, PromotedMethod, Tool
from planning.promotion.actions import approve_method, propose_method
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.work_items import INVOICE_FIELDS, approve_plan, waiting_work_item
from tests.planning.factories import make_case, make_plan
from tests.routes import MUTATING, all_routes

pytestmark = [pytest.mark.django_db, pytest.mark.scenario("A8")]

NEW_PASSWORD = "a-brand-new-passphrase-42"
PERSONAS: dict[str, Callable[..., AbstractUser]] = {
    "analyst": personas.analyst,
    "officer": personas.officer,
    "auditor": personas.auditor,
    "admin": personas.admin,
}


def _user(make: Callable[..., AbstractUser], *args: str) -> User:
    """A persona as the User the use cases take (tests.personas says AbstractUser)."""
    return cast(User, make(*args))


def _as(user: User) -> Any:
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def _model_admins() -> list[tuple[type[Model], ModelAdmin[Any]]]:
    return list(admin.site._registry.items())


def _info(model: type[Model]) -> str:
    return f"{model._meta.app_label}_{model._meta.model_name}"


def changelist_actions(user: User) -> dict[str, list[str]]:
    """{changelist URL name: the list actions the user is offered there}."""
    request = _as(user)
    return {
        f"admin:{_info(model)}_changelist": sorted(model_admin.get_actions(request))
        for model, model_admin in _model_admins()
    }


def mutating_keys(user: User) -> set[str]:
    """The keys of every route that may change something (admin actions as their own keys)."""
    offered = changelist_actions(user)
    keys: set[str] = set()
    for route in all_routes():
        if route.methods is not None and not route.methods & MUTATING:
            continue
        keys.add(route.key)
        keys.update(f"{route.key} action={name}" for name in offered.get(route.key, []))
    return keys


@dataclass(frozen=True, slots=True)
class Disabled:
    """An admin view the registry turns off for an admin: it must answer 403."""

    model: type[Model]
    view: str  # "add", "change" or "delete"
    why: str


def admin_not_audited(user: User) -> tuple[dict[str, str], dict[str, Disabled]]:
    """What each model admin offers the admin persona that needs no event, and why.

    Returns ({key: why} for read-only admin routes, {key: Disabled} for views it turns off).
    An add, change or delete view the admin *may* use is not here: it belongs in AUDITED.
    """
    request = _as(user)
    read_only: dict[str, str] = {}
    disabled: dict[str, Disabled] = {}
    for model, model_admin in _model_admins():
        info = _info(model)
        opts = model._meta
        read_only[f"admin:{info}_history"] = "history: lists the object's admin log entries"
        read_only[f"admin/{opts.app_label}/{opts.model_name}/<path:object_id>/"] = (
            "redirects to the object's change view"
        )
        if not model_admin.list_editable:
            read_only[f"admin:{info}_changelist"] = (
                "no list_editable: a POST runs only the list actions, each a key of its own"
            )
        allowed = {
            "add": model_admin.has_add_permission(request),
            "change": model_admin.has_change_permission(request),
            "delete": model_admin.has_delete_permission(request),
        }
        for view, may in allowed.items():
            if not may:
                why = f"{view} is disabled: has_{view}_permission is False for an admin"
                disabled[f"admin:{info}_{view}"] = Disabled(model, view, why)
    return read_only, disabled


# The table -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Req:
    """A request to send: a form post, or a JSON body with `json=True`."""

    url: str
    data: dict[str, Any] = field(default_factory=dict)
    json: bool = False
    method: str = "post"


@dataclass(frozen=True, slots=True)
class Audited:
    """Who exercises a route, how (prepare builds the request), and the event it writes.

    persona: a tests.personas role, signed in (or with a bearer token when `api`); None for an
    anonymous client. `known_gap` marks a route that writes no event yet (a strict xfail).
    """

    persona: str | None
    prepare: Callable[[User | None], Req]
    action: str
    api: bool = False
    known_gap: str | None = None


def _invoice_case(analyst: User | None = None) -> Case:
    """The static INV-1042 invoice case: a plan gate and a signed step gate for the hold."""
    return planned_invoice_case(analyst or _user(personas.analyst, "submitter"))


def _plan_gate(case: Case) -> Gate:
    return Gate.objects.get(case=case, kind=GateKind.PLAN, version=case.current_version)


def _node(case: Case, key: str) -> PlanNode:
    return PlanNode.objects.get(version=case.current_version, key=key)


def _second_auditor() -> Agent:
    return Agent.objects.create(
        slug="second-auditor", name="Second auditor", kind=Agent.Kind.TOOL, tools=["check_totals"]
    )


def _low_risk_step_gate() -> Gate:
    case = make_case(_user(personas.analyst, "submitter"))
    version = make_plan(case, leaves=1)
    node = PlanNode.objects.get(version=version, kind="leaf")
    now = timezone.now()
    return Gate.objects.create(
        case=case,
        version=version,
        node=node,
        kind=GateKind.STEP,
        reason="step writes",
        reasons=[{"classifier": "risk", "detail": "write step", "level": GateRisk.LOW}],
        risk=GateRisk.LOW,
        approver_group=Group.objects.get(name=roles.OFFICER),
        content_hash=node.content_hash,
        opened_at=now,
        remind_at=now + timedelta(hours=12),
        deadline=now + timedelta(hours=24),
    )


def _decide_form(user: User | None) -> Req:
    gate = _plan_gate(_invoice_case())
    data = {
        "decision": "approve",
        "version": str(gate.version.number),
        "content_hash": gate.content_hash,
        "detail_opened": "1",
    }
    return Req(reverse("oversight:gate-decide", args=[gate.pk]), data)


def _edit_form(user: User | None) -> Req:
    case = _invoice_case()
    _second_auditor()
    node = _node(case, "check-totals")
    data = {
        "agent": "second-auditor",
        "task": node.task,
        "inputs": json.dumps(node.inputs),
        "depends_on": node.declared_depends_on or [],
        "reason_code": "wrong-agent",
        "reason": "",
        "base_version": node.version.number,
    }
    return Req(reverse("oversight:plan-edit", args=[case.pk, node.pk]), data)


def _add_step_form(user: User | None) -> Req:
    case = _invoice_case()
    node = _node(case, "place-hold")
    data = {
        "key": "second-hold",
        "runner": "payments-clerk:place_payment_hold",
        "task": "Place a second hold",
        "inputs": json.dumps({"report": {"$ref": "audit-report"}}),
        "depends_on": ["place-hold"],
        "reason_code": "other",
        "reason": "two findings, two holds",
        "base_version": node.version.number,
    }
    return Req(reverse("oversight:plan-add-step", args=[case.pk, node.pk]), data)


def _case_form(user: User | None) -> Req:
    sync_packs()
    data = {
        "domain": "invoice",
        "title": "Verify INV-1042",
        "goal": "Verify invoice INV-1042",
        "strategy": "static",
        "max_depth": "2",
        "input_invoice_id": "INV-1042",
    }
    return Req(reverse("planning:case-new"), data)


def _agent_form(agent: Agent, **changes: Any) -> dict[str, Any]:
    data = {
        "name": agent.name,
        "description": agent.description,
        "kind": agent.kind,
        "capabilities": json.dumps(agent.capabilities or ["erp.read"]),
        "tools": json.dumps(agent.tools),
        "trust": str(agent.trust),
        "model": agent.model,
        "system_prompt": agent.system_prompt,
        "enabled": "on" if agent.enabled else "",
        **changes,
    }
    return {key: value for key, value in data.items() if value != ""}


def _agent_add(user: User | None) -> Req:
    sync_packs()
    new = Agent(name="Reviewer bot", kind="llm", trust=0.5, enabled=True, model="gpt-x")
    data = _agent_form(new, slug="reviewer-bot", capabilities='["report.compile"]', tools="[]")
    return Req(reverse("admin:planning_agent_add"), data)


def _agent_change(user: User | None) -> Req:
    sync_packs()
    agent = Agent.objects.order_by("slug").first()
    assert agent is not None
    trust = "0.25" if agent.trust != 0.25 else "0.35"
    return Req(
        reverse("admin:planning_agent_change", args=[agent.pk]), _agent_form(agent, trust=trust)
    )


def _tool_change(user: User | None) -> Req:
    sync_packs()
    tool = Tool.objects.get(name="get_supplier")
    risk = "external" if tool.risk != "external" else "read"
    return Req(reverse("admin:planning_tool_change", args=[tool.pk]), {"risk": risk})


def _pack_change(user: User | None) -> Req:
    sync_packs()
    pack = DomainPack.objects.get(slug="fraud")
    data = {} if pack.enabled else {"enabled": "on"}
    return Req(reverse("admin:planning_domainpack_change", args=[pack.pk]), data)


def _policy_add(user: User | None) -> Req:
    data: dict[str, Any] = PolicyProposalForm.initial_from(active_policy()[1])
    data.update({"amount_threshold": "7500", "reason_code": "threshold-review", "reason": "review"})
    return Req(reverse("admin:oversight_policyversion_add"), data)


def _pending_policy() -> int:
    other = _user(personas.admin, "alice")
    version = propose_policy(other, {"trust_threshold": 0.3}, "threshold-review", "review")
    return version.pk


def _policy_approve(user: User | None) -> Req:
    data = {"action": "approve_selected", "_selected_action": [_pending_policy()]}
    return Req(reverse("admin:oversight_policyversion_changelist"), data)


def _policy_reject(user: User | None) -> Req:
    data = {
        "action": "reject_selected",
        "_selected_action": [_pending_policy()],
        "reason_code": "other",
        "reason": "not now",
    }
    return Req(reverse("admin:oversight_policyversion_changelist"), data)


def _policy_whatif(user: User | None) -> Req:
    version = PolicyVersion.objects.get(pk=_pending_policy())
    today = timezone.localdate()
    data = {"start": str(today - timedelta(days=7)), "end": str(today)}
    return Req(reverse("oversight:policy-whatif", args=[version.pk]), data)


def _reason_code_add(user: User | None) -> Req:
    data = {"code": "sla-change", "label": "SLA change", "applies_to": ["policy"], "active": "on"}
    return Req(reverse("admin:oversight_reasoncode_add"), data)


def _reason_code_change(user: User | None) -> Req:
    code = ReasonCode.objects.get(code="other")
    data = {"label": f"{code.label} (renamed)", "applies_to": list(code.applies_to)}
    if code.active:
        data["active"] = "on"
    return Req(reverse("admin:oversight_reasoncode_change", args=[code.pk]), data)


def _user_add(user: User | None) -> Req:
    data = {
        "username": "newbie",
        "password1": NEW_PASSWORD,
        "password2": NEW_PASSWORD,
        "roles": ["analyst"],
    }
    return Req(reverse("admin:auth_user_add"), data)


def _user_change(user: User | None) -> Req:
    target = _user(personas.analyst, "bea")
    data = {
        "username": target.username,
        "first_name": "Bea",
        "email": "bea@example.com",
        "is_active": "on",
        "roles": users.role_names(target),
    }
    return Req(reverse("admin:auth_user_change", args=[target.pk]), data)


def _user_password(user: User | None) -> Req:
    target = _user(personas.analyst, "bea")
    data = {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
    return Req(reverse("admin:auth_user_password_change", args=[target.pk]), data)


def _user_action(action: str, target: User) -> Req:
    data = {"action": action, "_selected_action": [target.pk]}
    return Req(reverse("admin:auth_user_changelist"), data)


def _deactivate(user: User | None) -> Req:
    return _user_action("deactivate_selected", _user(personas.analyst, "bea"))


def _unlock(user: User | None) -> Req:
    target = _user(personas.officer, "oscar")
    SigningState.objects.create(user=target, failures=5, locked_at=timezone.now())
    return _user_action("unlock_signing_selected", target)


def _password_sign_in_off(user: User | None) -> Req:
    return _user_action("password_sign_in_off_selected", _user(personas.analyst, "bea"))


def _password_sign_in_on(user: User | None) -> Req:
    target = _user(personas.analyst, "bea")
    signin.set_password_sign_in(_user(personas.admin, "alice"), target, off=True)
    return _user_action("password_sign_in_on_selected", target)


def _mapping_add(user: User | None) -> Req:
    return Req(
        reverse("admin:accounts_oidcgroupmapping_add"), {"group": "idp-analysts", "role": "analyst"}
    )


def _a_mapping() -> OidcGroupMapping:
    made = oidc_mappings.map_group(_user(personas.admin, "alice"), "idp-analysts", roles.ANALYST)
    assert isinstance(made, OidcGroupMapping), "an analyst mapping applies at once"
    return made


def _mapping_remove(user: User | None) -> Req:
    data = {"action": "remove_selected", "_selected_action": [_a_mapping().pk]}
    return Req(reverse("admin:accounts_oidcgroupmapping_changelist"), data)


def _a_mapping_proposal() -> OidcMappingRequest:
    made = oidc_mappings.map_group(_user(personas.admin, "alice"), "idp-officers", roles.OFFICER)
    assert isinstance(made, OidcMappingRequest), "an officer mapping waits for a second admin"
    return made


def _mapping_decision(action: str) -> Callable[[User | None], Req]:
    def prepare(user: User | None) -> Req:
        data = {"action": action, "_selected_action": [_a_mapping_proposal().pk], "reason": "no"}
        return Req(reverse("admin:accounts_oidcmappingrequest_changelist"), data)

    return prepare


def _locked_pair(user: User | None) -> Req:
    AccessAttempt.objects.create(
        username="oscar",
        ip_address="198.51.100.7",
        user_agent="test",
        get_data="",
        post_data="",
        http_accept="",
        path_info="/login/",
        failures_since_start=settings.AXES_FAILURE_LIMIT,
    )
    data = {"limit": "pair", "username": "oscar", "ip": "198.51.100.7", "reason": "test"}
    return Req(reverse("accounts:lockout-lift"), data)


def _pending_reset() -> PasswordResetRequest:
    pending = users.request_password_reset(
        _user(personas.admin, "alice"), _user(personas.officer, "oscar"), NEW_PASSWORD
    )
    assert pending is not None, "an officer's new password waits for a second admin"
    return pending


def _reset_decision(action: str) -> Callable[[User | None], Req]:
    def prepare(user: User | None) -> Req:
        data = {"action": action, "_selected_action": [_pending_reset().pk]}
        return Req(reverse("admin:accounts_passwordresetrequest_changelist"), data)

    return prepare


def _pending_grant() -> Any:
    # A sensitive role for a user waits for a second admin (accounts.users).
    pending = users.set_roles(
        _user(personas.admin, "alice"), _user(personas.analyst, "bea"), [roles.OFFICER]
    )
    assert pending is not None, "the officer role waits for a second admin"
    return pending


def _grant_decision(action: str) -> Callable[[User | None], Req]:
    def prepare(user: User | None) -> Req:
        data = {"action": action, "_selected_action": [_pending_grant().pk], "reason": "no need"}
        return Req(reverse("admin:accounts_rolegrantrequest_changelist"), data)

    return prepare


def _login(url: str, persona: Callable[..., AbstractUser]) -> Callable[[User | None], Req]:
    def prepare(user: User | None) -> Req:
        who = _user(persona)
        return Req(url, {"username": who.username, "password": personas.PASSWORD})

    return prepare


def _own_password(user: User | None) -> Req:
    data = {
        "old_password": personas.PASSWORD,
        "new_password1": NEW_PASSWORD,
        "new_password2": NEW_PASSWORD,
    }
    return Req(reverse("admin:password_change"), data)


def _api_token(user: User | None) -> Req:
    who = _user(personas.analyst)
    data = {"username": who.username, "password": personas.PASSWORD}
    return Req("/api/auth/token", data, json=True)


def _own_token_revoke(user: User | None) -> Req:
    assert user is not None
    api_tokens.issue_api_token(user)
    token = user.api_tokens.get()
    return Req(reverse("accounts:account-token-revoke", args=[token.pk]))


def _api_token_by_id(user: User | None) -> Req:
    assert user is not None
    api_tokens.issue_api_token(user)
    token = user.api_tokens.get()
    return Req(f"/api/auth/tokens/{token.pk}", json=True, method="delete")


def _api_case(user: User | None) -> Req:
    data = {
        "title": "Verify INV-1042",
        "goal": "Verify invoice INV-1042",
        "domain": "invoice",
        "strategy": "static",
        "inputs": {"invoice_id": "INV-1042"},
    }
    return Req("/api/cases", data, json=True)


def _api_edit(user: User | None) -> Req:
    case = _invoice_case()
    _second_auditor()
    data = {
        "node": "check-totals",
        "changes": {"agent": "second-auditor"},
        "reason_code": "wrong-agent",
    }
    return Req(f"/api/cases/{case.pk}/plan/edits", data, json=True)


def _running_invoice_case() -> Case:
    case = _invoice_case()
    approve_plan(case, _user(personas.officer, "olga"))
    return case


def _open_work_item() -> WorkItem:
    # The submitter is not the analyst persona, who is in the item's group and may do it.
    return waiting_work_item(_user(personas.analyst, "submitter"), _user(personas.officer, "olga"))


def _cancel_form(user: User | None) -> Req:
    case = _running_invoice_case()
    data = {"reason_code": "no-longer-needed", "reason": "paid elsewhere"}
    return Req(reverse("execution:case-cancel", args=[case.pk]), data)


def _work_item_form(user: User | None) -> Req:
    item = _open_work_item()
    data = {"output": json.dumps(INVOICE_FIELDS)}
    return Req(reverse("execution:work-item-complete", args=[item.pk]), data)


def _api_cancel(user: User | None) -> Req:
    case = _running_invoice_case()
    return Req(f"/api/cases/{case.pk}/cancel", {"reason_code": "other", "reason": "x"}, json=True)


def _api_work_item(user: User | None) -> Req:
    item = _open_work_item()
    return Req(f"/api/work-items/{item.pk}/complete", {"output": INVOICE_FIELDS}, json=True)


def _api_resume(user: User | None) -> Req:
    set_stopped(stopped=True, user=_user(personas.admin, "alice"), reason="maintenance")
    return Req("/api/control/resume", {"reason": "done"}, json=True)


def _api_decision(user: User | None) -> Req:
    gate = _plan_gate(_invoice_case())
    return Req(f"/api/gates/{gate.pk}/decision", {"decision": "approve"}, json=True)


def _promotable_case() -> tuple[Case, PlanNode]:
    """A completed incident case whose LLM-planned steps all succeeded: its root is promotable."""
    case = make_case(
        _user(personas.analyst, "submitter"),
        domain="incident",
        strategy="hybrid",
        status="completed",
        inputs={"kind": "certificate-expiry", "service": "web"},
    )
    version = make_plan(case, leaves=2, status="succeeded")
    PlanNode.objects.filter(version=version).update(
        provenance={"strategy": "hybrid", "source": "llm:1", "depth": 1},
        agent="incident-commander",
        tool="",
    )
    return case, PlanNode.objects.get(version=version, parent=None)


def _promote_form(user: User | None) -> Req:
    case, root = _promotable_case()
    data = {"name": "certificate-expiry", "op-kind": "equals"}
    return Req(reverse("planning:node-promote", args=[case.pk, root.pk]), data)


def _proposed_method() -> PromotedMethod:
    case, root = _promotable_case()
    return propose_method(
        user=_user(personas.second_officer, "oscar"),
        case_id=case.pk,
        node_id=root.pk,
        name="certificate-expiry",
        guard=[{"key": "kind", "op": "equals", "value": "certificate-expiry"}],
    )


def _method_step(step: str) -> Callable[[User | None], Req]:
    def prepare(user: User | None) -> Req:
        method = _proposed_method()
        if step == "retire":
            approve_method(user=_user(personas.officer, "olga"), method_id=method.pk)
        return Req(reverse(f"planning:method-{step}", args=[method.pk]), {"reason": "why"})

    return prepare


AUDITED: dict[str, Audited] = {
    # Sign-in and sign-out: written by the auth signals (accounts.signals).
    "login": Audited(None, _login("/login/", personas.analyst), "auth.login.succeeded"),
    "logout": Audited("analyst", lambda user: Req(reverse("logout")), "auth.logout"),
    "admin:login": Audited(
        None, _login(reverse("admin:login"), personas.admin), "auth.login.succeeded"
    ),
    "admin:logout": Audited("admin", lambda user: Req(reverse("admin:logout")), "auth.logout"),
    "admin:password_change": Audited(
        "admin",
        _own_password,
        "auth.user.password_changed",
    ),
    # The user's own sessions and tokens (accounts.sessions, planning.actions).
    "accounts:account-log-out-everywhere": Audited(
        "analyst",
        lambda user: Req(reverse("accounts:account-log-out-everywhere")),
        "security.sessions.ended",
    ),
    "accounts:account-token-revoke": Audited("analyst", _own_token_revoke, "auth.token.revoked"),
    # Review.
    "oversight:inbox-approve": Audited(
        "officer",
        lambda user: Req(reverse("oversight:inbox-approve"), {"gate": [_low_risk_step_gate().pk]}),
        "oversight.gate.decided",
    ),
    "oversight:gate-decide": Audited("officer", _decide_form, "oversight.gate.decided"),
    "oversight:plan-edit": Audited("officer", _edit_form, "planning.plan.edited"),
    "oversight:plan-add-step": Audited("officer", _add_step_form, "planning.plan.edited"),
    "oversight:case-trail-export": Audited(
        "auditor",
        lambda user: Req(reverse("oversight:case-trail-export", args=[_invoice_case().pk])),
        "oversight.audit.exported",
    ),
    "planning:case-new": Audited("analyst", _case_form, "planning.case.submitted"),
    # Promoted methods (planning.promotion).
    "planning:node-promote": Audited("officer", _promote_form, "planning.method.proposed"),
    "planning:method-approve": Audited(
        "officer", _method_step("approve"), "planning.method.approved"
    ),
    "planning:method-reject": Audited(
        "officer", _method_step("reject"), "planning.method.rejected"
    ),
    "planning:method-retire": Audited("officer", _method_step("retire"), "planning.method.retired"),
    # Execution.
    "execution:case-cancel": Audited("officer", _cancel_form, "planning.case.cancelled"),
    "execution:work-item-complete": Audited(
        "analyst", _work_item_form, "execution.work_item.completed"
    ),
    "execution:execution-control-set": Audited(
        "admin",
        lambda user: Req(
            reverse("execution:execution-control-set"), {"action": "stop", "reason": "test"}
        ),
        "execution.control.stopped",
    ),
    "accounts:lockout-lift": Audited("admin", _locked_pair, "security.login.unlocked"),
    # Configuration in the admin.
    "admin:planning_agent_add": Audited("admin", _agent_add, "config.agent.created"),
    "admin:planning_agent_change": Audited("admin", _agent_change, "config.agent.changed"),
    "admin:planning_tool_change": Audited("admin", _tool_change, "config.tool.risk_changed"),
    "admin:planning_domainpack_change": Audited("admin", _pack_change, "config.pack.changed"),
    "admin:oversight_policyversion_add": Audited(
        "admin", _policy_add, "oversight.policy.activated"
    ),
    "admin:oversight_policyversion_changelist action=approve_selected": Audited(
        "admin", _policy_approve, "oversight.policy.approved"
    ),
    "admin:oversight_policyversion_changelist action=reject_selected": Audited(
        "admin", _policy_reject, "oversight.policy.rejected"
    ),
    "oversight:policy-whatif": Audited(
        "admin", _policy_whatif, "oversight.policy.whatif_requested"
    ),
    "admin:oversight_reasoncode_add": Audited(
        "admin", _reason_code_add, "oversight.reason_code.added"
    ),
    "admin:oversight_reasoncode_change": Audited(
        "admin", _reason_code_change, "oversight.reason_code.changed"
    ),
    # Users in the admin.
    "admin:auth_user_add": Audited("admin", _user_add, "auth.user.created"),
    "admin:auth_user_change": Audited("admin", _user_change, "auth.user.changed"),
    "admin:auth_user_password_change": Audited("admin", _user_password, "auth.user.password_reset"),
    "admin:auth_user_changelist action=deactivate_selected": Audited(
        "admin", _deactivate, "auth.user.deactivated"
    ),
    "admin:auth_user_changelist action=unlock_signing_selected": Audited(
        "admin", _unlock, "security.signing.unlocked"
    ),
    "admin:auth_user_changelist action=password_sign_in_off_selected": Audited(
        "admin", _password_sign_in_off, "auth.user.password_sign_in_changed"
    ),
    "admin:auth_user_changelist action=password_sign_in_on_selected": Audited(
        "admin", _password_sign_in_on, "auth.user.password_sign_in_changed"
    ),
    # Group mappings of the identity provider's claim (accounts.oidc_mappings).
    "admin:accounts_oidcgroupmapping_add": Audited(
        "admin", _mapping_add, "auth.oidc.mapping.added"
    ),
    "admin:accounts_oidcgroupmapping_changelist action=remove_selected": Audited(
        "admin", _mapping_remove, "auth.oidc.mapping.removed"
    ),
    "admin:accounts_oidcmappingrequest_changelist action=approve_selected": Audited(
        "admin", _mapping_decision("approve_selected"), "auth.oidc.mapping.approved"
    ),
    "admin:accounts_oidcmappingrequest_changelist action=reject_selected": Audited(
        "admin", _mapping_decision("reject_selected"), "auth.oidc.mapping.rejected"
    ),
    "admin:accounts_passwordresetrequest_changelist action=approve_selected": Audited(
        "admin", _reset_decision("approve_selected"), "auth.password_reset.approved"
    ),
    "admin:accounts_passwordresetrequest_changelist action=reject_selected": Audited(
        "admin", _reset_decision("reject_selected"), "auth.password_reset.rejected"
    ),
    "admin:accounts_rolegrantrequest_changelist action=approve_selected": Audited(
        "admin", _grant_decision("approve_selected"), "auth.role_grant.approved"
    ),
    "admin:accounts_rolegrantrequest_changelist action=reject_selected": Audited(
        "admin", _grant_decision("reject_selected"), "auth.role_grant.rejected"
    ),
    # The API.
    "POST /api/auth/token": Audited(None, _api_token, "auth.token.issued"),
    "DELETE /api/auth/token": Audited(
        "analyst",
        lambda user: Req("/api/auth/token", json=True, method="delete"),
        "auth.token.revoked",
        api=True,
    ),
    "DELETE /api/auth/tokens/<token_id>": Audited(
        "analyst", _api_token_by_id, "auth.token.revoked", api=True
    ),
    "POST /api/cases": Audited("analyst", _api_case, "planning.case.submitted", api=True),
    "POST /api/cases/<int:case_id>/plan/edits": Audited(
        "officer", _api_edit, "planning.plan.edited", api=True
    ),
    "POST /api/gates/<int:gate_id>/decision": Audited(
        "officer", _api_decision, "oversight.gate.decided", api=True
    ),
    "POST /api/cases/<int:case_id>/cancel": Audited(
        "officer", _api_cancel, "planning.case.cancelled", api=True
    ),
    "POST /api/control/stop": Audited(
        "admin",
        lambda user: Req("/api/control/stop", {"reason": "maintenance"}, json=True),
        "execution.control.stopped",
        api=True,
    ),
    "POST /api/control/resume": Audited(
        "admin", _api_resume, "execution.control.resumed", api=True
    ),
    "POST /api/work-items/<int:item_id>/complete": Audited(
        "analyst", _api_work_item, "execution.work_item.completed", api=True
    ),
}

READ_ONLY = "read-only whatever the method: renders a page and changes nothing"
API_FALLBACK = "the API's fallback: answers 404 in JSON for a path no router serves"

NOT_AUDITED: dict[str, str] = {
    "oversight:notification-read": "marks one of the user's own notices read; changes no case "
    "or configuration — not audited by design",
    "oversight:notifications-read-all": "marks the user's own notices read; changes no case or "
    "configuration — not audited by design",
    "admin:index": READ_ONLY,
    "admin:app_list": READ_ONLY,
    "admin:password_change_done": READ_ONLY,
    "admin:jsi18n": READ_ONLY + " (the admin's JavaScript catalogue)",
    "admin:autocomplete": READ_ONLY + " (JSON search results)",
    "admin:view_on_site": "redirects to an object's public URL",
    "admin/(?P<url>.*)$": "the admin's catch-all: redirects to add a slash, or 404",
    "api:api-root": "the API's root: 404 in JSON",
    "api:openapi-json": READ_ONLY + " (the OpenAPI document)",
    "api:openapi-view": READ_ONLY + " (the API docs page)",
    **{f"{method} /api/<anypath:rest>": API_FALLBACK for method in sorted(MUTATING)},
}


# The tests -----------------------------------------------------------------------------------


def _send(client: Client, req: Req) -> HttpResponse:
    send = getattr(client, req.method)
    if req.json:
        return send(req.url, req.data, content_type="application/json")
    return send(req.url, req.data)


def _cases() -> list[Any]:
    params = []
    for key, entry in AUDITED.items():
        marks = []
        if entry.known_gap is not None:
            marks.append(pytest.mark.xfail(reason=entry.known_gap, strict=True))
        params.append(pytest.param(key, id=key, marks=marks))
    return params


@pytest.mark.parametrize("key", _cases())
def test_each_mutating_route_writes_its_event(key: str) -> None:
    entry = AUDITED[key]
    user = _user(PERSONAS[entry.persona]) if entry.persona is not None else None
    req = entry.prepare(user)
    if user is None:
        client = Client()
    elif entry.api:
        client = Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})
    else:
        client = Client()
        client.force_login(user)
    last = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    response = _send(client, req)
    assert response.status_code < 400, (
        f"{key}: {req.method.upper()} {req.url} answered {response.status_code}: "
        f"{response.content.decode(errors='replace')[:1000]}"
    )
    written = list(
        AuditEvent.objects.filter(pk__gt=last).order_by("pk").values_list("action", flat=True)
    )
    assert any(action.startswith(entry.action) for action in written), (
        f"{key}: {req.method.upper()} {req.url} wrote no {entry.action}* event (it wrote "
        f"{written or 'nothing'})"
    )


def test_every_mutating_route_is_in_the_table() -> None:
    admin_user = _user(personas.admin)
    read_only, disabled = admin_not_audited(admin_user)
    documented = AUDITED.keys() | NOT_AUDITED.keys() | read_only.keys() | disabled.keys()
    found = mutating_keys(admin_user)
    missing = sorted(found - documented)
    assert not missing, (
        "Mutating routes with no entry; add each to AUDITED with the event it writes, or to "
        f"NOT_AUDITED with why: {missing}"
    )
    stale = sorted(documented - found)
    assert not stale, f"Entries for routes that no longer exist or no longer mutate: {stale}"
    both = sorted(
        (AUDITED.keys() & NOT_AUDITED.keys())
        | (AUDITED.keys() & (read_only.keys() | disabled.keys()))
        | (NOT_AUDITED.keys() & (read_only.keys() | disabled.keys()))
    )
    assert not both, f"Routes both audited and not, or documented twice: {both}"


def test_the_walk_sees_the_api_methods_and_the_declared_methods() -> None:
    routes = {route.key: route for route in all_routes()}
    assert routes["GET /api/cases"].methods == frozenset({"GET"})
    assert "POST /api/cases" in routes
    assert routes["oversight:gate-detail"].methods == frozenset({"GET"})
    assert routes["oversight:gate-decide"].methods == frozenset({"POST"})
    assert routes["oversight:plan-edit"].methods == frozenset({"GET", "POST"})
    assert routes["admin:planning_agent_add"].methods is None  # the admin's: possibly mutating
    keys = mutating_keys(_user(personas.admin))
    assert "oversight:gate-detail" not in keys and "GET /api/cases" not in keys


def _an_object(model: type[Model]) -> Model:
    sync_packs()
    row = model._default_manager.order_by("pk").first()
    if row is not None:
        return row
    if model is WorkerHeartbeat:
        now = timezone.now()
        return WorkerHeartbeat.objects.create(hostname="w1", pid=1, started_at=now, last_seen=now)
    if model is PasswordResetRequest:
        return _pending_reset()
    if model._meta.label == "accounts.RoleGrantRequest":
        return _pending_grant()
    if model is OidcGroupMapping:
        return _a_mapping()
    if model is OidcMappingRequest:
        return _a_mapping_proposal()
    if model is TrustScore:
        agent = Agent.objects.order_by("slug").first()
        assert agent is not None
        return TrustScore.objects.create(
            agent=agent, capability="erp.read", successes=1, failures=0, updated_at=timezone.now()
        )
    raise AssertionError(f"no {model.__name__} row to try the admin on: add one in _an_object")


def _disabled_cases() -> list[Any]:
    # Every registered model's add, change and delete view; whether an admin may use it is
    # decided inside the test (the permission methods read the database).
    return [
        pytest.param(model, view, id=f"{_info(model)}_{view}")
        for model, _ in _model_admins()
        for view in ("add", "change", "delete")
    ]


@pytest.mark.parametrize(("model", "view"), _disabled_cases())
def test_admin_views_the_registry_disables_answer_403(model: type[Model], view: str) -> None:
    admin_user = _user(personas.admin)
    _, disabled = admin_not_audited(admin_user)
    key = f"admin:{_info(model)}_{view}"
    if key not in disabled:
        assert key in AUDITED, f"{key} is open to an admin: add it to AUDITED"
        return
    target = None if view == "add" else _an_object(model)
    url = reverse(key) if view == "add" else reverse(key, args=[target.pk])  # type: ignore[union-attr]
    client = Client()
    client.force_login(admin_user)
    data = {"post": "yes"} if view == "delete" else {}
    assert client.post(url, data).status_code == 403, disabled[key].why
    if target is not None:
        assert model._default_manager.filter(pk=target.pk).exists()
