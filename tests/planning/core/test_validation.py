from dataclasses import replace

import pytest
from pydantic import BaseModel, ConfigDict, Field

from planning.core.catalogue import AgentSpec, Catalogue, ToolSpec
from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid
from planning.core.refs import ref, resolve_inputs
from planning.core.tree import Compound, Leaf, Provenance
from planning.core.validation import PlanLimits, validate_plan

PROV = Provenance(strategy="llm", source="llm:1", depth=1)


class OrderQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(pattern=r"^ORD-[0-9]{4,}$")


class OrderStatus(BaseModel):
    order_id: str
    status: str


class KbQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=2)
    limit: int = Field(default=3, ge=1, le=5)


def _status(args: OrderQuery, port: object) -> OrderStatus:
    return OrderStatus(order_id=args.order_id, status="shipped")


def _search(args: KbQuery, port: object) -> OrderStatus:
    return OrderStatus(order_id="-", status=args.query)


CATALOGUE = Catalogue.from_specs(
    [
        AgentSpec(
            slug="support", name="Support", description="", kind="tool", tools=("get_order_status",)
        ),
        AgentSpec(
            slug="kb", name="KB", description="", kind="tool", tools=("search_knowledge_base",)
        ),
        AgentSpec(slug="retired", name="Retired", description="", kind="llm", enabled=False),
        AgentSpec(slug="writer", name="Writer", description="", kind="llm"),
    ],
    [
        ToolSpec(
            name="get_order_status",
            description="",
            input_model=OrderQuery,
            output_model=OrderStatus,
            risk="read",
            func=_status,
        ),
        ToolSpec(
            name="search_knowledge_base",
            description="",
            input_model=KbQuery,
            output_model=OrderStatus,
            risk="read",
            func=_search,
        ),
    ],
)


def step(key, agent="support", tool="get_order_status", inputs=None, depends_on=None) -> Leaf:
    return Leaf(
        key=key,
        agent=agent,
        task=key,
        tool=tool,
        inputs=inputs if inputs is not None else {"order_id": "ORD-1001"},
        depends_on=depends_on,
        provenance=PROV,
    )


def plan_of(*leaves: Leaf) -> DagPlan:
    return DagPlan.build(Compound(key="root", name="root", children=leaves, provenance=PROV))


def test_valid_plan_passes():
    validate_plan(
        plan_of(
            step("s1"),
            step("s2", agent="kb", tool="search_knowledge_base", inputs={"query": "delay policy"}),
        ),
        CATALOGUE,
    )


def test_unknown_agent_is_refused():
    with pytest.raises(PlanInvalid, match="'s1': unknown agent 'ghost'") as exc:
        validate_plan(plan_of(step("s1", agent="ghost")), CATALOGUE)
    assert exc.value.keys == ("s1",)


def test_disabled_agent_is_refused():
    with pytest.raises(PlanInvalid, match="'retired' is disabled"):
        validate_plan(plan_of(step("s1", agent="retired", tool=None, inputs={})), CATALOGUE)


def test_a_tool_agent_leaf_without_a_tool_is_refused_even_without_inputs():
    # an LLM-planned leaf carries no tool: a tool agent would have nothing to run
    with pytest.raises(PlanInvalid, match="'s1': tool agent 'support' has no tool to run") as exc:
        validate_plan(plan_of(step("s1", tool=None, inputs={})), CATALOGUE)
    assert exc.value.keys == ("s1",)
    validate_plan(plan_of(step("s2", agent="writer", tool=None, inputs={})), CATALOGUE)


@pytest.mark.scenario("L2")
def test_tool_not_on_the_agents_allow_list_is_refused():
    with pytest.raises(PlanInvalid, match="'search_knowledge_base' is not allowed for 'support'"):
        validate_plan(
            plan_of(step("s1", tool="search_knowledge_base", inputs={"query": "x"})), CATALOGUE
        )


def test_bad_tool_inputs_are_refused_with_the_field():
    with pytest.raises(PlanInvalid, match=r"'s1': inputs invalid.*order_id") as exc:
        validate_plan(plan_of(step("s1", inputs={"order_id": "1001"})), CATALOGUE)
    assert exc.value.keys == ("s1",)
    with pytest.raises(PlanInvalid, match="limit"):
        validate_plan(
            plan_of(
                step(
                    "s1",
                    agent="kb",
                    tool="search_knowledge_base",
                    inputs={"query": "policy", "limit": 9},
                )
            ),
            CATALOGUE,
        )


def test_every_problem_is_reported_at_once():
    with pytest.raises(PlanInvalid) as exc:
        validate_plan(
            plan_of(step("s1", agent="ghost"), step("s2", inputs={"order_id": "bad"})), CATALOGUE
        )
    assert exc.value.keys == ("s1", "s2")


def test_references_must_point_upstream_and_at_real_output_fields():
    upstream_ok = plan_of(step("s1"), step("s2", inputs={"order_id": ref("s1", "order_id")}))
    validate_plan(upstream_ok, CATALOGUE)
    independent = plan_of(
        step("s1"), step("s2", inputs={"order_id": ref("s1", "order_id")}, depends_on=())
    )
    with pytest.raises(PlanInvalid, match="not upstream"):
        validate_plan(independent, CATALOGUE)
    wrong_field = plan_of(step("s1"), step("s2", inputs={"order_id": ref("s1", "nope")}))
    with pytest.raises(PlanInvalid, match="missing output field 'nope'"):
        validate_plan(wrong_field, CATALOGUE)
    missing = plan_of(step("s1"), step("s2", inputs={"other": ref("s1")}))
    with pytest.raises(PlanInvalid, match="needs input 'order_id'"):
        validate_plan(missing, CATALOGUE)


def test_resolve_inputs_substitutes_upstream_outputs():
    outputs = {"s1": OrderStatus(order_id="ORD-1001", status="shipped")}
    resolved = resolve_inputs({"order_id": ref("s1", "order_id"), "x": 1}, outputs)
    assert resolved == {"order_id": "ORD-1001", "x": 1}
    with pytest.raises(PlanInvalid, match="'s9'"):
        resolve_inputs({"order_id": ref("s9")}, outputs)


@pytest.mark.scenario("L4")
def test_limits_on_leaves_fan_out_and_depth():
    plan = plan_of(*(step(f"s{i}") for i in range(4)))
    with pytest.raises(PlanInvalid, match="4 leaves, limit 3"):
        validate_plan(plan, CATALOGUE, PlanLimits(max_leaves=3))
    with pytest.raises(PlanInvalid, match="'root' has 4 children, fan-out limit 2"):
        validate_plan(plan, CATALOGUE, PlanLimits(max_fan_out=2))
    deep = Compound(key="inner", name="inner", children=(step("x"),), provenance=PROV)
    nested = DagPlan.build(
        Compound(
            key="root",
            name="root",
            children=(replace(deep, key="outer", children=(deep,)),),
            provenance=PROV,
        )
    )
    with pytest.raises(PlanInvalid, match="'x' is nested deeper than 2"):
        validate_plan(nested, CATALOGUE, PlanLimits(max_depth=2))
    validate_plan(nested, CATALOGUE, PlanLimits(max_depth=3))


def test_tool_run_validates_inputs_and_output():
    tool = CATALOGUE.tools["get_order_status"]
    assert tool.run({"order_id": "ORD-1001"}, None) == OrderStatus(
        order_id="ORD-1001", status="shipped"
    )
    with pytest.raises(ValueError, match="order_id"):
        tool.run({"order_id": "x"}, None)
