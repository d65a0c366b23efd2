"""LLM-written plan text stays inert on every page that shows it, in a real browser
(RELIABILITY L7): no dialog, no request the page did not mean to make, no CSP violation.

The plan is made through the real actions: an LLM-planned case (the fake OpenAI server answers
with hostile text in every free-text field), an officer's edit of a step's task and inputs
(`edit_plan`), and a stored version whose step has a hostile expected output. Each page of PAGES
is opened, its htmx parts load, its <details> open; a page added later (the work item, say) is
one more entry in PAGES.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import override_settings

from execution.models import WorkItem
from oversight.actions.edits import edit_plan
from oversight.actions.opening import open_gates
from oversight.models import Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.core.dag import DagPlan
from planning.core.tree import Compound, Leaf, Node
from planning.models import Case, PlanNode
from planning.versions import load_plan, store_version
from tests import personas
from tests.browser.test_case_flow import _log_in
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Each would run script, load something or send a request if it were markup instead of text.
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
HTMX_POST = '<b hx-post="/logout/" hx-trigger="load">out</b>'
HTMX_GET = "<i hx-get=/logout/ hx-trigger=load hx-target=body>get</i>"
QUOTES = "\"'><svg onload=alert(1)>"
JS_LINK = "javascript:alert(1)"
MD_LINK = "[details](javascript:alert(1)) [x](http://127.0.0.1:9/steal)"
HOSTILE = " ".join([SCRIPT, IMG, HTMX_POST, HTMX_GET, QUOTES, JS_LINK, MD_LINK])
# The sub-goal's name is shorter (at most 120 characters); its marker tells the fake model's
# second level apart from the first.
SUBGOAL = f"Sub Z9 {SCRIPT}{IMG}"

# Registered before any page script runs (init scripts are not subject to the page's CSP).
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""
# Elements that only hostile text turned into markup would create.
INJECTED = (
    "img[src='x'], [onerror], [onload], svg [onload], [hx-post='/logout/'], "
    "[hx-get='/logout/'], a[href^='javascript:'], a[href*='127.0.0.1:9']"
)


def hostile_model(request: RecordedRequest) -> str:
    """A model that writes hostile markup into every field it fills."""
    if "Goal: Sub Z9" in request.user_prompt:
        steps: list[dict[str, Any]] = [
            {
                "id": "deep",
                "agent": "fraud-analyst",
                "task": f"Deep {HOSTILE}"[:300],
                "rationale": f"Because {HOSTILE}"[:300],
                "depends_on": [],
            }
        ]
    else:
        steps = [
            {
                "id": "review",
                "agent": "fraud-analyst",
                "task": f"Review {HOSTILE}"[:300],
                "rationale": f"Why {HOSTILE}"[:300],
                "depends_on": [],
            },
            {
                "id": "sub",
                "subtask": SUBGOAL,
                "description": f"Described as {HOSTILE}",
                "depends_on": ["review"],
            },
        ]
    return json.dumps({"steps": steps})


def _with_expected_output(case: Case, key: str, text: str) -> None:
    """Store the case's plan again with one leaf's expected output set; open its gates."""
    assert case.current_version is not None
    plan = load_plan(case.current_version)

    def walk(node: Node) -> Node:
        if isinstance(node, Leaf):
            return dataclasses.replace(node, expected_output=text) if node.key == key else node
        return dataclasses.replace(node, children=tuple(walk(c) for c in node.children))

    root = walk(plan.root)
    assert isinstance(root, Compound)
    version = store_version(
        case, DagPlan.build(root, warnings=plan.warnings, llm_calls=plan.llm_calls)
    )
    case.current_version = version
    case.save(update_fields=["current_version"])
    open_gates(version)


def hostile_case(fake_openai: FakeOpenAIServer, analyst: Any, officer: Any) -> Case:
    """Plan a case whose every text field the model or the analyst filled is hostile markup."""
    fake_openai.responder = hostile_model
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        case = submit_case(
            submitter=analyst,
            title=f"Title {SCRIPT}{IMG}",
            goal=f"Goal {HTMX_POST}",
            description=f"Description {HOSTILE}",
            inputs={IMG: HOSTILE, "link": MD_LINK, "nested": {SCRIPT: [JS_LINK, HTMX_GET]}},
            domain="",
            strategy="llm",
            max_depth=2,
        )
        materialise_plan(case.pk)
    case.refresh_from_db()
    edit_plan(
        case_id=case.pk,
        user=officer,
        node_key="review",
        changes={"task": f"Edited {HOSTILE}"[:300], "inputs": {IMG: HOSTILE, "x": JS_LINK}},
        reason_code="other",
        reason=f"Reason {HOSTILE}",
    )
    case.refresh_from_db()
    _with_expected_output(case, "sub.deep", f"Output {SCRIPT}{IMG}")  # at most 100 characters
    case.refresh_from_db()
    return case


# Pages ----------------------------------------------------------------------------------------
# (who looks, the page's URL) for a case; the step panel's URL also opens the page with it.


def _node(case: Case, key: str) -> PlanNode:
    return PlanNode.objects.get(version=case.current_version, key=key)


def _gate(case: Case, kind: str) -> Gate:
    return Gate.objects.get(version=case.current_version, kind=kind, status=GateStatus.PENDING)


def _work_item(case: Case) -> str:
    """Give the hostile step to the officers as an open work item; return its page's URL."""
    from datetime import timedelta

    from django.contrib.auth.models import Group
    from django.utils import timezone

    from accounts.roles import OFFICER

    now = timezone.now()
    item, _ = WorkItem.objects.get_or_create(
        node=_node(case, "review"),
        attempt=1,
        defaults={
            "case": case,
            "group": Group.objects.get(name=OFFICER),
            "created_at": now,
            "deadline": now + timedelta(days=1),
        },
    )
    return f"/work-items/{item.pk}/"


PAGES: list[tuple[str, str, Callable[[Case], str]]] = [
    ("officer", "case list", lambda case: "/cases/"),
    ("officer", "case page", lambda case: f"/cases/{case.pk}/"),
    ("officer", "step panel", lambda case: f"/cases/{case.pk}/nodes/{_node(case, 'review').pk}/"),
    ("officer", "deep step", lambda case: f"/cases/{case.pk}/nodes/{_node(case, 'sub.deep').pk}/"),
    ("officer", "plan gate", lambda case: f"/gates/{_gate(case, GateKind.PLAN).pk}/"),
    ("officer", "step gate", lambda case: f"/gates/{_gate(case, GateKind.STEP).pk}/"),
    ("officer", "inbox", lambda case: "/inbox/"),
    ("officer", "home", lambda case: "/"),
    ("officer", "version history", lambda case: f"/cases/{case.pk}/versions/"),
    ("officer", "diff v1 to v2", lambda case: f"/cases/{case.pk}/versions/diff/?from=1&to=2"),
    ("officer", "diff v2 to v3", lambda case: f"/cases/{case.pk}/versions/diff/"),
    (
        "officer",
        "edit form",
        lambda case: f"/cases/{case.pk}/nodes/{_node(case, 'review').pk}/edit/",
    ),
    ("officer", "work item", _work_item),
    ("officer", "work items", lambda case: "/work-items/"),
    ("officer", "case execution", lambda case: f"/cases/{case.pk}/execution/"),
    ("auditor", "case trail", lambda case: f"/audit/cases/{case.pk}/"),
    ("auditor", "audit list", lambda case: "/audit/"),
    ("auditor", "home", lambda case: "/"),
]


class Watch:
    """What a page did that hostile text could have caused."""

    def __init__(self, page: Any, origin: str) -> None:
        self.origin = origin
        self.problems: list[str] = []
        self.current = ""
        page.on("dialog", self._dialog)
        page.on("request", self._request)
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"{self.current}: {error}"))

    def _dialog(self, dialog: Any) -> None:
        self.problems.append(f"{self.current}: dialog {dialog.message!r}")
        dialog.dismiss()

    def _request(self, request: Any) -> None:
        url = urlsplit(request.url)
        if f"{url.scheme}://{url.netloc}" != self.origin:
            if url.scheme not in {"data", "blob"}:
                self.problems.append(f"{self.current}: request to {request.url}")
            return
        expected = url.path.startswith(
            ("/static/", "/cases/", "/gates/", "/audit/", "/inbox/", "/work-items/")
        )
        if (request.method, url.path) == ("POST", "/login/") and self.current == "login":
            return
        if (
            request.method != "GET"
            or url.path.startswith("/logout")
            or not (expected or url.path in {"/", "/favicon.ico", "/login/"})
        ):
            self.problems.append(f"{self.current}: {request.method} {request.url}")
        elif url.path.rstrip("/").endswith("/x"):  # <img src=x> resolved against the page
            self.problems.append(f"{self.current}: image request {request.url}")

    def _console(self, message: Any) -> None:
        text = message.text
        if "Content Security Policy" in text or (
            message.type == "error" and not text.startswith("Failed to load resource")
        ):
            self.problems.append(f"{self.current}: console {message.type}: {text}")


def _visit(page: Any, watch: Watch, name: str, url: str) -> str:
    watch.current = name
    response = page.goto(url)
    assert response is not None and response.status == 200, (name, url)
    page.wait_for_load_state("networkidle")
    # Open every <details> (the trail's data and hashes, long texts) so that all text renders.
    page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
    page.wait_for_load_state("networkidle")
    injected = page.evaluate(f"[...document.querySelectorAll({INJECTED!r})].map(e => e.outerHTML)")
    assert injected == [], (name, injected)
    stray = page.evaluate(
        "[...document.scripts].filter(s => !s.src || s.text.includes('alert')).length"
    )
    assert stray == 0, name
    violations = page.evaluate("window.__cspViolations")
    assert violations == [], (name, violations)
    return page.inner_text("body")


@pytest.mark.scenario("L7")
def test_hostile_plan_text_is_inert_on_every_page_that_shows_it(
    page: Any, live_server: Any, fake_openai: FakeOpenAIServer
) -> None:
    people = {"officer": personas.officer(), "auditor": personas.auditor()}
    case = hostile_case(fake_openai, personas.analyst(), people["officer"])
    assert case.current_version is not None and case.current_version.number == 3
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.add_init_script(RECORD_VIOLATIONS)
    watch = Watch(page, live_server.url)
    shown: dict[str, str] = {}
    for who in ("officer", "auditor"):
        page.context.clear_cookies()
        watch.current = "login"
        _log_in(page, people[who].username)
        for viewer, name, url_of in PAGES:
            if viewer == who:
                shown[f"{who}: {name}"] = _visit(page, watch, f"{who}: {name}", url_of(case))

    # The step panel through htmx, as a reviewer opens it from the task table.
    page.context.clear_cookies()
    watch.current = "login"
    _log_in(page, people["officer"].username)
    watch.current = "officer: step panel via htmx"
    page.goto(f"/cases/{case.pk}/")
    page.click('[data-key="sub.deep"] a')
    page.wait_for_selector("#node-panel >> text=Deep")
    page.wait_for_load_state("networkidle")
    assert "Deep " + SCRIPT in page.inner_text("#node-panel")
    assert page.evaluate(f"document.querySelectorAll({INJECTED!r}).length") == 0
    assert page.evaluate("window.__cspViolations") == []

    assert watch.problems == [], "\n".join(watch.problems)
    # Every hostile field was on screen as text somewhere (else nothing was tested).
    everything = "\n".join(shown.values())
    for text in (
        f"Title {SCRIPT}{IMG}",
        f"Goal {HTMX_POST}",
        "Review " + SCRIPT,
        "Why " + SCRIPT,
        "Edited " + SCRIPT,
        "Deep " + SCRIPT,
        "Because " + SCRIPT,
        "Described as " + SCRIPT,
        "Output " + SCRIPT,
        "Reason " + SCRIPT,
        SUBGOAL,
        MD_LINK,
    ):
        assert text in everything, text
    assert f"Edited {SCRIPT}" in shown["officer: diff v1 to v2"]
    assert f"Output {SCRIPT}" in shown["officer: diff v2 to v3"]
    assert "Edited " + SCRIPT in shown["auditor: case trail"]
