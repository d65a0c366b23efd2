"""The JSON API: tokens, agents, cases and plans, with every role's view of them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts import tokens as api_tokens
from accounts.models import ApiToken
from audit.models import AuditEvent
from observability.metrics import EventCount
from planning.models import Agent, Case, CaseStatus, NodeStatus, PlanNode, PlanVersion, Strategy
from tests import personas

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # Personas hash a password each; the production hasher costs a second per test here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


INVOICE_CASE = {
    "title": "Check INV-1042",
    "goal": "Verify invoice INV-1042 before it is paid",
    "description": "Supplier sent it twice?",
    "inputs": {"invoice_id": "INV-1042"},
    "domain": "invoice",
    "strategy": "static",
    "max_depth": 2,
}


def _client(user: Any | None = None, *, token: str | None = None) -> Client:
    if user is not None:
        token = api_tokens.issue_api_token(user)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return Client(headers=headers)


def _case(submitter: Any, **fields: Any) -> Case:
    values = {
        "title": "A case",
        "goal": "Find out",
        "strategy": Strategy.LLM,
        "domain": "",
        "submitter": submitter,
        **fields,
    }
    return Case.objects.create(**values)


def _plan(case: Case, leaves: int = 2) -> PlanVersion:
    """Store a plan directly: a root compound over `leaves` leaves, each after the previous."""
    version = PlanVersion.objects.create(
        case=case,
        number=3,
        strategy=case.strategy,
        content_hash="ab" * 32,
        warnings=["dropped one entry"],
        llm_calls=4,
        leaf_count=leaves,
    )
    root = PlanNode.objects.create(
        version=version,
        key="root",
        position=0,
        kind=PlanNode.Kind.COMPOUND,
        name="Investigate",
        description="The whole goal",
        provenance={"strategy": "llm", "source": "llm:1", "depth": 0},
    )
    PlanNode.objects.bulk_create(
        [
            PlanNode(
                version=version,
                key=f"step-{i}",
                parent=root,
                position=i,
                depth=1,
                kind=PlanNode.Kind.LEAF,
                name=f"Step {i}",
                agent="analyst-llm",
                task=f"Do step {i}",
                rationale=f"Because {i}",
                depends_on=[f"step-{i - 1}"] if i > 1 else [],
                provenance={"strategy": "llm", "source": "llm:2", "depth": 1},
                status=NodeStatus.PENDING,
            )
            for i in range(1, leaves + 1)
        ]
    )
    Case.objects.filter(pk=case.pk).update(
        current_version=version, status=CaseStatus.AWAITING_APPROVAL
    )
    return version


def _post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, body, content_type="application/json")


# Tokens and authentication ------------------------------------------------------------------


def test_a_token_is_issued_for_good_credentials_and_authenticates_requests() -> None:
    personas.analyst()
    response = _post(
        Client(), "/api/auth/token", {"username": "ana", "password": personas.PASSWORD}
    )
    assert response.status_code == 200
    token = response.json()["token"]
    assert ApiToken.objects.filter(user__username="ana").count() == 1
    assert AuditEvent.objects.filter(action="auth.token.issued", actor_label="ana").exists()
    assert _client(token=token).get("/api/cases").status_code == 200


def test_bad_credentials_get_401_json_no_token_and_an_audited_failure() -> None:
    personas.analyst()
    failures = AuditEvent.objects.filter(action="auth.login.failed").count()
    response = _post(Client(), "/api/auth/token", {"username": "ana", "password": "wrong"})
    assert response.status_code == 401
    assert response.json() == {"message": "Invalid username or password."}
    assert not ApiToken.objects.exists()
    failed = AuditEvent.objects.filter(action="auth.login.failed")
    assert failed.count() == failures + 1
    assert failed.last().data["username"] == "ana"


def test_inactive_users_get_no_token_and_their_old_tokens_stop_working() -> None:
    user = personas.analyst()
    client = _client(user)
    user.is_active = False
    user.save(update_fields=["is_active"])
    response = _post(
        Client(), "/api/auth/token", {"username": "ana", "password": personas.PASSWORD}
    )
    assert response.status_code == 401
    assert client.get("/api/cases").status_code == 401


def test_a_token_request_without_a_password_is_a_422_naming_the_field() -> None:
    response = _post(Client(), "/api/auth/token", {"username": "ana"})
    assert response.status_code == 422
    assert response.json()["fields"] == {"password": ["Field required"]}


ENDPOINTS = [
    ("get", "/api/agents"),
    ("get", "/api/cases"),
    ("post", "/api/cases"),
    ("get", "/api/cases/1"),
    ("get", "/api/cases/1/plan"),
]


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Bearer "},
        {"Authorization": "Token abc"},
    ],
    ids=["no token", "bad token", "empty token", "wrong scheme"],
)
def test_requests_without_a_valid_token_get_401_json_not_a_login_redirect(
    method: str, url: str, headers: dict[str, str]
) -> None:
    before = Case.objects.count()
    response = getattr(Client(headers=headers), method)(
        url, INVOICE_CASE, content_type="application/json"
    )
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")
    assert "Bearer" in response.json()["message"]
    assert response["WWW-Authenticate"] == "Bearer"
    assert Case.objects.count() == before


def test_a_session_login_is_not_enough_for_the_api() -> None:
    client = Client()
    client.force_login(personas.officer())
    assert client.get("/api/cases").status_code == 401


def test_unknown_api_paths_and_wrong_methods_answer_in_json() -> None:
    client = _client(personas.analyst())
    for url in ("/api/nothing-here", "/api/", "/api/cases/abc", "/api/cases/a%0Ab", "/api/x%0A"):
        missing = client.get(url)
        assert missing.status_code == 404, url
        assert "message" in missing.json()
    not_allowed = client.get("/api/auth/token")
    assert not_allowed.status_code == 405
    assert set(not_allowed["Allow"].split(", ")) == {"POST", "DELETE"}
    assert "POST" in not_allowed.json()["message"]


# Agents -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [personas.analyst, personas.officer, personas.auditor, personas.admin]
)
def test_every_role_lists_the_agents(make: Any) -> None:
    Agent.objects.create(
        slug="zz-reviewer",
        name="Reviewer",
        kind=Agent.Kind.HUMAN,
        capabilities=["review"],
        trust=0.75,
        enabled=False,
    )
    response = _client(make()).get("/api/agents?limit=200")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == Agent.objects.count()
    assert len(body["items"]) == body["count"]
    assert body["items"][-1] == {
        "slug": "zz-reviewer",
        "name": "Reviewer",
        "description": "",
        "kind": "human",
        "capabilities": ["review"],
        "trust": 0.75,  # no outcomes yet: the learned trust is the starting one
        "starting_trust": 0.75,
        "enabled": False,
    }
    assert {item["kind"] for item in body["items"]} <= {"tool", "llm", "human"}


def test_outsiders_cannot_list_agents() -> None:
    response = _client(personas.outsider()).get("/api/agents")
    assert response.status_code == 403
    assert response.json() == {"message": "Your account has no CaseHub role."}


def test_agents_are_paginated() -> None:
    total = Agent.objects.count()
    assert total >= 3
    body = _client(personas.analyst()).get("/api/agents?limit=2&offset=1").json()
    assert body["count"] == total
    slugs = list(Agent.objects.order_by("slug").values_list("slug", flat=True))
    assert [item["slug"] for item in body["items"]] == slugs[1:3]


# Creating cases -----------------------------------------------------------------------------


def test_an_analyst_submits_a_case_and_its_planning_is_enqueued_not_run(
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planning import dispatch

    enqueued: list[object] = []
    monkeypatch.setattr(dispatch, "_send", lambda name, *args: enqueued.append((name, *args)))
    client = _client(personas.analyst())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _post(client, "/api/cases", INVOICE_CASE)
    assert response.status_code == 201
    body = response.json()
    case = Case.objects.get()
    assert body["id"] == case.pk
    assert body["status"] == "planning"
    assert body["submitter"] == "ana"
    assert body["domain"] == "invoice"
    assert body["strategy"] == "static"
    assert body["inputs"]["invoice_id"] == "INV-1042"
    assert body["plan_version"] is None
    assert body["error"] is None
    assert AuditEvent.objects.filter(
        action="planning.case.submitted", chain=f"case:{case.pk}"
    ).exists()
    # Nothing planned yet: the task waits for the commit.
    assert not PlanVersion.objects.exists()
    assert enqueued == []
    callbacks = [c for c in callbacks if not isinstance(c, EventCount)]  # metrics count too
    assert len(callbacks) == 1
    callbacks[0]()
    assert enqueued == [("planning.plan_case", case.pk)]


def test_a_case_without_a_domain_is_accepted_for_llm_planning(
    django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # configured; nothing is planned here
    client = _client(personas.analyst())
    body = {"title": "Outage", "goal": "Find why checkout is slow", "strategy": "hybrid"}
    with django_capture_on_commit_callbacks(execute=False):
        response = _post(client, "/api/cases", body)
    assert response.status_code == 201
    assert response.json()["domain"] is None
    assert response.json()["max_depth"] == 2


@pytest.mark.parametrize("make", [personas.officer, personas.auditor, personas.admin])
def test_only_analysts_submit_cases(make: Any) -> None:
    client = _client(make())
    events = AuditEvent.objects.count()
    response = _post(client, "/api/cases", INVOICE_CASE)
    assert response.status_code == 403
    assert response.json() == {"message": "Only analysts submit cases."}
    assert not Case.objects.exists()
    # Nothing is written but the record of the denial itself.
    new = AuditEvent.objects.order_by("id")[events:]
    assert [(e.action, e.data["kind"]) for e in new] == [("security.access.denied", "forbidden")]


INVALID_CASES = [
    pytest.param({"domain": "astrology"}, {"domain"}, id="unknown domain"),
    pytest.param({"inputs": {"invoice_id": "1042"}}, {"inputs.invoice_id"}, id="bad inputs"),
    pytest.param(
        {"inputs": {"invoice_id": "INV-1042", "rush": True}}, {"inputs.rush"}, id="extra input"
    ),
    pytest.param({"inputs": {}}, {"inputs.invoice_id"}, id="missing input"),
    pytest.param({"domain": None}, {"domain"}, id="static strategy without domain"),
    pytest.param({"max_depth": 0}, {"max_depth"}, id="max_depth 0"),
    pytest.param({"max_depth": 9}, {"max_depth"}, id="max_depth 9"),
    pytest.param({"strategy": "magic"}, {"strategy"}, id="unknown strategy"),
    pytest.param({"title": ""}, {"title"}, id="empty title"),
    pytest.param({"title": "   "}, {"title"}, id="blank title"),
    pytest.param({"goal": None}, {"goal"}, id="null goal"),
    pytest.param({"inputs": [1, 2]}, {"inputs"}, id="inputs not an object"),
]


@pytest.mark.parametrize(("changes", "fields"), INVALID_CASES)
def test_an_invalid_case_is_a_422_naming_its_fields_and_writes_nothing(
    changes: dict[str, Any], fields: set[str], django_capture_on_commit_callbacks: Any
) -> None:
    client = _client(personas.analyst())
    cases, events = Case.objects.count(), AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _post(client, "/api/cases", {**INVOICE_CASE, **changes})
    assert response.status_code == 422
    body = response.json()
    assert set(body) == {"message", "fields"}
    assert body["message"]
    assert set(body["fields"]) == fields
    assert all(body["fields"][name] and all(body["fields"][name]) for name in fields)
    assert Case.objects.count() == cases
    assert AuditEvent.objects.count() == events
    assert callbacks == []


def test_a_body_that_is_not_json_is_rejected_in_json() -> None:
    client = _client(personas.analyst())
    response = client.post("/api/cases", "{not json", content_type="application/json")
    assert response.status_code in {400, 422}
    assert "message" in response.json()
    assert not Case.objects.exists()


# Reading cases ------------------------------------------------------------------------------


@pytest.fixture
def two_analysts_cases(db: None) -> dict[str, Any]:
    ana, bob = personas.analyst("ana"), personas.analyst("bob")
    return {
        "ana": ana,
        "bob": bob,
        "ana_case": _case(ana, title="Ana's", domain="invoice", strategy=Strategy.STATIC),
        "ana_failed": _case(ana, title="Ana's failed", status=CaseStatus.PLAN_FAILED, error="no"),
        "bob_case": _case(bob, title="Bob's"),
    }


def _ids(response: Any) -> set[int]:
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == len(body["items"])
    return {item["id"] for item in body["items"]}


def test_an_analyst_lists_only_their_own_cases(two_analysts_cases: dict[str, Any]) -> None:
    c = two_analysts_cases
    ids = _ids(_client(c["ana"]).get("/api/cases"))
    assert ids == {c["ana_case"].pk, c["ana_failed"].pk}


@pytest.mark.parametrize("make", [personas.officer, personas.auditor])
def test_officers_and_auditors_list_every_case(
    make: Any, two_analysts_cases: dict[str, Any]
) -> None:
    assert _ids(_client(make()).get("/api/cases")) == set(Case.objects.values_list("pk", flat=True))


@pytest.mark.parametrize("make", [personas.outsider, personas.admin])
def test_users_without_case_access_list_nothing(
    make: Any, two_analysts_cases: dict[str, Any]
) -> None:
    assert _ids(_client(make()).get("/api/cases")) == set()


def test_the_case_list_filters_by_status_and_domain(two_analysts_cases: dict[str, Any]) -> None:
    c = two_analysts_cases
    client = _client(personas.officer())
    assert _ids(client.get("/api/cases?status=plan_failed")) == {c["ana_failed"].pk}
    assert _ids(client.get("/api/cases?domain=invoice")) == {c["ana_case"].pk}
    assert _ids(client.get("/api/cases?status=planning&domain=invoice")) == {c["ana_case"].pk}
    bad = client.get("/api/cases?status=sleeping")
    assert bad.status_code == 422
    assert list(bad.json()["fields"]) == ["status"]


def test_the_case_list_is_newest_first_and_paginated(two_analysts_cases: dict[str, Any]) -> None:
    body = _client(personas.officer()).get("/api/cases?limit=2&offset=0").json()
    assert body["count"] == 3
    expected = list(Case.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    assert [item["id"] for item in body["items"]] == expected[:2]


def test_an_analyst_reads_their_case_with_its_fields(two_analysts_cases: dict[str, Any]) -> None:
    c = two_analysts_cases
    _plan(c["ana_case"])
    response = _client(c["ana"]).get(f"/api/cases/{c['ana_case'].pk}")
    assert response.status_code == 200
    body = response.json()
    assert {
        "id",
        "title",
        "goal",
        "status",
        "domain",
        "strategy",
        "max_depth",
        "submitter",
        "created_at",
        "error",
        "plan_version",
    } <= set(body)
    assert body["status"] == "awaiting_approval"
    assert body["plan_version"] == 3
    assert body["submitter"] == "ana"
    assert body["error"] is None


def test_a_failed_case_shows_its_error(two_analysts_cases: dict[str, Any]) -> None:
    c = two_analysts_cases
    body = _client(c["ana"]).get(f"/api/cases/{c['ana_failed'].pk}").json()
    assert body["status"] == "plan_failed"
    assert body["error"] == "no"
    assert body["plan_version"] is None


@pytest.mark.parametrize("suffix", ["", "/plan"])
def test_another_analysts_case_is_404_never_403(
    suffix: str, two_analysts_cases: dict[str, Any]
) -> None:
    c = two_analysts_cases
    _plan(c["bob_case"])
    for user in (c["ana"], personas.outsider(), personas.admin()):
        response = _client(user).get(f"/api/cases/{c['bob_case'].pk}{suffix}")
        assert response.status_code == 404
        assert response.json() == {"message": "No such case"}
    # The same answer as for a case that does not exist at all.
    missing = _client(c["ana"]).get(f"/api/cases/{Case.objects.count() + 100}{suffix}")
    assert missing.json() == {"message": "No such case"}


@pytest.mark.parametrize("make", [personas.officer, personas.auditor])
@pytest.mark.parametrize("suffix", ["", "/plan"])
def test_officers_and_auditors_read_any_case_and_plan(
    make: Any, suffix: str, two_analysts_cases: dict[str, Any]
) -> None:
    c = two_analysts_cases
    _plan(c["bob_case"])
    assert _client(make()).get(f"/api/cases/{c['bob_case'].pk}{suffix}").status_code == 200


# Plans --------------------------------------------------------------------------------------


def test_the_plan_lists_its_version_and_nodes(two_analysts_cases: dict[str, Any]) -> None:
    c = two_analysts_cases
    version = _plan(c["ana_case"], leaves=2)
    response = _client(c["ana"]).get(f"/api/cases/{c['ana_case'].pk}/plan")
    assert response.status_code == 200
    body = response.json()
    assert body["version"] == 3
    assert body["content_hash"] == version.content_hash
    assert body["warnings"] == ["dropped one entry"]
    assert body["llm_calls"] == 4
    root, first, second = body["nodes"]
    assert root["id"] == "root"
    assert root["parent"] is None
    assert root["kind"] == "compound"
    assert root["name"] == "Investigate"
    assert first == {
        "id": "step-1",
        "parent": "root",
        "kind": "leaf",
        "name": "Step 1",
        "description": "",
        "task": "Do step 1",
        "agent": "analyst-llm",
        "rationale": "Because 1",
        "tool": None,
        "inputs": {},
        "depends_on": [],
        "status": "pending",
        "risk": None,
        "gate": None,
        "provenance": {"strategy": "llm", "source": "llm:2", "depth": 1},
        # Not run yet: the execution fields are empty.
        "attempts": 0,
        "started_at": None,
        "finished_at": None,
        "output": None,
        "error": None,
        "error_class": None,
        "finished_after_cancel": False,
        "routing": None,
    }
    assert second["depends_on"] == ["step-1"]


def test_a_case_without_a_plan_says_so_in_a_404(two_analysts_cases: dict[str, Any]) -> None:
    c = two_analysts_cases
    response = _client(c["ana"]).get(f"/api/cases/{c['ana_case'].pk}/plan")
    assert response.status_code == 404
    assert response.json() == {
        "message": f"Case {c['ana_case'].pk} has no plan yet (status: planning)."
    }


def test_an_unexpected_error_is_a_json_500(monkeypatch: pytest.MonkeyPatch) -> None:
    from planning import api

    def broken(user: Any) -> Any:
        raise RuntimeError("database on fire")

    monkeypatch.setattr(api, "visible_cases", broken)
    response = _client(personas.officer()).get("/api/cases")
    assert response.status_code == 500
    body = response.json()
    assert body["message"] == f"Internal server error (error id {body['error_id']})."


# Query counts -------------------------------------------------------------------------------


def _queries(client: Client, url: str) -> int:
    client.get(url)  # the first use of a token records last_used_at; measure the steady state
    with CaptureQueriesContext(connection) as context:
        response = client.get(url)
    assert response.status_code == 200
    return len(context.captured_queries)


def test_the_case_list_runs_a_constant_number_of_queries() -> None:
    ana, officer = personas.analyst(), personas.officer()
    clients = {"analyst": _client(ana), "officer": _client(officer)}
    for case in (_case(ana), _case(ana)):
        _plan(case)
    small = {role: _queries(client, "/api/cases?limit=200") for role, client in clients.items()}
    Case.objects.bulk_create(
        [
            Case(title=f"Case {i}", goal="g", strategy=Strategy.LLM, submitter=ana)
            for i in range(1000)
        ]
    )
    cases = list(Case.objects.filter(current_version__isnull=True)[:150])
    versions = PlanVersion.objects.bulk_create(
        [PlanVersion(case=case, number=1, strategy="llm", content_hash="0" * 64) for case in cases]
    )
    for case, version in zip(cases, versions, strict=True):
        case.current_version = version
    Case.objects.bulk_update(cases, ["current_version"])
    for role, client in clients.items():
        assert _queries(client, "/api/cases?limit=200") == small[role], role
        assert _queries(client, "/api/cases?limit=200&status=planning") == small[role], role
    assert small["officer"] <= 6
    body = clients["analyst"].get("/api/cases?limit=200").json()
    assert body["count"] == 1002
    assert sum(item["plan_version"] is not None for item in body["items"]) > 100


def test_the_agent_list_runs_a_constant_number_of_queries() -> None:
    client = _client(personas.analyst())
    small = _queries(client, "/api/agents?limit=200")
    Agent.objects.bulk_create(
        [Agent(slug=f"agent-{i}", name=f"Agent {i}", kind=Agent.Kind.TOOL) for i in range(150)]
    )
    assert _queries(client, "/api/agents?limit=200") == small


def test_the_plan_runs_a_constant_number_of_queries() -> None:
    ana = personas.analyst()
    client = _client(ana)
    small_case, large_case = _case(ana), _case(ana)
    _plan(small_case, leaves=2)
    _plan(large_case, leaves=500)
    small = _queries(client, f"/api/cases/{small_case.pk}/plan")
    assert _queries(client, f"/api/cases/{large_case.pk}/plan") == small
    assert small <= 6
    assert len(client.get(f"/api/cases/{large_case.pk}/plan").json()["nodes"]) == 501


# OpenAPI and the docs page ------------------------------------------------------------------


def test_the_openapi_document_describes_every_endpoint_and_bearer_auth() -> None:
    response = _client(personas.analyst()).get("/api/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    assert set(paths) >= {
        "/api/auth/token",
        "/api/agents",
        "/api/cases",
        "/api/cases/{case_id}",
        "/api/cases/{case_id}/plan",
    }
    assert "post" in paths["/api/auth/token"]
    assert {"get", "post"} <= set(paths["/api/cases"])
    assert "security" not in paths["/api/auth/token"]["post"]
    assert paths["/api/cases"]["get"]["security"] == [{"BearerToken": []}]
    assert schema["components"]["securitySchemes"]["BearerToken"]["scheme"] == "bearer"
    assert not any("{path" in path or "rest" in path for path in paths)


def test_the_docs_page_loads_only_local_assets_under_the_csp() -> None:
    client = Client()
    client.force_login(personas.analyst())  # the docs are for signed-in users
    response = client.get("/api/docs")
    assert response.status_code == 200
    html = response.content.decode()
    csp = response["Content-Security-Policy"]
    assert "'unsafe-inline'" not in csp
    assert "script-src 'self' 'wasm-unsafe-eval'" in csp
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    assert any(a.endswith("swagger-ui.css") for a in assets)
    for asset in assets:
        assert asset.startswith("/static/"), asset
        served = client.get(asset)
        assert served.status_code == 200, asset
        b"".join(served.streaming_content if served.streaming else [served.content])
    # Nothing inline the CSP would block: scripts either load a file or carry JSON data.
    for attrs, body in re.findall(r"<script([^>]*)>(.*?)</script>", html, flags=re.S):
        assert 'src="/static/' in attrs or 'type="application/json"' in attrs, attrs
        if "src=" in attrs:
            assert not body.strip()
    assert "<style" not in html
    assert " style=" not in html
    assert re.search(r"\son[a-z]+=", html) is None
