from types import MappingProxyType

import pytest

from planning.core.errors import NoMethodMatched
from planning.core.forward import ForwardDecomposition
from planning.core.refs import REF_KEY, ref
from planning.core.static import Method, MethodLibrary, StaticDecomposition, Step, TaskRef
from planning.core.tree import Compound, Goal


def library() -> MethodLibrary:
    """Fetching the records sets `data_loaded`, which changes how `analyse` is done."""
    return MethodLibrary(
        [
            Method(
                name="handle-case",
                task="handle",
                decompose=lambda s: [
                    Step(
                        key="fetch",
                        agent="etl",
                        task="fetch records",
                        effects={"data_loaded": True},
                    ),
                    TaskRef(task="analyse"),
                ],
            ),
            Method(
                name="analyse-loaded-data",
                task="analyse",
                guard=lambda s: bool(s.get("data_loaded")),
                decompose=lambda s: [
                    Step(key="deep-analysis", agent="analyst", task="analyse loaded records")
                ],
            ),
            Method(
                name="analyse-after-download",
                task="analyse",
                decompose=lambda s: [
                    Step(key="download", agent="etl", task="download records again"),
                    Step(key="shallow-analysis", agent="analyst", task="skim"),
                ],
            ),
        ]
    )


def leaf_keys(plan) -> list[str]:
    return [leaf.key for leaf in plan.leaves]


def test_static_guards_see_only_the_initial_state():
    plan = StaticDecomposition(library()).plan(Goal(name="handle"), {})
    assert leaf_keys(plan) == ["fetch", "download", "shallow-analysis"]
    assert plan.node("analyse").provenance.source == "analyse-after-download"


def test_forward_guards_see_effects_of_earlier_steps():
    plan = ForwardDecomposition(library()).plan(Goal(name="handle"), {})
    assert leaf_keys(plan) == ["fetch", "deep-analysis"]
    # The analysis was chosen because of fetch's effect, so it waits for fetch.
    assert plan.dependencies["deep-analysis"] == {"fetch"}
    assert plan.node("analyse").provenance.source == "analyse-loaded-data"


def test_forward_leaves_the_callers_state_unchanged():
    state = {"data_loaded": False, "nested": {"k": 1}}
    ForwardDecomposition(library()).plan(Goal(name="handle"), state)
    assert state == {"data_loaded": False, "nested": {"k": 1}}
    frozen = MappingProxyType({"data_loaded": False})
    ForwardDecomposition(library()).plan(Goal(name="handle"), frozen)
    assert dict(frozen) == {"data_loaded": False}


def test_static_and_forward_stamp_provenance_on_every_node():
    for strategy, name in (
        (StaticDecomposition(library()), "static"),
        (ForwardDecomposition(library()), "forward"),
    ):
        plan = strategy.plan(Goal(name="handle"), {})
        for node in plan.nodes():
            assert node.provenance.strategy == name
        assert plan.root.provenance.depth == 0
        assert plan.node("analyse").provenance.depth == 1
        assert plan.leaves[-1].provenance.depth == 2


def backtracking_library() -> MethodLibrary:
    """The cheap route reserves the only van; a later step then needs it and fails."""
    return MethodLibrary(
        [
            Method(
                name="ship-cheap",
                task="ship",
                decompose=lambda s: [
                    Step(
                        key="book-van",
                        agent="logistics",
                        task="book the van",
                        effects={"van_free": False},
                    ),
                    TaskRef(task="deliver"),
                ],
            ),
            Method(
                name="ship-by-courier",
                task="ship",
                guard=lambda s: bool(s.get("courier_available")),
                decompose=lambda s: [
                    Step(
                        key="book-courier",
                        agent="logistics",
                        task="book a courier",
                        effects={"courier_booked": True},
                    ),
                    TaskRef(task="deliver"),
                ],
            ),
            Method(
                name="deliver-by-courier",
                task="deliver",
                guard=lambda s: bool(s.get("courier_booked")),
                decompose=lambda s: [Step(key="courier-delivery", agent="courier", task="deliver")],
            ),
            Method(
                name="deliver-by-van",
                task="deliver",
                guard=lambda s: bool(s.get("van_free")),
                decompose=lambda s: [Step(key="van-delivery", agent="driver", task="deliver")],
            ),
        ]
    )


BOTH = {"van_free": True, "courier_available": True}


def test_forward_backtracks_to_the_next_method_when_a_later_guard_fails():
    plan = ForwardDecomposition(backtracking_library()).plan(Goal(name="ship"), BOTH)
    assert leaf_keys(plan) == ["book-courier", "courier-delivery"]
    assert plan.root.provenance.source == "ship-by-courier"


def test_static_does_not_backtrack_and_keeps_the_first_method():
    plan = StaticDecomposition(backtracking_library()).plan(Goal(name="ship"), BOTH)
    assert leaf_keys(plan) == ["book-van", "van-delivery"]


def test_forward_reports_no_method_when_every_branch_fails():
    with pytest.raises(NoMethodMatched) as exc:
        ForwardDecomposition(backtracking_library()).plan(Goal(name="ship"), {"van_free": True})
    assert exc.value.task == "ship"
    assert exc.value.methods_tried == ("ship-cheap", "ship-by-courier")
    assert "deliver" in str(exc.value)


def test_forward_keeps_independent_steps_parallel():
    lib = MethodLibrary(
        [
            Method(
                name="triage",
                task="triage",
                decompose=lambda s: [
                    Step(key="pull-logs", agent="ops", task="pull logs", effects={"logs": True}),
                    Step(
                        key="page-owner",
                        agent="ops",
                        task="page the owner",
                        effects={"paged": True},
                    ),
                    Step(key="read-logs", agent="ops", task="read logs", reads=frozenset({"logs"})),
                    Step(key="rotate-logs", agent="ops", task="rotate", effects={"logs": False}),
                ],
            ),
        ]
    )
    plan = ForwardDecomposition(lib).plan(Goal(name="triage"), {})
    assert plan.dependencies["pull-logs"] == set()
    assert plan.dependencies["page-owner"] == set()  # parallel with pull-logs
    assert plan.dependencies["read-logs"] == {"pull-logs"}  # read after write
    # Overwriting waits for the earlier writer and for the reader of the old value.
    assert plan.dependencies["rotate-logs"] == {"pull-logs", "read-logs"}
    # Static planning of the same tree keeps the sibling chain.
    static = StaticDecomposition(lib).plan(Goal(name="triage"), {})
    assert static.dependencies["page-owner"] == {"pull-logs"}


def test_static_no_method_matched_names_task_and_methods_tried():
    with pytest.raises(NoMethodMatched) as exc:
        StaticDecomposition(backtracking_library()).plan(Goal(name="ship"), {})
    assert exc.value.task == "deliver"
    assert exc.value.methods_tried == ("deliver-by-courier", "deliver-by-van")
    assert "'deliver'" in str(exc.value)


def test_static_unknown_task_has_no_methods():
    with pytest.raises(NoMethodMatched, match="'nothing'") as exc:
        StaticDecomposition(library()).plan(Goal(name="nothing"), {})
    assert exc.value.methods_tried == ()


def budget_library() -> MethodLibrary:
    return MethodLibrary(
        [
            Method(
                name="thorough",
                task="review",
                cost=100.0,
                duration_s=3600,
                decompose=lambda s: [Step(key="audit", agent="auditor", task="full audit")],
            ),
            Method(
                name="quick",
                task="review",
                cost=1.0,
                duration_s=60,
                decompose=lambda s: [Step(key="spot-check", agent="auditor", task="spot check")],
            ),
        ]
    )


@pytest.mark.parametrize("budget", [{"cost_budget": 10.0}, {"time_budget": 600.0}])
def test_methods_over_the_budget_are_skipped(budget):
    for strategy in (
        StaticDecomposition(budget_library(), **budget),
        ForwardDecomposition(budget_library(), **budget),
    ):
        plan = strategy.plan(Goal(name="review"), {})
        assert leaf_keys(plan) == ["spot-check"]
    assert leaf_keys(StaticDecomposition(budget_library()).plan(Goal(name="review"), {})) == [
        "audit"
    ]


def test_no_method_within_budget_says_so():
    with pytest.raises(NoMethodMatched, match="over budget: thorough, quick"):
        StaticDecomposition(budget_library(), cost_budget=0.5).plan(Goal(name="review"), {})


def test_expand_is_one_level_and_leaves_subtasks_as_placeholders():
    method, children = StaticDecomposition(library()).expand_with_method("handle", {}, 1)
    assert method.name == "handle-case"
    assert [c.key for c in children] == ["fetch", "analyse"]
    placeholder = children[1]
    assert isinstance(placeholder, Compound)
    assert placeholder.children == ()
    assert placeholder.name == "analyse"
    assert all(c.provenance.depth == 1 for c in children)


def notifying_library() -> MethodLibrary:
    """`handle` notifies the owners at the start and again at the end, through one subtask."""
    return MethodLibrary(
        [
            Method(
                name="handle-with-notices",
                task="handle",
                decompose=lambda s: [
                    TaskRef(task="notify", depends_on=()),
                    Step(
                        key="fix",
                        agent="ops",
                        task="fix the fault",
                        depends_on=(),
                        effects={"fixed": True},
                    ),
                    TaskRef(task="notify", depends_on=("fix",)),
                    Step(
                        key="close",
                        agent="ops",
                        task="close the case",
                        depends_on=("notify",),
                        reads=frozenset({"notified", "fixed"}),
                    ),
                ],
            ),
            Method(
                name="notify-owners",
                task="notify",
                decompose=lambda s: [
                    Step(
                        key="find-owners",
                        agent="comms",
                        task="find the owners",
                        reads=frozenset({"fixed"}),
                        effects={"owners_known": True},
                    ),
                    Step(
                        key="send-notice",
                        agent="comms",
                        task="send the notice",
                        inputs={"owners": ref("find-owners"), "channel": "mail"},
                        reads=frozenset({"owners_known"}),
                        effects={"notified": True},
                    ),
                ],
            ),
        ]
    )


REPEATED_KEYS = [
    "find-owners",
    "send-notice",
    "fix",
    "handle.notify.find-owners",
    "handle.notify.send-notice",
    "close",
]


@pytest.mark.parametrize("strategy", [StaticDecomposition, ForwardDecomposition])
def test_a_subtask_used_twice_gets_unique_keys_under_its_parent(strategy):
    plan = strategy(notifying_library()).plan(Goal(name="handle"), {})
    assert leaf_keys(plan) == REPEATED_KEYS
    # The first use keeps its keys; the repeat is prefixed by its parent's key.
    first, again = plan.node("notify"), plan.node("handle.notify")
    assert isinstance(first, Compound) and isinstance(again, Compound)
    assert first.name == again.name == "notify"
    assert [c.key for c in first.children] == ["find-owners", "send-notice"]
    # Each notice reads the owners found by its own use of the subtask.
    assert plan.leaf("send-notice").inputs["owners"][REF_KEY] == "find-owners"
    repeated = plan.leaf("handle.notify.send-notice")
    assert repeated.inputs["owners"][REF_KEY] == "handle.notify.find-owners"
    assert repeated.inputs["channel"] == "mail"
    assert "handle.notify.find-owners" in plan.upstream("handle.notify.send-notice")


def test_static_dependencies_on_a_repeated_subtask_name_its_nearest_earlier_use():
    plan = StaticDecomposition(notifying_library()).plan(Goal(name="handle"), {})
    deps = plan.dependencies
    assert deps["find-owners"] == set()
    assert deps["fix"] == set()
    assert deps["handle.notify.find-owners"] == {"fix"}
    assert deps["handle.notify.send-notice"] == {"handle.notify.find-owners"}
    # `close` waits for "notify": the use just before it, not the first one.
    assert deps["close"] == {"handle.notify.send-notice"}


def test_forward_dependencies_follow_the_effects_of_each_use_of_a_repeated_subtask():
    plan = ForwardDecomposition(notifying_library()).plan(Goal(name="handle"), {})
    deps = plan.dependencies
    assert deps["find-owners"] == set()
    assert deps["send-notice"] == {"find-owners"}
    # The repeat reads `fixed` and overwrites `owners_known`: after fix and the first use.
    assert deps["handle.notify.find-owners"] == {"fix", "find-owners", "send-notice"}
    assert deps["handle.notify.send-notice"] == {"handle.notify.find-owners", "send-notice"}
    assert deps["close"] == {"fix", "handle.notify.send-notice"}


@pytest.mark.parametrize("strategy", [StaticDecomposition, ForwardDecomposition])
def test_a_step_repeated_among_its_siblings_is_renamed_and_its_dependents_follow(strategy):
    lib = MethodLibrary(
        [
            Method(
                name="ping-twice",
                task="check",
                decompose=lambda s: [
                    Step(key="ping", agent="ops", task="ping", effects={"pinged": 1}),
                    Step(key="ping", agent="ops", task="ping again", effects={"pinged": 2}),
                    Step(key="report", agent="ops", task="report", depends_on=("ping",)),
                ],
            )
        ]
    )
    plan = strategy(lib).plan(Goal(name="check"), {})
    assert leaf_keys(plan) == ["ping", "check.ping", "report"]
    assert plan.leaf("check.ping").task == "ping again"
    assert "check.ping" in plan.dependencies["report"]
