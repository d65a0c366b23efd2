"""Admin pages for agents, tools and packs: what admins may change, and the audit of each save."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts import roles
from audit.models import AuditEvent
from execution.runners.human import human_group
from planning.catalogue import sync_packs
from planning.models import Agent, DomainPack, Tool
from tests import personas

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(admin_user: Any) -> Client:
    sync_packs()
    client = Client()
    client.force_login(admin_user)
    return client


def agent_form(agent: Agent, **changes: Any) -> dict[str, Any]:
    data = {
        "name": agent.name,
        "description": agent.description,
        "kind": agent.kind,
        "capabilities": '["erp.read"]',
        "tools": '["get_supplier", "check_purchase_order"]',
        "trust": str(agent.trust),
        "model": agent.model,
        "system_prompt": agent.system_prompt,
        "enabled": "on" if agent.enabled else "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


def test_changing_an_agent_writes_its_before_and_after(
    admin_client_: Client, admin_user: Any
) -> None:
    agent = Agent.objects.get(slug="erp-connector")
    url = reverse("admin:planning_agent_change", args=[agent.pk])
    assert admin_client_.get(url).status_code == 200
    response = admin_client_.post(url, agent_form(agent, trust="0.4", model="gpt-test", enabled=""))
    assert response.status_code == 302, response.content.decode()[:2000]
    agent.refresh_from_db()
    assert (agent.trust, agent.model, agent.enabled) == (0.4, "gpt-test", False)
    (event,) = events("config.agent.changed")
    assert event.actor_user == admin_user
    assert event.data == {
        "agent": "erp-connector",
        "changes": {
            "trust": {"before": 0.9, "after": 0.4},
            "model": {"before": "", "after": "gpt-test"},
            "enabled": {"before": True, "after": False},
        },
    }


def test_agent_tools_must_be_registered_tools(admin_client_: Client) -> None:
    agent = Agent.objects.get(slug="erp-connector")
    url = reverse("admin:planning_agent_change", args=[agent.pk])
    response = admin_client_.post(url, agent_form(agent, tools='["rm_rf"]'))
    assert response.status_code == 200
    assert "Unknown tools: rm_rf." in response.content.decode()
    agent.refresh_from_db()
    assert agent.tools == ["get_supplier", "check_purchase_order"]
    assert events("config.agent.changed") == []


def test_a_human_agents_work_item_group_is_chosen_in_the_admin(admin_client_: Client) -> None:
    roles.sync_roles()
    agent = Agent.objects.get(slug="incident-commander")
    assert human_group(agent) == roles.ANALYST
    url = reverse("admin:planning_agent_change", args=[agent.pk])
    form = agent_form(agent, capabilities='["incident.command"]', tools="[]")
    response = admin_client_.post(url, {**form, "work_item_group": roles.OFFICER})
    assert response.status_code == 302, response.content.decode()[:2000]
    agent.refresh_from_db()
    assert human_group(agent) == roles.OFFICER
    (event,) = events("config.agent.changed")
    assert event.data["changes"]["capabilities"]["after"] == [
        "incident.command",
        f"group:{roles.OFFICER}",
    ]
    # The page shows the group chosen, and not again among the capabilities.
    page = admin_client_.get(url).content.decode()
    assert f'<option value="{roles.OFFICER}" selected>' in page
    assert f"group:{roles.OFFICER}" not in page


def test_only_a_human_agent_has_a_work_item_group(admin_client_: Client) -> None:
    roles.sync_roles()
    agent = Agent.objects.get(slug="erp-connector")
    url = reverse("admin:planning_agent_change", args=[agent.pk])
    response = admin_client_.post(url, {**agent_form(agent), "work_item_group": roles.AUDITOR})
    assert response.status_code == 200
    assert "Only a human agent has a work-item group." in response.content.decode()
    assert events("config.agent.changed") == []


def test_trust_outside_0_to_1_is_refused_without_an_event(admin_client_: Client) -> None:
    agent = Agent.objects.get(slug="erp-connector")
    url = reverse("admin:planning_agent_change", args=[agent.pk])
    response = admin_client_.post(url, agent_form(agent, trust="1.5"))
    assert response.status_code == 200
    agent.refresh_from_db()
    assert agent.trust == 0.9
    assert events("config.agent.changed") == []


def test_failed_audit_append_rolls_the_change_back(
    admin_client_: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import planning.admin

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("audit store unavailable")

    monkeypatch.setattr(planning.admin, "append_event", broken)
    agent = Agent.objects.get(slug="erp-connector")
    url = reverse("admin:planning_agent_change", args=[agent.pk])
    admin_client_.raise_request_exception = False
    response = admin_client_.post(url, agent_form(agent, trust="0.3"))
    assert response.status_code == 500
    agent.refresh_from_db()
    assert agent.trust == 0.9


def test_tool_risk_is_editable_but_name_and_description_are_not(admin_client_: Client) -> None:
    tool = Tool.objects.get(name="get_supplier")
    url = reverse("admin:planning_tool_change", args=[tool.pk])
    response = admin_client_.post(
        url, {"risk": "external", "name": "renamed", "description": "changed"}
    )
    assert response.status_code == 302
    tool.refresh_from_db()
    assert (tool.name, tool.risk) == ("get_supplier", "external")
    assert tool.description == "Look up the supplier master record"
    (event,) = events("config.tool.risk_changed")
    assert event.data == {
        "tool": "get_supplier",
        "changes": {"risk": {"before": "read", "after": "external"}},
    }


def test_tools_and_packs_cannot_be_added_or_deleted(admin_client_: Client) -> None:
    assert admin_client_.get(reverse("admin:planning_tool_add")).status_code == 403
    assert admin_client_.get(reverse("admin:planning_domainpack_add")).status_code == 403
    tool = Tool.objects.first()
    pack = DomainPack.objects.first()
    assert (
        admin_client_.get(reverse("admin:planning_tool_delete", args=[tool.pk])).status_code == 403
    )
    assert (
        admin_client_.get(reverse("admin:planning_domainpack_delete", args=[pack.pk])).status_code
        == 403
    )


@pytest.mark.parametrize(
    ("url", "noun", "here"),
    [
        ("admin:planning_tool_add", "Tools", "set a tool&#x27;s risk class"),
        ("admin:planning_domainpack_add", "Packs", "enable or disable a pack"),
    ],
)
def test_an_admin_adding_a_tool_or_pack_is_told_where_they_come_from(
    url: str, noun: str, here: str
) -> None:
    sync_packs()
    client = Client()
    client.force_login(personas.admin())
    refused = client.get(reverse(url))
    assert refused.status_code == 403
    page = refused.content.decode()
    assert f"{noun} are not added here." in page
    assert "planning/packs" in page and "CASEHUB_EXTRA_PACKS" in page
    assert here in page
    # An admin already holds every role that could add one: no role would help.
    assert "ask an admin" not in page


def test_disabling_a_pack_is_audited(admin_client_: Client) -> None:
    pack = DomainPack.objects.get(slug="fraud")
    url = reverse("admin:planning_domainpack_change", args=[pack.pk])
    assert admin_client_.post(url, {"name": "ignored"}).status_code == 302
    pack.refresh_from_db()
    assert pack.enabled is False
    assert pack.name != "ignored"
    (event,) = events("config.pack.changed")
    assert event.data == {"pack": "fraud", "changes": {"enabled": {"before": True, "after": False}}}


def test_adding_an_agent_is_audited(admin_client_: Client) -> None:
    data = agent_form(
        Agent(name="Reviewer bot", kind="llm", trust=0.5, enabled=True),
        slug="reviewer-bot",
        capabilities='["report.compile"]',
        tools="[]",
        model="gpt-x",
    )
    response = admin_client_.post(reverse("admin:planning_agent_add"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    (event,) = [e for e in events("config.agent.created") if e.data["agent"] == "reviewer-bot"]
    assert event.actor_label == "adam"
    assert event.data["changes"]["kind"] == {"before": None, "after": "llm"}


@pytest.mark.parametrize("persona", ["analyst", "officer", "auditor"])
def test_other_roles_cannot_open_the_agent_admin(
    persona: str, request: pytest.FixtureRequest
) -> None:
    client = Client()
    client.force_login(request.getfixturevalue(persona))
    response = client.get(reverse("admin:planning_agent_changelist"))
    assert response.status_code == 302  # to the admin login: not staff
