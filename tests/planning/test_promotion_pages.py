"""The promotion pages: the link on the step panel, the proposal form, the methods list, the
method page with approve, reject and retire, and what the next case's page says."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from planning.models import PlanNode, PromotedMethod
from planning.promotion.methods import method_hash
from tests import personas
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.promotion_flow import UNKNOWN_KIND, incident, llm, model, run_to_end

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _root(case: Any) -> PlanNode:
    return PlanNode.objects.get(version_id=case.current_version_id, parent=None)


def _promote_url(case: Any) -> str:
    return reverse("planning:node-promote", args=[case.pk, _root(case).pk])


@pytest.fixture
def executed(fake_openai: FakeOpenAIServer, analyst: Any, officer: Any) -> Any:
    fake_openai.responder = model
    with llm(fake_openai):
        case = incident(analyst)
        return run_to_end(case, officer, personas.analyst("bea"))


def test_an_officer_promotes_from_the_step_panel_and_a_second_officer_approves(
    executed: Any,
    fake_openai: FakeOpenAIServer,
    analyst: Any,
    officer: Any,
    second_officer: Any,
) -> None:
    case = executed
    root = _root(case)
    panel = _client(officer).get(reverse("planning:node-detail", args=[case.pk, root.pk]))
    assert f'href="{_promote_url(case)}"' in panel.content.decode()
    # The analyst sees no link and may not open the form.
    own = _client(analyst).get(reverse("planning:node-detail", args=[case.pk, root.pk]))
    assert 'data-action="promote"' not in own.content.decode()
    assert _client(analyst).get(_promote_url(case)).status_code == 403

    form = _client(officer).get(_promote_url(case))
    page = form.content.decode()
    assert form.status_code == 200
    assert '<option value="equals" selected>' in page  # kind, pre-selected
    assert page.count('<option value="equals" selected>') == 1
    assert "incident-commander" in page and "forensic-analyst" in page
    response = _client(officer).post(
        _promote_url(case),
        {"name": "certificate-expiry", "op-kind": "equals", "op-service": ""},
    )
    method = PromotedMethod.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("planning:method-detail", args=[method.pk])
    assert method.guard == [{"key": "kind", "op": "equals", "value": UNKNOWN_KIND}]

    detail = _client(officer).get(response["Location"]).content.decode()
    assert 'data-note="second-person"' in detail and 'id="approve-form"' not in detail
    refused = _client(officer).post(reverse("planning:method-approve", args=[method.pk]))
    assert refused.status_code == 403
    approved = _client(second_officer).post(reverse("planning:method-approve", args=[method.pk]))
    assert approved.status_code == 302
    method.refresh_from_db()
    assert method.status == "active" and method.approved_by == second_officer

    with llm(fake_openai):
        asked = len(fake_openai.requests)
        again = incident(analyst, description="Tonight's certificate.")
        assert len(fake_openai.requests) == asked
    page = _client(officer).get(reverse("planning:case-detail", args=[again.pk])).content.decode()
    assert "promoted method" in page and f"case #{case.pk}</a>: no LLM call" in page
    assert "0 LLM calls" in page
    leaf = PlanNode.objects.get(version_id=again.current_version_id, key="triage")
    panel = _client(officer).get(reverse("planning:node-detail", args=[again.pk, leaf.pk]))
    text = panel.content.decode()
    assert "promoted method certificate-expiry v1 from" in text
    assert f"case #{case.pk}</a>" in text


def test_a_node_that_cannot_be_promoted_says_why(
    fake_openai: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    fake_openai.responder = model
    with llm(fake_openai):
        case = incident(analyst)
    page = _client(officer).get(_promote_url(case))
    assert page.status_code == 200
    assert 'data-notice="not-promotable"' in page.content.decode()
    posted = _client(officer).post(_promote_url(case), {"name": "x", "op-kind": "equals"})
    assert posted.status_code == 409
    assert not PromotedMethod.objects.exists()


def test_a_bad_name_is_refused_with_the_form_kept(executed: Any, officer: Any) -> None:
    response = _client(officer).post(
        _promote_url(executed), {"name": "Not A Slug!", "op-kind": "equals"}
    )
    assert response.status_code == 422
    assert "must be a slug" in response.content.decode()
    assert 'value="Not A Slug!"' in response.content.decode()
    assert not PromotedMethod.objects.exists()


def _stored(case: Any, proposer: Any, name: str, task_text: str = "Triage") -> PromotedMethod:
    body: dict[str, Any] = {
        "pack": "incident",
        "task": "respond-to-incident",
        "name": name,
        "version": 1,
        "description": "",
        "guard": [{"key": "kind", "op": "equals", "value": name}],
        "subtree": [
            {
                "kind": "leaf",
                "key": "triage",
                "agent": "incident-commander",
                "task": task_text,
                "rationale": "",
                "tool": None,
                "inputs": {},
                "depends_on": [],
                "expected_output": None,
                "failure_policy": "abort",
                "risk": None,
            }
        ],
    }
    return PromotedMethod.objects.create(
        **body,
        content_hash=method_hash(**body),
        source_case=case,
        source_version_id=case.current_version_id,
        source_node=_root(case),
        proposed_by=proposer,
    )


def test_the_methods_list_shows_code_and_promoted_methods_in_constant_queries(
    executed: Any, officer: Any, second_officer: Any, django_assert_num_queries: Any
) -> None:
    client = _client(officer)
    _stored(executed, second_officer, "one")
    url = reverse("planning:method-list")
    client.get(url)  # warm the session and the role caches
    with django_assert_num_queries(7) as one:
        page = client.get(url)
    assert 'data-method="database-outage-response"' in page.content.decode()
    assert 'data-method="one"' in page.content.decode()
    for name in ("two", "three", "four"):
        _stored(executed, second_officer, name)
    with django_assert_num_queries(len(one.captured_queries)):
        page = client.get(url)
    assert page.content.decode().count('data-origin="promoted"') == 4
    assert _client(personas.analyst("cid")).get(url).status_code == 403
    assert _client(personas.auditor()).get(url).status_code == 200


def test_text_from_the_model_is_escaped_on_the_method_page(
    executed: Any, officer: Any, second_officer: Any
) -> None:
    method = _stored(executed, second_officer, "hostile", task_text="<script>alert(1)</script>")
    page = _client(officer).get(reverse("planning:method-detail", args=[method.pk]))
    text = page.content.decode()
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_reject_and_retire_need_a_reason_on_the_page(
    executed: Any, officer: Any, second_officer: Any
) -> None:
    method = _stored(executed, officer, "kept")
    client = _client(second_officer)
    assert client.post(reverse("planning:method-reject", args=[method.pk])).status_code == 422
    assert client.post(reverse("planning:method-approve", args=[method.pk])).status_code == 302
    retire = reverse("planning:method-retire", args=[method.pk])
    assert client.post(retire, {"reason": ""}).status_code == 422
    assert client.post(retire, {"reason": "replaced by a runbook"}).status_code == 302
    method.refresh_from_db()
    assert method.status == "retired" and method.retire_reason == "replaced by a runbook"
    page = client.get(reverse("planning:method-list")).content.decode()
    assert "replaced by a runbook" in page
