"""Every route answers every persona as the authorization matrix says (RELIABILITY W3, W2).

The routes come from the URLconf walk (`tests.routes`), the expected outcomes from the matrix
(`tests.casehub.authz_matrix`). Each route is requested as anonymous, the analyst who
submitted the case, a second analyst, an officer, a supervisor, an auditor, an admin and a user
with no role; pages with and without `HX-Request` (and the row's `HX-Target`); with GET and each
mutating method it accepts (POST with nothing in it: the matrix is about who is let through,
not what they send). Pages and the admin are signed in by session, the API by bearer token.

The URL arguments are real objects: the analyst's planned INV-1042 case, a step of its plan, its
plan gate, the officer's notification, the signing key, one row of each admin model. All of
it is built once for the module; every request runs in a savepoint rolled back after it, so each
one meets the same rows. A GET, and any refused request, must change nothing (W2): no row
written (sessions, token bookkeeping and access-denial counters aside) and no audit event but
the access denial's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import AbstractUser, Group, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.db.models import Model
from django.http import HttpResponse
from django.http.request import HttpHeaders
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from django.utils import timezone

from accounts import oidc_mappings, roles, users
from accounts import tokens as api_tokens
from accounts.models import ApiToken
from audit.models import AuditEvent
from audit.signing import current_key
from execution.models import WorkerHeartbeat, WorkItem
from oversight.actions.edits import edit_plan
from oversight.actions.policies import propose_policy
from oversight.actions.whatif import request_whatif
from oversight.models import OPEN_GATE_STATUSES, Gate, GateKind, GateRisk, Notification, ReasonCode
from planning.catalogue import sync_packs
from planning.models import Case, PlanNode, PromotedMethod
from planning.promotion.methods import method_hash
from tests import personas
from tests.casehub.authz_matrix import MATRIX, PERSONAS, Row, format_row
from tests.cases import planned_invoice_case
from tests.routes import MUTATING, Route, all_routes

pytestmark = [pytest.mark.django_db, pytest.mark.scenario("W3")]

NEW_PASSWORD = "a-brand-new-passphrase-42"
# Rows a request may write without changing anything a user would call state: its session, the
# bearer token's last use, the access-denial counters and the audit chain (its events are
# checked by action instead).
BOOKKEEPING = {"django_session", "planning_apitoken", "oversight_accessdenial"}
AUDIT_TABLES = {"oversight_auditevent", "oversight_auditchainhead"}
WRITE = re.compile(r'^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.IGNORECASE)
PATH_PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>")
REGEX_GROUP = re.compile(r"\(\?P<(\w+)>[^)]*\)")
REFUSAL = r"(denied|refused)(\.summary)?$"


@dataclass(slots=True)
class World:
    """The personas (sessions and tokens) and the objects the URLs name."""

    users: dict[str, AbstractUser | None]
    sessions: dict[str, str]
    tokens: dict[str, str]
    arguments: dict[str, str]
    admin_objects: dict[str, str] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)  # what the bodies need


def _low_risk_step_gate(case: Case, node: PlanNode) -> Gate:
    """Open a low-risk step gate for the officers on the node (bulk approval takes it)."""
    now = timezone.now()
    return Gate.objects.create(
        case=case,
        version=node.version,
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


def _promoted_method(case: Case, node: PlanNode, proposer: AbstractUser) -> PromotedMethod:
    """A proposed promoted method, stored as the promotion action stores one (for its pages)."""
    body: dict[str, Any] = {
        "pack": case.domain,
        "task": "verify-invoice",
        "name": "matrix-method",
        "version": 1,
        "description": "",
        "guard": [{"key": "invoice_id", "op": "present", "value": None}],
        "subtree": [
            {"kind": "task", "key": "x", "task": "check", "description": "", "depends_on": None}
        ],
    }
    return PromotedMethod.objects.create(
        **body,
        content_hash=method_hash(**body),
        source_case=case,
        source_version_id=node.version_id,
        source_node=node,
        proposed_by=proposer,
    )


def _admin_objects(officer: AbstractUser, admin_user: AbstractUser) -> dict[str, str]:
    """One row of each model the admin registers, by "app_label/model_name"."""
    sync_packs()
    now = timezone.now()
    WorkerHeartbeat.objects.create(hostname="w1", pid=1, started_at=now, last_seen=now)
    second_admin = personas.admin("alice")
    users.request_password_reset(second_admin, officer, NEW_PASSWORD)
    users.set_roles(second_admin, personas.analyst("bea"), [roles.OFFICER])
    oidc_mappings.map_group(second_admin, "casehub-analysts", roles.ANALYST)
    oidc_mappings.map_group(second_admin, "casehub-officers", roles.OFFICER)  # a proposal
    found: dict[str, str] = {}
    for model in admin.site._registry:
        row: Model | None = model._default_manager.order_by("pk").first()
        # A model with no row here is asked for id 1 (the admin answers as for a missing row).
        found[f"{model._meta.app_label}/{model._meta.model_name}"] = str(row.pk if row else 1)
    found["auth/user"] = str(admin_user.pk)
    return found


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    """Build the personas and the case once; roll everything back after the module."""
    # Real password hashing costs ~1 s a user here; the conftest's fixture is per test only.
    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    with django_db_blocker.unblock(), fast, transaction.atomic():
        people: dict[str, AbstractUser | None] = {
            "anonymous": None,
            "analyst": personas.analyst("ana"),
            "analyst2": personas.analyst("bob"),
            "officer": personas.officer("olivia"),
            "supervisor": personas.make_user("sam", roles.SUPERVISOR),
            "auditor": personas.auditor("audrey"),
            "admin": personas.admin("adam"),
            "outsider": personas.outsider("otto"),
        }
        case = planned_invoice_case(people["analyst"])
        # A second version (edited by another officer), so that diffs have two sides.
        edit_code = next(
            c.code for c in ReasonCode.objects.filter(active=True) if "edit" in c.applies_to
        )
        edit_plan(
            case_id=case.pk,
            user=personas.second_officer("oscar"),  # type: ignore[arg-type]
            node_key="check-totals",
            changes={"task": "Check the invoice totals against the order lines"},
            reason_code=edit_code,
            reason="clearer task",
        )
        case.refresh_from_db()
        version = case.current_version
        assert version is not None
        node = PlanNode.objects.get(version=version, key="check-totals")
        gate = Gate.objects.get(
            case=case, kind=GateKind.PLAN, version=version, status__in=OPEN_GATE_STATUSES
        )
        step_gate = _low_risk_step_gate(case, node)
        method = _promoted_method(case, node, User.objects.get(username="oscar"))
        now = timezone.now()
        work_item = WorkItem.objects.create(
            case=case,
            node=node,
            attempt=1,
            group=Group.objects.get(name=roles.ANALYST),
            created_at=now,
            deadline=now + timedelta(days=1),
        )
        officer = people["officer"]
        notice = Notification.objects.filter(user=officer).first()
        if notice is None:
            notice = Notification.objects.create(user=officer, kind="gate", message="A gate")
        sessions: dict[str, str] = {}
        tokens: dict[str, str] = {}
        for name, user in people.items():
            if user is None:
                continue
            client = Client()
            client.force_login(user)
            sessions[name] = client.cookies[settings.SESSION_COOKIE_NAME].value
            tokens[name] = api_tokens.issue_api_token(user)  # type: ignore[arg-type]
        arguments = {
            "case_id": str(case.pk),
            "node_id": str(node.pk),
            "gate_id": str(gate.pk),
            "notification_id": str(notice.pk),
            "item_id": str(work_item.pk),
            "key_id": current_key().key_id,
            "rest": "no-such-endpoint",
            "url": "no-such-page/",
            "app_label": "planning",
            "id": str(people["analyst"].pk),  # type: ignore[union-attr]
            "content_type_id": str(ContentType.objects.get_for_model(Gate).pk),
            "object_id": str(gate.pk),
            # The analyst's own API token (revoked by its owner, unknown to anyone else).
            "method_id": str(method.pk),
            "token_id": str(
                ApiToken.objects.filter(user=people["analyst"]).values_list("pk", flat=True)[0]
            ),
        }
        world = World(people, sessions, tokens, arguments)
        world.facts = {
            "version": str(version.number),
            "content_hash": gate.content_hash,
            "step_gate_id": str(step_gate.pk),
            "node_key": node.key,
            "node_agent": node.agent,
            "node_inputs": json.dumps(node.inputs),
            "edit_code": edit_code,
            "cancel_code": next(
                (
                    c.code
                    for c in ReasonCode.objects.filter(active=True)
                    if "cancel" in c.applies_to
                ),
                "other",
            ),
        }
        world.admin_objects = _admin_objects(officer, people["admin"])  # type: ignore[arg-type]
        # A pending (looser) policy version and a what-if of it, asked by a second admin.
        second_admin = User.objects.get(username="alice")
        pending = propose_policy(second_admin, {"gate_hours": 48}, "threshold-review", "why")
        world.arguments["version_id"] = str(pending.pk)
        world.arguments["whatif_id"] = str(request_whatif(second_admin, pending).pk)
        yield world
        transaction.set_rollback(True)


# Requests ------------------------------------------------------------------------------------

Body = tuple[dict[str, Any], bool]  # (data, as JSON)


def _case_fields(world: World) -> dict[str, Any]:
    return {
        "title": "Verify INV-1042",
        "goal": "Verify invoice INV-1042",
        "domain": "invoice",
        "strategy": "static",
    }


# What each mutating route is sent: what would succeed for whoever may use it, so that a
# refusal is the refusal of who asked, not of what was sent. A route not named gets nothing.
BODIES: dict[str, Callable[[World], Body]] = {
    "oversight:gate-decide": lambda w: (
        {
            "decision": "approve",
            "version": w.facts["version"],
            "content_hash": w.facts["content_hash"],
            "detail_opened": "1",
        },
        False,
    ),
    "oversight:inbox-approve": lambda w: ({"gate": [w.facts["step_gate_id"]]}, False),
    "oversight:policy-whatif": lambda w: (
        {
            "start": str(timezone.localdate() - timedelta(days=7)),
            "end": str(timezone.localdate()),
        },
        False,
    ),
    "oversight:plan-edit": lambda w: (
        {
            "agent": w.facts["node_agent"],
            "task": "Check the totals twice",
            "inputs": w.facts["node_inputs"],
            "reason_code": w.facts["edit_code"],
            "base_version": w.facts["version"],
        },
        False,
    ),
    "planning:case-new": lambda w: (
        {**_case_fields(w), "max_depth": "2", "input_invoice_id": "INV-1042"},
        False,
    ),
    "POST /api/cases": lambda w: ({**_case_fields(w), "inputs": {"invoice_id": "INV-1042"}}, True),
    "POST /api/cases/<int:case_id>/plan/edits": lambda w: (
        {
            "node": w.facts["node_key"],
            "changes": {"task": "Check the totals twice"},
            "reason_code": w.facts["edit_code"],
        },
        True,
    ),
    "POST /api/gates/<int:gate_id>/decision": lambda w: ({"decision": "approve"}, True),
    # Execution (cancel, the global stop, work items).
    "execution:case-cancel": lambda w: (
        {"reason_code": w.facts["cancel_code"], "reason": "x"},
        False,
    ),
    "execution:execution-control-set": lambda w: ({"action": "stop", "reason": "upgrade"}, False),
    "execution:work-item-complete": lambda w: ({"output": "{}"}, False),
    "POST /api/cases/<int:case_id>/cancel": lambda w: (
        {"reason_code": w.facts["cancel_code"], "reason": "x"},
        True,
    ),
    "POST /api/control/stop": lambda w: ({"reason": "upgrade"}, True),
    "POST /api/control/resume": lambda w: ({"reason": "upgraded"}, True),
    "POST /api/work-items/<int:item_id>/complete": lambda w: ({"output": {}}, True),
}


def _is_api(route: Route) -> bool:
    return route.route.startswith("api/")


def url_of(route: Route, world: World) -> str:
    """Return the route's URL with real objects for its parameters."""
    arguments = dict(world.arguments)
    model = re.match(r"admin/(\w+)/(\w+)/", route.route)
    if model is not None and f"{model[1]}/{model[2]}" in world.admin_objects:
        arguments["object_id"] = world.admin_objects[f"{model[1]}/{model[2]}"]

    def value(match: re.Match[str]) -> str:
        name = match[1]
        assert name in arguments, (
            f"{route.key}: no value for the URL parameter {name!r}; add one to `arguments` in "
            "the world fixture of tests/casehub/test_authz_matrix.py"
        )
        return arguments[name]

    path = PATH_PARAMETER.sub(value, REGEX_GROUP.sub(value, route.route))
    url = "/" + path.replace("^", "").replace("$", "")
    row = MATRIX.get(route.key)
    return f"{url}?{row.query.format(**arguments)}" if row is not None and row.query else url


def methods_of(route: Route, routes: dict[str, Route]) -> list[tuple[str, bool]]:
    """Return (method, accepted) pairs to send: GET always, and each mutating method."""
    if route.methods is None:  # the admin's views: they take GET and POST
        return [("GET", True), ("POST", True)]
    sent = [("GET", "GET" in route.methods)]
    if _is_api(route) and not sent[0][1]:
        # The API's GET on this path is a key of its own when there is one.
        sent = [] if f"GET /{route.route}" in routes else sent
    sent.extend((method, True) for method in sorted(route.methods & MUTATING))
    return sent


# One client for every request: a new one would build the middleware chain again (WhiteNoise
# alone scans the static files for ~0.1 s). Its headers and cookie are set for each request.
CLIENT = Client(raise_request_exception=False)


def _client(persona: str, world: World, route: Route, row: Row | None, hx: bool) -> Client:
    headers: dict[str, str] = {}
    if hx:
        headers["HX-Request"] = "true"
        if row is not None and row.hx_target:
            headers["HX-Target"] = row.hx_target
    if _is_api(route) and persona in world.tokens:
        headers["Authorization"] = f"Bearer {world.tokens[persona]}"
    CLIENT.defaults = HttpHeaders.to_wsgi_names(headers)
    CLIENT.cookies = SimpleCookie()
    if not _is_api(route) and persona in world.sessions:
        CLIENT.cookies[settings.SESSION_COOKIE_NAME] = world.sessions[persona]
    return CLIENT


def outcome(response: HttpResponse) -> str:
    """Classify a response as a matrix cell (or as its status when it is none of them)."""
    status = response.status_code
    if status in {301, 302, 303, 307, 308}:
        location = urlsplit(response["Location"])
        to_login = location.path in {reverse("login"), reverse("admin:login")}
        return "401" if to_login and "next" in parse_qs(location.query) else "ok"
    if status in {401, 403, 404, 405}:
        return str(status)
    if status < 300 or status in {400, 409, 422, 429, 503}:
        return "ok"
    return str(status)


@dataclass(frozen=True, slots=True)
class Seen:
    """What one request got, and what it wrote that it must not have."""

    cell: str
    writes: tuple[str, ...]


def _request(client: Client, method: str, url: str, body: Body | None) -> HttpResponse:
    if body is None or method == "GET":
        return client.generic(method, url)
    data, as_json = body
    if as_json:
        return client.generic(method, url, json.dumps(data), "application/json")
    return client.post(url, data) if method == "POST" else client.generic(method, url)


def send(
    client: Client, method: str, url: str, body: Body | None = None, audited_read: str = ""
) -> Seen:
    """Send one request in a savepoint rolled back after it; return its cell and its writes.

    Refusals' own audit events (`...denied`, `...refused`) and, for a GET, the audited read's
    event are not writes.
    """
    with transaction.atomic():
        last = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        connection.queries_log.clear()  # a full log would hide this request's queries
        with CaptureQueriesContext(connection) as queries:
            response = _request(client, method, url, body)
        tables = {
            match[2].lower()
            for query in queries.captured_queries
            if (match := WRITE.match(query["sql"])) is not None
        }
        events = AuditEvent.objects.filter(pk__gt=last).exclude(action__regex=REFUSAL)
        if audited_read and method == "GET":
            events = events.exclude(action=audited_read)
        writes = sorted(tables - BOOKKEEPING - AUDIT_TABLES) + [
            f"audit event {action}" for action in events.values_list("action", flat=True)
        ]
        transaction.set_rollback(True)
    return Seen(outcome(response), tuple(writes))


def _htmx_variants(route: Route) -> tuple[bool, ...]:
    # htmx drives the pages and their partials; the admin and the API never see its headers.
    if _is_api(route) or route.route.startswith("admin/"):
        return (False,)
    return (False, True)


def observe(route: Route, row: Row | None, world: World, routes: dict[str, Route]) -> list[str]:
    """Request the route as every persona; return a line per request that breaks the row."""
    problems: list[str] = []
    for method, accepted in methods_of(route, routes):
        url = url_of(route, world)
        for index, persona in enumerate(PERSONAS):
            for hx in _htmx_variants(route):
                body = BODIES[route.key](world) if route.key in BODIES else None
                audited = row.audited_read if row is not None else ""
                seen = send(_client(persona, world, route, row, hx), method, url, body, audited)
                if accepted and row is not None:
                    want = row.expected(method)[index]
                elif accepted:
                    want = seen.cell
                elif persona == "anonymous" and not _is_api(route) and row is not None:
                    want = "401" if row.cells[index] == "401" else "405"
                else:
                    want = "405"
                changed = seen.writes and (method == "GET" or seen.cell != "ok")
                if seen.cell != want or changed:
                    problems.append(
                        f"  {method} {url} as {persona}{' (htmx)' if hx else ''}: got "
                        f"{seen.cell}, want {want}"
                        + (f"; it wrote {', '.join(seen.writes)}" if changed else "")
                    )
    return problems


def observed_row(route: Route, world: World, routes: dict[str, Route]) -> Row:
    """Return the row the route answers today (signed-in, without htmx), to review and paste."""
    cells: dict[str, list[str]] = {}
    for method, accepted in methods_of(route, routes):
        if accepted:
            url = url_of(route, world)
            body = BODIES[route.key](world) if route.key in BODIES else None
            cells[method] = [
                send(_client(p, world, route, None, False), method, url, body).cell
                for p in PERSONAS
            ]
    first = next(iter(cells.values()))
    post = cells.get("POST")
    return Row(route.key, tuple(first), post=tuple(post) if post and post != first else None)


# The tests -----------------------------------------------------------------------------------

ROUTES = {route.key: route for route in all_routes()}


def test_every_route_is_in_the_matrix(world: World) -> None:
    missing = [ROUTES[key] for key in ROUTES if key not in MATRIX]
    lines = [format_row(observed_row(route, world, ROUTES)) for route in missing]
    assert not missing, (
        "Routes with no line in the authorization matrix. Add each line to TABLE in "
        "tests/casehub/authz_matrix.py; these are what the routes answer today (anonymous, "
        "analyst, second analyst, officer, supervisor, auditor, admin, outsider), so check "
        "every cell against what the role may do before pasting:\n" + "\n".join(lines)
    )


def test_the_matrix_names_only_routes_that_exist() -> None:
    stale = sorted(MATRIX.keys() - ROUTES.keys())
    assert not stale, f"Lines for routes the URLconf no longer has; remove them: {stale}"


@pytest.mark.scenario("W2")
@pytest.mark.parametrize("key", sorted(MATRIX.keys() & ROUTES.keys()))
def test_each_route_answers_each_persona_as_the_matrix_says(key: str, world: World) -> None:
    problems = observe(ROUTES[key], MATRIX[key], world, ROUTES)
    assert not problems, (
        f"{key} does not answer as its line in tests/casehub/authz_matrix.py says:\n"
        f"  {format_row(MATRIX[key])}\n" + "\n".join(problems)
    )
