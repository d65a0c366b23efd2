"""The gating policy on its own: pure Python, no database (RELIABILITY R10)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversight.policy import (
    CLASSIFIERS,
    LEVELS,
    RISK_CLASSES,
    Finding,
    LeafFacts,
    PolicySettings,
    SettingsInvalid,
    by_amount,
    by_provenance,
    by_risk_class,
    by_trust,
    classify,
    effective_risk,
    loosening,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = PolicySettings()


def leaf(**changes: Any) -> LeafFacts:
    """A leaf nothing gates: a registered read tool of a trusted agent, planned statically."""
    facts: dict[str, Any] = {
        "key": "step",
        "agent": "erp-connector",
        "tool": "get_invoice",
        "tool_risk": "read",
        "agent_trust": 0.9,
        "strategy": "static",
        "source": "method",
        "depth": 1,
    }
    facts.update(changes)
    return LeafFacts(**facts)


def test_the_policy_module_imports_no_django() -> None:
    code = (
        "import sys, oversight.policy\n"
        "leaked = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not leaked, leaked\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_a_trusted_read_step_is_autonomous() -> None:
    found = classify(leaf(), DEFAULTS)
    assert not found.gated
    assert (found.reason, found.level, found.quorum, found.needs_signature) == ("", "low", 1, False)
    assert found.approver_group == "compliance officer"


# Risk class ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("risk", "level", "signature"),
    [
        ("write", "medium", False),
        ("financial", "high", True),
        ("external", "high", True),
        ("destructive", "high", True),
    ],
)
def test_gated_risk_classes_gate_with_their_level_and_signature(
    risk: str, level: str, signature: bool
) -> None:
    found = classify(leaf(tool="do_it", tool_risk=risk), DEFAULTS)
    assert found.gated
    assert found.reason == f"{risk} tool do_it"
    assert (found.level, found.needs_signature) == (level, signature)
    assert [f.classifier for f in found.reasons] == ["risk"]


def test_destructive_steps_take_the_configured_quorum() -> None:
    policy = dataclasses.replace(DEFAULTS, destructive_quorum=3)
    assert classify(leaf(tool="wipe", tool_risk="destructive"), policy).quorum == 3
    assert classify(leaf(tool="pay", tool_risk="financial"), policy).quorum == 1


def test_a_risk_class_left_out_of_the_gated_ones_is_not_gated_by_risk() -> None:
    policy = dataclasses.replace(DEFAULTS, gated_risks=("financial",))
    assert by_risk_class(leaf(tool="note", tool_risk="write"), policy) is None
    assert by_risk_class(leaf(tool="pay", tool_risk="financial"), policy) is not None


@pytest.mark.scenario("R10")
def test_an_unknown_tool_is_high_risk_and_needs_a_signature() -> None:
    found = classify(leaf(tool="email_everything_out", tool_risk=None), DEFAULTS)
    assert found.gated
    assert (found.level, found.needs_signature) == ("high", True)
    assert found.reason == "unknown tool email_everything_out: treated as high risk"


def test_an_unknown_risk_class_is_high_risk() -> None:
    for facts in (leaf(tool_risk="harmless"), leaf(declared_risk="trivial")):
        found = classify(facts, DEFAULTS)
        assert (found.gated, found.level, found.needs_signature) == (True, "high", True)
        assert "unknown risk class" in found.reason


def test_a_declared_risk_can_only_raise_the_registered_one() -> None:
    assert effective_risk(leaf(tool_risk="financial", declared_risk="read")) == "financial"
    assert effective_risk(leaf(tool_risk="read", declared_risk="external")) == "external"
    assert not classify(leaf(tool_risk="read", declared_risk="read"), DEFAULTS).gated
    lowered = classify(leaf(tool="pay", tool_risk="financial", declared_risk="read"), DEFAULTS)
    assert lowered.gated and lowered.level == "high"


def test_a_pack_mark_gates_a_step_without_a_tool() -> None:
    found = classify(leaf(tool=None, tool_risk=None, declared_risk="external"), DEFAULTS)
    assert found.reason == "marked external by its pack"
    assert found.needs_signature
    assert effective_risk(leaf(tool=None, tool_risk=None)) is None
    assert not classify(leaf(tool=None, tool_risk=None), DEFAULTS).gated


# Amounts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "gated", "quorum"),
    [
        ({"amount": 9999.99}, False, None),
        ({"amount": 10000}, True, 1),
        ({"amount": "25,000.00"}, True, 1),
        ({"amount": "$25,000.00"}, True, 1),
        ({"amount": "25,000.00 EUR"}, True, 1),
        ({"invoice": {"lines": [{"price": "4"}, {"price": "12,500"}]}}, True, 1),
        ({"payment": {"total_amount": Decimal("100000")}}, True, 2),
        ({"amounts": [1, 250000]}, True, 2),
        ({"refund_value": -50000}, True, 1),
        ({"invoice_id": 99999999, "note": "pay 50000 now"}, False, None),
        ({"amount": "a lot"}, False, None),
        ({"amount": True}, False, None),
    ],
)
def test_amounts_are_found_wherever_they_are_in_the_inputs(
    inputs: dict[str, Any], gated: bool, quorum: int | None
) -> None:
    found = by_amount(leaf(tool="pay", tool_risk="write", inputs=inputs), DEFAULTS)
    assert (found is not None) == gated
    if found is not None:
        assert found.quorum == quorum
        assert found.level == ("high" if quorum == 2 else "medium")


def test_the_amount_reason_names_the_input_and_the_threshold() -> None:
    found = by_amount(leaf(tool_risk="write", inputs={"po": {"total": "25,000.00"}}), DEFAULTS)
    assert found is not None
    assert found.detail == "po.total 25,000 at or over 10,000"


def test_a_read_only_tool_with_a_big_amount_is_not_gated_by_the_amount() -> None:
    big = {"amount": "5,000,000"}
    assert by_amount(leaf(inputs=big), DEFAULTS) is None
    assert not classify(leaf(inputs=big), DEFAULTS).gated
    # ... unless its pack marks it as more than a read, or the tool is unknown, or there is none
    assert by_amount(leaf(inputs=big, declared_risk="write"), DEFAULTS) is not None
    assert by_amount(leaf(inputs=big, tool_risk=None), DEFAULTS) is not None
    assert by_amount(leaf(inputs=big, tool=None, tool_risk=None), DEFAULTS) is not None


def test_amount_keys_and_thresholds_are_configurable() -> None:
    facts = leaf(tool_risk="write", inputs={"fee": 500})
    assert by_amount(facts, DEFAULTS) is None
    policy = dataclasses.replace(DEFAULTS, amount_keys=("fee",), amount_threshold=Decimal(100))
    found = by_amount(facts, policy)
    assert found is not None and found.quorum == 1
    policy = dataclasses.replace(policy, amount_quorum_threshold=Decimal(500))
    found = by_amount(facts, policy)
    assert found is not None and found.quorum == 2


# Trust and provenance ------------------------------------------------------------------------


def test_trust_under_the_threshold_gates_and_an_unknown_agent_is_high_risk() -> None:
    low = by_trust(leaf(agent_trust=0.59), DEFAULTS)
    assert low is not None and low.level == "medium"
    assert low.detail == "agent erp-connector trusted 0.59, under 0.60"
    assert by_trust(leaf(agent_trust=0.6), DEFAULTS) is None
    unknown = by_trust(leaf(agent_trust=None, agent="ghost"), DEFAULTS)
    assert unknown is not None and unknown.level == "high"
    assert unknown.detail == "unknown or disabled agent ghost"


def test_llm_planned_steps_at_the_depth_threshold_or_deeper_are_gated() -> None:
    assert by_provenance(leaf(strategy="llm", depth=1), DEFAULTS) is None
    found = by_provenance(leaf(strategy="llm", depth=2), DEFAULTS)
    assert found is not None and found.detail == "LLM-planned at depth 2"
    assert by_provenance(leaf(source="llm", strategy="hybrid", depth=3), DEFAULTS) is not None
    assert by_provenance(leaf(strategy="static", depth=5), DEFAULTS) is None
    every = dataclasses.replace(DEFAULTS, llm_depth_threshold=0)
    assert by_provenance(leaf(strategy="llm", depth=0), every) is not None


# Combining -----------------------------------------------------------------------------------


@pytest.mark.scenario("R10")
def test_the_most_restrictive_result_wins() -> None:
    facts = leaf(
        tool="pay",
        tool_risk="write",
        inputs={"amount": 150000},
        agent_trust=0.2,
        strategy="llm",
        depth=2,
    )
    found = classify(facts, DEFAULTS)
    assert [f.classifier for f in found.reasons] == ["risk", "amount", "trust", "provenance"]
    assert (found.level, found.quorum) == ("high", 2)
    assert found.reason == (
        "write tool pay; amount 150,000 at or over 10,000; agent erp-connector trusted 0.20, "
        "under 0.60; LLM-planned at depth 2"
    )


@pytest.mark.scenario("R10")
def test_a_classifier_that_raises_gates_the_leaf_at_high_risk() -> None:
    def broken(facts: LeafFacts, policy: PolicySettings) -> Finding | None:
        raise KeyError("no such fact")

    found = classify(leaf(), DEFAULTS, (*CLASSIFIERS, broken))
    assert found.gated and found.level == "high"
    assert found.reason == "policy check broken failed (KeyError): gated to be safe"


def test_a_nan_amount_makes_the_amount_check_fail_closed() -> None:
    found = classify(leaf(tool_risk="write", inputs={"amount": float("nan")}), DEFAULTS)
    assert "policy check by_amount failed" in found.reason
    assert found.level == "high"


@pytest.mark.scenario("R10")
def test_nothing_the_plan_says_about_approval_counts() -> None:
    # There is no fact for it: such inputs are just inputs, and never an amount.
    facts = leaf(
        tool="pay",
        tool_risk="financial",
        inputs={"requires_approval": False, "approval": "not needed", "skip_gates": True},
    )
    found = classify(facts, DEFAULTS)
    assert found.gated and found.needs_signature
    assert not hasattr(facts, "requires_approval")


risks = st.sampled_from((*RISK_CLASSES, None, "bogus"))
facts_strategy = st.builds(
    LeafFacts,
    key=st.just("k"),
    agent=st.sampled_from(["a", "b"]),
    tool=st.sampled_from([None, "t"]),
    tool_risk=risks,
    declared_risk=risks,
    inputs=st.dictionaries(
        st.sampled_from(["amount", "total", "id", "note"]),
        st.one_of(st.integers(-(10**7), 10**7), st.text(max_size=8), st.booleans()),
        max_size=3,
    ),
    agent_trust=st.one_of(st.none(), st.floats(0, 1)),
    strategy=st.sampled_from(["static", "llm", "hybrid"]),
    source=st.sampled_from(["", "llm", "method"]),
    depth=st.integers(0, 4),
)


def _extra(gated: bool, level: str, boom: bool) -> Any:
    def extra(facts: LeafFacts, policy: PolicySettings) -> Finding | None:
        if boom:
            raise RuntimeError("boom")
        return Finding(classifier="extra", detail="extra", gated=gated, level=level)

    return extra


@settings(max_examples=300, deadline=None)
@given(
    facts=facts_strategy,
    extras=st.lists(
        st.tuples(st.booleans(), st.sampled_from(LEVELS), st.booleans()), min_size=1, max_size=3
    ),
)
def test_adding_any_classifier_never_makes_a_gated_leaf_autonomous(
    facts: LeafFacts, extras: list[tuple[bool, str, bool]]
) -> None:
    before = classify(facts, DEFAULTS)
    after = classify(facts, DEFAULTS, (*CLASSIFIERS, *(_extra(*e) for e in extras)))
    if before.gated:
        assert after.gated
        assert LEVELS.index(after.level) >= LEVELS.index(before.level)
        assert after.quorum >= before.quorum
        assert after.needs_signature >= before.needs_signature


# Settings ------------------------------------------------------------------------------------


def test_settings_round_trip_through_data() -> None:
    data = DEFAULTS.as_data()
    assert data["amount_threshold"] == "10000"
    assert data["gated_risks"] == ["write", "financial", "external", "destructive"]
    assert PolicySettings.from_data(data) == DEFAULTS
    assert PolicySettings.from_data({}) == DEFAULTS


def test_from_data_refuses_unknown_keys() -> None:
    with pytest.raises(SettingsInvalid) as raised:
        PolicySettings.from_data({"requires_approval": False, "amount_threshold": "1"})
    assert raised.value.problems == {"requires_approval": "unknown policy setting"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("amount_threshold", "lots"),
        ("amount_threshold", "-1"),
        ("amount_threshold", "NaN"),
        ("amount_threshold", "Infinity"),
        ("amount_quorum_threshold", -5),
        ("trust_threshold", 1.5),
        ("trust_threshold", "nan"),
        ("trust_threshold", True),
        ("cold_start", "maybe"),
        ("cold_start", 1),
        ("llm_depth_threshold", -1),
        ("llm_depth_threshold", 1.5),
        ("destructive_quorum", 0),
        ("destructive_quorum", 6),
        ("gated_risks", ["write", "telepathy"]),
        ("gated_risks", "write"),
        ("signature_risks", [1]),
        ("amount_keys", ["amount", " "]),
        ("approver_group", " "),
        ("approver_group", 5),
        ("escalation_group", ""),
        ("gate_hours", 0),
        ("escalation_hours", 24 * 91),
        ("approval_valid_hours", "x"),
    ],
)
def test_from_data_refuses_bad_values_naming_the_field(name: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        PolicySettings.from_data({name: value})
    assert isinstance(raised.value, SettingsInvalid)
    assert list(raised.value.problems) == [name]
    assert str(raised.value).startswith(f"{name}: ")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"gated_risks": ("financial", "external", "destructive")}, "write steps no longer gated"),
        ({"signature_risks": ("financial",)},
         "destructive, external steps no longer need a signature"),
        ({"amount_threshold": Decimal("10001")}, "amount threshold raised"),
        ({"amount_quorum_threshold": Decimal("200000")}, "two-approver amount threshold raised"),
        ({"amount_keys": ("amount", "total")}, "fewer input keys read as amounts"),
        ({"amount_keys": ("amount", "total", "value", "price", "cost", "sum", "fee")},
         "fewer input keys read as amounts"),
        ({"trust_threshold": 0.5}, "trust threshold lowered"),
        ({"llm_depth_threshold": 3}, "LLM depth threshold raised"),
        ({"approver_group": "friends"}, "approver group changed"),
        ({"escalation_group": "friends"}, "escalation group changed"),
        ({"gate_hours": 48}, "gate deadline lengthened"),
        ({"escalation_hours": 25}, "escalation period lengthened"),
        ({"approval_valid_hours": 73}, "approvals valid for longer"),
    ],
)  # fmt: skip
def test_loosening_names_each_looser_setting(changes: dict[str, Any], words: str) -> None:
    assert loosening(DEFAULTS, dataclasses.replace(DEFAULTS, **changes)) == [words]


def test_no_longer_escalating_new_agents_loosens_and_escalating_them_does_not() -> None:
    strict = dataclasses.replace(DEFAULTS, cold_start="escalate")
    assert DEFAULTS.cold_start == "trusted"
    assert loosening(strict, DEFAULTS) == [
        "approved steps of agents with no history no longer escalated"
    ]
    assert loosening(DEFAULTS, strict) == []


def test_a_lower_destructive_quorum_loosens() -> None:
    strict = dataclasses.replace(DEFAULTS, destructive_quorum=3)
    assert loosening(strict, DEFAULTS) == ["destructive quorum lowered"]


@pytest.mark.parametrize(
    "changes",
    [
        {"gated_risks": (*DEFAULTS.gated_risks, "read")},
        {"signature_risks": (*DEFAULTS.signature_risks, "write")},
        {"amount_threshold": Decimal("5000"), "amount_quorum_threshold": Decimal("50000")},
        {"amount_keys": (*DEFAULTS.amount_keys, "fee")},
        {"trust_threshold": 0.8},
        {"llm_depth_threshold": 0},
        {"destructive_quorum": 2},
        {"gate_hours": 4, "escalation_hours": 4, "approval_valid_hours": 24},
    ],
)
def test_stricter_or_wider_settings_do_not_loosen(changes: dict[str, Any]) -> None:
    assert loosening(DEFAULTS, dataclasses.replace(DEFAULTS, **changes)) == []
