"""Hybrid (ChatHTN) planning: static methods first, the LLM only for unmatched subtrees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from planning.core.errors import LlmPlanningError, NoMethodMatched
from planning.core.hybrid import HybridDecomposition
from planning.core.llm.decomposition import LlmDecomposition
from planning.core.llm.records import LlmNotConfigured
from planning.core.static import Item, Method, MethodLibrary, StaticDecomposition, Step, TaskRef
from planning.core.tree import Goal
from planning.core.validation import validate_plan
from planning.packs.incident import PACK as INCIDENT
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.core.llm_helpers import answer, by_goal, goal_of, leaf, make_client, subtask

fake_openai = fixtures.fake_openai

OUTAGE = INCIDENT.initial_state({"kind": "database-outage", "service": "orders-db"})
BREACH = INCIDENT.initial_state(
    {"kind": "security-breach", "service": "orders-db", "affected_hosts": ["web-2"]}
)
DDOS = INCIDENT.initial_state({"kind": "ddos", "service": "orders-db"})


def hybrid(
    server: FakeOpenAIServer, library: MethodLibrary | None = None, *, max_depth: int = 2
) -> HybridDecomposition:
    llm = LlmDecomposition(make_client(server), INCIDENT.agents, max_depth=max_depth)
    return HybridDecomposition(StaticDecomposition(library or INCIDENT.methods), llm)


def test_a_database_outage_is_planned_statically_without_any_call(
    fake_openai: FakeOpenAIServer,
) -> None:
    plan = hybrid(fake_openai).plan(INCIDENT.goal(), OUTAGE)
    assert fake_openai.requests == []
    assert plan.llm_calls == 0
    assert [leaf.key for leaf in plan.leaves] == [
        "fail-over",
        "verify-connectivity",
        "notify-stakeholders",
    ]
    for node in plan.nodes():
        assert node.provenance.strategy == "hybrid"
        assert node.provenance.source == "static:database-outage-response"
    assert plan.leaf("fail-over").tool == "fail_over_database"


def test_the_hybrid_plan_of_a_known_case_matches_the_static_plan(
    fake_openai: FakeOpenAIServer,
) -> None:
    static = StaticDecomposition(INCIDENT.methods).plan(INCIDENT.goal(), BREACH)
    mixed = hybrid(fake_openai).plan(INCIDENT.goal(), BREACH)
    assert [leaf.key for leaf in mixed.leaves] == [leaf.key for leaf in static.leaves]
    assert mixed.dependencies == static.dependencies
    assert mixed.leaf("collect-logs").provenance.source == "static:forensics-from-logs"
    assert fake_openai.requests == []


def test_an_unknown_incident_kind_falls_back_to_the_llm_with_a_hint(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(
            leaf("rate-limit", "incident-commander", "rate-limit the attacking addresses"),
            leaf("tell-owners", "forensic-analyst", "draft the notice to the owners of orders-db"),
        )
    )
    plan = hybrid(fake_openai).plan(INCIDENT.goal(), DDOS)
    (request,) = fake_openai.requests
    assert goal_of(request) == "respond-to-incident"
    assert "database-outage-response" in request.user_prompt
    assert "security-breach-response" in request.user_prompt
    assert '"kind": "ddos"' in request.user_prompt
    # only agents that act on a bare task are offered: tool agents need a tool
    assert "- forensic-analyst: " in request.user_prompt
    assert "- incident-commander: " in request.user_prompt
    assert "db-operator" not in request.user_prompt and "comms-officer" not in request.user_prompt
    assert [leaf.key for leaf in plan.leaves] == ["rate-limit", "tell-owners"]
    assert plan.leaf("rate-limit").provenance.strategy == "hybrid"
    assert plan.leaf("rate-limit").provenance.source == "llm:1"
    assert plan.root.provenance.source == "llm:1"
    assert plan.llm_calls == 1


def _without(library: MethodLibrary, *names: str) -> MethodLibrary:
    return MethodLibrary(m for m in library if m.name not in names)


def test_only_the_unmatched_subtree_goes_to_the_llm(fake_openai: FakeOpenAIServer) -> None:
    library = _without(INCIDENT.methods, "forensics-from-logs", "forensics-from-logs-by-hand")
    fake_openai.enqueue(
        answer(
            leaf("pull-logs", "incident-commander", "have the logs of web-2 collected"),
            leaf("analyse", "forensic-analyst", "reconstruct the attack path"),
        )
    )
    plan = hybrid(fake_openai, library).plan(INCIDENT.goal(), BREACH)

    (request,) = fake_openai.requests
    assert goal_of(request) == "forensic-analysis"
    assert "Parent goal: respond-to-incident" in request.user_prompt
    assert "Isolate the affected systems" in request.user_prompt  # a sibling
    assert "no predefined method exists for 'forensic-analysis'" in request.user_prompt
    assert [leaf.key for leaf in plan.leaves] == [
        "isolate-systems",
        "forensic-analysis.pull-logs",
        "forensic-analysis.analyse",
        "announce-containment",
    ]
    assert plan.leaf("isolate-systems").provenance.source == "static:security-breach-response"
    assert plan.leaf("announce-containment").provenance.source == "static:security-breach-response"
    assert plan.leaf("forensic-analysis.analyse").provenance.source == "llm:1"
    assert plan.node("forensic-analysis").provenance.source == "llm:1"
    assert plan.dependencies["forensic-analysis.pull-logs"] == {"isolate-systems"}
    assert plan.dependencies["announce-containment"] == {"forensic-analysis.analyse"}


def test_compounds_the_llm_creates_are_tried_against_static_methods_first(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            "respond-to-incident": answer(
                leaf("block", "incident-commander", "have the attacking addresses blocked"),
                subtask("forensics", "forensic-analysis", "find out how the attack worked"),
                subtask("debrief", "write-debrief", "write the post-incident review"),
            ),
            "write-debrief": answer(leaf("draft", "incident-commander", "draft the review")),
        }
    )
    state = {**DDOS, "affected_hosts": ["web-2"]}
    plan = hybrid(fake_openai).plan(INCIDENT.goal(), state)
    assert sorted(goal_of(r) for r in fake_openai.requests) == [
        "respond-to-incident",
        "write-debrief",
    ]
    assert [leaf.key for leaf in plan.leaves] == [
        "block",
        "forensics.collect-logs",
        "forensics.analyse-attack-path",
        "debrief.draft",
    ]
    assert plan.leaf("forensics.collect-logs").provenance.source == ("static:forensics-from-logs")
    assert plan.leaf("forensics.collect-logs").inputs["hosts"] == ("web-2",)
    assert plan.leaf("debrief.draft").provenance.source.startswith("llm:")
    assert plan.dependencies["forensics.analyse-attack-path"] == {"forensics.collect-logs"}


def test_a_breach_without_affected_hosts_names_the_failed_methods(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(answer(leaf("find-hosts", "forensic-analyst", "find the affected hosts")))
    state = INCIDENT.initial_state({"kind": "security-breach", "service": "orders-db"})
    hybrid(fake_openai).plan(INCIDENT.goal(), state)
    assert "security-breach-response" in fake_openai.requests[0].user_prompt


def test_a_breach_without_hosts_is_offered_no_host_tools_and_plans_forensics_itself(
    fake_openai: FakeOpenAIServer,
) -> None:
    # no host is named: the forensics method (collect the hosts' logs) does not apply, and
    # neither isolation, log collection nor the containment notice is offered as an action
    fake_openai.responder = by_goal(
        {
            "respond-to-incident": answer(
                leaf("find-hosts", "incident-commander", "identify the affected hosts"),
                subtask("forensics", "forensic-analysis", "find out how the attack worked"),
            ),
            "forensic-analysis": answer(
                leaf("read-report", "forensic-analyst", "analyse the researcher's report")
            ),
        }
    )
    state = INCIDENT.initial_state({"kind": "security-breach", "service": "portal"})
    llm = LlmDecomposition(
        make_client(fake_openai), INCIDENT.agents, actions=INCIDENT.capabilities_for
    )
    plan = HybridDecomposition(StaticDecomposition(INCIDENT.methods), llm).plan(
        INCIDENT.goal(), state
    )
    assert sorted(goal_of(r) for r in fake_openai.requests) == [
        "forensic-analysis",
        "respond-to-incident",
    ]
    for request in fake_openai.requests:
        for name in ("isolate-systems", "collect-logs", "announce-containment"):
            assert f"- {name}: " not in request.user_prompt
    forensics = next(r for r in fake_openai.requests if goal_of(r) == "forensic-analysis")
    assert "forensics-from-logs" in forensics.user_prompt  # the method tried, in the hint
    assert [leaf.key for leaf in plan.leaves] == ["find-hosts", "forensics.read-report"]
    assert not {leaf.tool for leaf in plan.leaves} - {None}
    validate_plan(plan, INCIDENT.catalogue())


def test_other_static_errors_propagate_without_calling_the_llm(
    fake_openai: FakeOpenAIServer,
) -> None:
    def broken(state: Mapping[str, Any]) -> Sequence[Item]:
        raise KeyError("service")

    library = MethodLibrary([Method(name="broken", task="respond-to-incident", decompose=broken)])
    with pytest.raises(KeyError):
        hybrid(fake_openai, library).plan(INCIDENT.goal(), DDOS)
    assert fake_openai.requests == []


def test_unmatched_sibling_subtrees_are_planned_concurrently(
    fake_openai: FakeOpenAIServer,
) -> None:
    def root(state: Mapping[str, Any]) -> Sequence[Item]:
        return [
            Step(key="triage", agent="incident-commander", task="triage"),
            TaskRef(task="contain", depends_on=("triage",)),
            TaskRef(task="communicate", depends_on=("triage",)),
        ]

    library = MethodLibrary([Method(name="generic", task="respond-to-incident", decompose=root)])
    fake_openai.latency_s = 0.2
    fake_openai.responder = by_goal(
        {
            "contain": answer(leaf("a", "incident-commander", "contain it")),
            "communicate": answer(leaf("b", "forensic-analyst", "draft the notice")),
        }
    )
    plan = hybrid(fake_openai, library).plan(INCIDENT.goal(), DDOS)
    assert fake_openai.max_overlap() == 2
    assert plan.dependencies["contain.a"] == {"triage"}
    assert plan.dependencies["communicate.b"] == {"triage"}


def test_without_a_provider_a_fallback_fails_with_a_clear_error() -> None:
    planner = HybridDecomposition(StaticDecomposition(INCIDENT.methods), None)
    with pytest.raises(LlmNotConfigured) as excinfo:
        planner.plan(INCIDENT.goal(), DDOS)
    message = str(excinfo.value)
    assert "respond-to-incident" in message
    assert "database-outage-response" in message
    assert message.endswith("Ask the operator of this server to configure an LLM provider.")
    assert "OPENAI_" not in message
    assert isinstance(excinfo.value, LlmPlanningError)
    assert isinstance(excinfo.value.__cause__, NoMethodMatched)


def test_without_a_provider_static_cases_still_plan() -> None:
    planner = HybridDecomposition(StaticDecomposition(INCIDENT.methods), None)
    plan = planner.plan(INCIDENT.goal(), OUTAGE)
    assert len(plan.leaves) == 3


def test_the_llm_depth_ceiling_holds_inside_a_fallback_subtree(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            "respond-to-incident": answer(subtask("s", "stabilise")),
            "stabilise": answer(leaf("x", "incident-commander", "restart"), subtask("t", "deeper")),
        }
    )
    plan = hybrid(fake_openai, max_depth=2).plan(Goal(name="respond-to-incident"), DDOS)
    assert [leaf.key for leaf in plan.leaves] == ["s.x"]
    assert any("deeper" in w for w in plan.warnings)  # after its repair requests
    last = next(r for r in fake_openai.requests if goal_of(r) == "stabilise")
    assert "subtask" not in last.system_prompt.lower()


def test_hybrid_gives_a_subtask_used_twice_unique_keys_like_static_planning() -> None:
    from tests.planning.core.test_static_forward import REPEATED_KEYS, notifying_library

    library = notifying_library()
    plan = HybridDecomposition(StaticDecomposition(library), None).plan(Goal(name="handle"), {})
    static = StaticDecomposition(library).plan(Goal(name="handle"), {})
    assert [leaf.key for leaf in plan.leaves] == REPEATED_KEYS
    assert plan.dependencies == static.dependencies
    repeated = plan.leaf("handle.notify.send-notice")
    assert repeated.inputs["owners"]["$ref"] == "handle.notify.find-owners"


def test_the_llm_asked_for_a_case_no_method_covers_is_shown_another_cases_method(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(leaf("triage", "incident-commander"))
    llm = LlmDecomposition(
        make_client(fake_openai),
        INCIDENT.agents,
        max_depth=1,
        examples=INCIDENT.methods,
        example_task=INCIDENT.root_task,
    )
    HybridDecomposition(StaticDecomposition(INCIDENT.methods), llm).plan(INCIDENT.goal(), DDOS)
    (request,) = fake_openai.requests
    assert (
        "Example: how this domain's own method 'database-outage-response' decomposes "
        "'respond-to-incident' for another kind of case." in request.user_prompt
    )
    assert '"task": "Fail over orders-db"' in request.user_prompt
    assert "no predefined method applies" in request.user_prompt  # the hint stays
