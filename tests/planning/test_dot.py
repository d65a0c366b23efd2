"""DOT for the plan graph: structure, colours, links, and labels that cannot break out."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planning.dot import STATUS_COLOURS, leaf_label, plan_dot, quote, transitive_reduction
from planning.models import NodeStatus, PlanNode
from tests.planning.factories import make_case, make_plan

pytestmark = pytest.mark.django_db

HOSTILE = (
    'say "hi" } ]; node [shape=none]; "x" -> "y" { <script>alert(1)</script> \\N \\G \\l back\\'
)

# A tokenizer following Graphviz's scanner (lib/cgraph/scan.l): in a quoted string `\"` is a
# quote, `\\` stays a pair (so it can end a string), a backslash-newline is dropped.
_TOKEN = re.compile(r'\s+|"(?:\\.|[^"\\])*"|->|[{}\[\];,=]|[A-Za-z_][A-Za-z0-9_]*|-?[0-9.]+|#')


def tokens(dot: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(dot):
        match = _TOKEN.match(dot, pos)
        assert match, f"DOT does not tokenize at {dot[pos : pos + 40]!r}"
        if not match.group().isspace():
            out.append(match.group())
        pos = match.end()
    return out


def unquote(token: str) -> str:
    """Return what Graphviz reads from a quoted string, then its escString label processing."""
    assert token.startswith('"') and token.endswith('"')
    body = re.sub(r"\\\n", "", token[1:-1])
    body = re.sub(r"\\(.)", lambda m: {"\\": "\x00", '"': '"'}.get(m.group(1), m.group(0)), body)
    # escString: \n \l \r are line breaks; a literal backslash was written as \\ (here \x00).
    body = re.sub(r"\\[nlr]", "\n", body)
    assert not re.search(r"\\[NGETHL]", body), f"an escape sequence survived: {body!r}"
    return body.replace("\x00", "\\")


def statements(dot: str) -> list[list[str]]:
    """Split the tokens into statements (by `;`, `{` and `}` outside quoted strings)."""
    found: list[list[str]] = [[]]
    for token in tokens(dot):
        if token in {";", "{", "}"}:
            found[-1].append(token)
            found.append([])
        else:
            found[-1].append(token)
    return [s for s in found if s]


def node_statement(dot: str, node: PlanNode) -> dict[str, str]:
    wanted = f'"node-{node.pk}"'
    for statement in statements(dot):
        if statement[0] == wanted and statement[1] == "[":
            attrs: dict[str, str] = {}
            body = statement[2 : statement.index("]")]
            for i in range(0, len(body), 4):
                name, eq, value = body[i : i + 3]
                assert eq == "="
                attrs[name] = unquote(value)
            return attrs
    raise AssertionError(f"no statement for {wanted}")


def url(node: PlanNode) -> str:
    return f"/cases/x/nodes/{node.pk}/"


def nodes_of(case: Any) -> list[PlanNode]:
    return list(PlanNode.objects.filter(version=case.current_version).order_by("position"))


def test_quote_round_trips_hostile_text() -> None:
    for text in [HOSTILE, "", "plain", 'a"b', "a\\", "\\\\", 'end with quote"', "{}[];->"]:
        assert unquote(quote(text)) == text


def test_hostile_labels_stay_inside_their_strings(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(
        case,
        leaves=2,
        labels={0: {"key": 'k"}{', "task": HOSTILE, "agent": 'ag"ent'}},
    )
    nodes = nodes_of(case)
    dot = plan_dot(nodes, url_for=url)
    hostile = next(n for n in nodes if n.key == 'k"}{')
    attrs = node_statement(dot, hostile)
    assert attrs["label"] == leaf_label(hostile)
    assert attrs["label"].startswith('k"}{\n[ag"ent]\n')
    assert "<script>alert(1)</script>" in attrs["tooltip"]
    assert attrs["tooltip"].endswith(HOSTILE)
    # Braces balance outside strings: nothing opened or closed a subgraph from a label.
    toks = tokens(dot)
    assert toks.count("{") == toks.count("}")
    # Only the expected statements exist: 3 defaults, per compound 1 opener + 3 attributes,
    # one per leaf, one per edge, the closers.
    compounds = [n for n in nodes if not n.is_leaf]
    leaves = [n for n in nodes if n.is_leaf]
    edges = sum(len(n.depends_on) for n in leaves)
    expected = 1 + 3 + 4 * len(compounds) + len(leaves) + edges + len(compounds) + 1
    assert len(statements(dot)) == expected


def test_control_characters_are_dropped_and_newlines_kept() -> None:
    assert unquote(quote("a\x00b\x1bc\r\nd\x7f")) == "abc\nd"


def test_compounds_become_nested_clusters_and_leaves_their_members(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=4, groups=2)
    nodes = nodes_of(case)
    dot = plan_dot(nodes, url_for=url)
    by_key = {n.key: n for n in nodes}
    # Walk the nesting of subgraphs and record in which cluster each leaf is declared.
    stack: list[str] = []
    home: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    toks = tokens(dot)
    for i, tok in enumerate(toks):
        if tok == "subgraph":
            stack.append(toks[i + 1])
        elif tok == "}" and stack:
            stack.pop()
        elif tok == "label" and toks[i + 1] == "=" and stack and toks[i - 1] in {";", "{"}:
            labels.setdefault(stack[-1], unquote(toks[i + 2]))
        elif tok.startswith('"node-') and toks[i + 1] == "[":
            home[tok.strip('"')] = list(stack)
    root, g0, g1 = by_key["root"], by_key["group-0"], by_key["group-1"]
    assert labels[f"cluster_{root.pk}"] == "Verify the invoice"
    assert labels[f"cluster_{g0.pk}"] == "Group 0"
    assert home[f"node-{by_key['step-0'].pk}"] == [f"cluster_{root.pk}", f"cluster_{g0.pk}"]
    assert home[f"node-{by_key['step-1'].pk}"] == [f"cluster_{root.pk}", f"cluster_{g1.pk}"]
    assert home[f"node-{by_key['step-2'].pk}"] == [f"cluster_{root.pk}", f"cluster_{g0.pk}"]


def test_edges_follow_dependencies_and_nodes_link_to_their_detail(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=4, groups=2)
    nodes = nodes_of(case)
    by_key = {n.key: n for n in nodes}
    dot = plan_dot(nodes, url_for=url)
    edges = {(s[0], s[2]) for s in statements(dot) if len(s) >= 3 and s[1] == "->"}
    step = {k: f'"node-{by_key[k].pk}"' for k in ("step-0", "step-1", "step-2", "step-3")}
    assert edges == {(step["step-0"], step["step-2"]), (step["step-1"], step["step-3"])}
    attrs = node_statement(dot, by_key["step-2"])
    assert attrs["URL"] == url(by_key["step-2"])
    assert attrs["id"] == f"node-{by_key['step-2'].pk}"


@pytest.mark.parametrize("status", [NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.PENDING])
def test_leaves_are_coloured_by_status(analyst: Any, status: str) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=1, status=status)
    nodes = nodes_of(case)
    leaf = next(n for n in nodes if n.is_leaf)
    attrs = node_statement(plan_dot(nodes, url_for=url), leaf)
    assert (attrs["fillcolor"], attrs["color"]) == STATUS_COLOURS[status]


def test_long_tasks_are_wrapped_and_shortened(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=1, labels={0: {"task": "word " * 100}})
    leaf = next(n for n in nodes_of(case) if n.is_leaf)
    label = leaf_label(leaf)
    assert label.endswith("…")
    assert max(len(line) for line in label.split("\n")) <= 30


# Drawing the transitive reduction -------------------------------------------------------------


def closure(deps: dict[str, Any]) -> dict[str, set[str]]:
    """Return every key's transitive dependencies, the slow and obvious way."""
    found: dict[str, set[str]] = {}

    def visit(key: str) -> set[str]:
        if key not in found:
            found[key] = set()
            for dep in deps[key]:
                found[key] |= {dep} | visit(dep)
        return found[key]

    for key in deps:
        visit(key)
    return found


def test_goal_plans_transitive_edges_are_not_drawn_but_kept_in_the_data() -> None:
    # The shape of a goal-oriented invoice plan: extract feeds every check directly and
    # through the supplier lookup.
    deps = {
        "extract": [],
        "lookup": ["extract"],
        "check-duplicate": ["extract", "lookup"],
        "check-totals": ["extract", "lookup"],
        "report": ["check-duplicate", "extract", "check-totals", "lookup"],
    }
    assert transitive_reduction(deps) == {
        "extract": (),
        "lookup": ("extract",),
        "check-duplicate": ("lookup",),
        "check-totals": ("lookup",),
        "report": ("check-duplicate", "check-totals"),
    }
    assert deps["report"] == ["check-duplicate", "extract", "check-totals", "lookup"]


def test_unknown_duplicate_and_cyclic_dependencies() -> None:
    assert transitive_reduction({"a": ["ghost", "b", "b"], "b": []}) == {"a": ("b",), "b": ()}
    cyclic = {"a": ["b"], "b": ["a", "ghost"]}
    assert transitive_reduction(cyclic) == {"a": ("b",), "b": ("a",)}


def test_a_step_after_all_earlier_ones_is_drawn_as_one_chain_for_500_leaves() -> None:
    keys = [f"s{n}" for n in range(500)]
    deps = {key: keys[:n] for n, key in enumerate(keys)}  # 124,750 dependencies
    reduced = transitive_reduction(deps)
    assert reduced == {key: ((keys[n - 1],) if n else ()) for n, key in enumerate(keys)}


@st.composite
def dags(draw: Any) -> dict[str, list[str]]:
    size = draw(st.integers(min_value=0, max_value=14))
    keys = [f"k{n}" for n in range(size)]
    deps = {
        key: draw(st.lists(st.sampled_from(keys[:n]), unique=True)) if n else []
        for n, key in enumerate(keys)
    }
    order = draw(st.permutations(keys))  # declaration order is not topological order
    return {key: deps[key] for key in order}


@given(dags())
def test_reduction_keeps_what_each_step_waits_for_with_no_edge_to_spare(
    deps: dict[str, list[str]],
) -> None:
    reduced = transitive_reduction(deps)
    assert set(reduced) == set(deps)
    for key, kept in reduced.items():
        assert set(kept) <= set(deps[key])
        assert list(kept) == [d for d in deps[key] if d in kept]  # order kept
    assert closure(reduced) == closure(deps)
    for key, kept in reduced.items():
        for dep in kept:
            fewer = {**reduced, key: tuple(d for d in kept if d != dep)}
            assert closure(fewer) != closure(deps), f"{dep} -> {key} was redundant"


def test_dot_draws_the_reduction_of_a_plans_edges(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(
        case,
        leaves=3,
        groups=1,
        labels={2: {"depends_on": ["step-0", "step-1"]}},  # step-1 already follows step-0
    )
    nodes = nodes_of(case)
    by_key = {n.key: n for n in nodes}
    dot = plan_dot(nodes, url_for=url)
    edges = {(s[0], s[2]) for s in statements(dot) if len(s) >= 3 and s[1] == "->"}
    step = {k: f'"node-{by_key[k].pk}"' for k in ("step-0", "step-1", "step-2")}
    assert edges == {(step["step-0"], step["step-1"]), (step["step-1"], step["step-2"])}
    assert PlanNode.objects.get(pk=by_key["step-2"].pk).depends_on == ["step-0", "step-1"]
