"""The gating policy: which leaves of a plan need people's approval, why, by whom, how many.

Pure Python (no Django): the actions gather the facts of each leaf from the database — the tool's
risk class from the registry, the agent's trust, the provenance, the pack's explicit mark — and
`classify` turns them into a `Classification`. The rules (RELIABILITY R10):

- every classifier looks at one kind of fact; the most restrictive result wins;
- a classifier that raises gates the leaf (fail closed), with the error in the reason;
- an unknown tool, an unknown risk class or an unknown agent is high risk;
- nothing the plan itself says about approval counts: there is no fact for it. A risk the plan
  names can only raise the tool's registered risk class, never lower it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

RISK_CLASSES = ("read", "write", "financial", "external", "destructive")
LEVELS = ("low", "medium", "high")
# What routing does with an agent that has no outcomes yet, on a step an officer approved: run it
# as planned ("no history yet"), or escalate it like any agent under the trust threshold.
COLD_START = ("trusted", "escalate")


class SettingsInvalid(ValueError):
    """Policy settings that cannot be used; `problems` maps each bad field to what is wrong."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(f"{name}: {why}" for name, why in self.problems.items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """What admins configure. Stored as data in a policy version; every field has a safe default."""

    # Risk classes whose steps always need a step gate, and those that need an e-signature.
    gated_risks: tuple[str, ...] = ("write", "financial", "external", "destructive")
    signature_risks: tuple[str, ...] = ("financial", "external", "destructive")
    # Any amount in a step's inputs at or above this is gated; at or above the second, 2 approvers.
    amount_threshold: Decimal = Decimal("10000")
    amount_quorum_threshold: Decimal = Decimal("100000")
    # Input keys holding amounts contain one of these words.
    amount_keys: tuple[str, ...] = ("amount", "total", "value", "price", "cost", "sum", "limit")
    # Agents trusted less than this need approval of each step they do.
    trust_threshold: float = 0.6
    # An agent with no outcomes yet (its trust only its prior) under the threshold: "trusted" runs
    # a step of it an officer approved; "escalate" asks the escalation group first.
    cold_start: str = "trusted"
    # LLM-planned steps at this depth of decomposition or deeper are gated (0: every LLM step).
    llm_depth_threshold: int = 2
    # Quorum of destructive steps (distinct officers).
    destructive_quorum: int = 1
    approver_group: str = "compliance officer"
    escalation_group: str = "compliance supervisor"
    # A gate's deadline; a reminder at half of it; after the deadline it escalates to the
    # escalation group for as long again; then it is held. Never approved by time.
    gate_hours: int = 24
    escalation_hours: int = 24
    # An approval older than this never executes (R4).
    approval_valid_hours: int = 72

    def as_data(self) -> dict[str, Any]:
        """Return the settings as JSON-ready data (amounts as strings)."""
        data = dataclasses.asdict(self)
        for name, value in data.items():
            if isinstance(value, Decimal):
                data[name] = str(value)
            elif isinstance(value, tuple):
                data[name] = list(value)
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PolicySettings:
        """Build settings from stored data; unknown keys are refused, missing ones default.

        Raises SettingsInvalid (a ValueError naming each bad field) for an unknown key, a value of
        the wrong kind or one out of range.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(name) for name in set(data) - names)
        if unknown:
            raise SettingsInvalid({name: "unknown policy setting" for name in unknown})
        defaults = cls()
        values: dict[str, Any] = {}
        problems: dict[str, str] = {}
        for name, value in data.items():
            try:
                values[name] = _coerce(getattr(defaults, name), value)
            except (TypeError, ValueError, ArithmeticError) as exc:
                problems[name] = str(exc) or "bad value"
        if problems:
            raise SettingsInvalid(problems)
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise SettingsInvalid when a value is out of range."""
        problems: dict[str, str] = {}
        for name in ("gated_risks", "signature_risks"):
            if unknown := set(getattr(self, name)) - set(RISK_CLASSES):
                problems[name] = f"unknown risk class(es) {', '.join(sorted(unknown))}"
        for name in ("amount_threshold", "amount_quorum_threshold"):
            if getattr(self, name) < 0:
                problems[name] = "an amount threshold must not be negative"
        if any(not key.strip() for key in self.amount_keys):
            problems["amount_keys"] = "an amount key must not be blank"
        if not 0 <= self.trust_threshold <= 1:
            problems["trust_threshold"] = "the trust threshold must be between 0 and 1"
        if self.cold_start not in COLD_START:
            problems["cold_start"] = f"must be one of {', '.join(COLD_START)}"
        if self.llm_depth_threshold < 0:
            problems["llm_depth_threshold"] = "the LLM depth threshold must not be negative"
        if not 1 <= self.destructive_quorum <= 5:
            problems["destructive_quorum"] = "the destructive quorum must be between 1 and 5"
        for name in ("gate_hours", "escalation_hours", "approval_valid_hours"):
            if not 1 <= getattr(self, name) <= 24 * 90:
                problems[name] = "must be between 1 and 2160 hours"
        for name in ("approver_group", "escalation_group"):
            if not getattr(self, name).strip():
                problems[name] = "a group must be named"
        if problems:
            raise SettingsInvalid(problems)


def _coerce(default: Any, value: Any) -> Any:
    if isinstance(default, bool) or isinstance(value, bool):
        raise TypeError("expected a number or text, not true/false")
    if isinstance(default, Decimal):
        amount = Decimal(str(value).strip())
        if not amount.is_finite():
            raise ValueError("expected a finite amount")
        return amount
    if isinstance(default, float):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError("expected a finite number")
        return number
    if isinstance(default, int):
        if isinstance(value, float) and not value.is_integer():
            raise ValueError("expected a whole number")
        return int(value)
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise TypeError("expected a list of names")
        return tuple(value)
    if not isinstance(value, str):
        raise TypeError("expected text")
    return value


def loosening(old: PolicySettings, new: PolicySettings) -> list[str]:
    """Return, in words, each way `new` gates less strictly than `old` (empty: not looser).

    A change of approver or escalation group counts as loosening: it changes who may approve.
    """
    looser = []
    if dropped := set(old.gated_risks) - set(new.gated_risks):
        looser.append(f"{', '.join(sorted(dropped))} steps no longer gated")
    if dropped := set(old.signature_risks) - set(new.signature_risks):
        looser.append(f"{', '.join(sorted(dropped))} steps no longer need a signature")
    higher: list[tuple[str, str]] = [
        ("amount_threshold", "amount threshold raised"),
        ("amount_quorum_threshold", "two-approver amount threshold raised"),
        ("llm_depth_threshold", "LLM depth threshold raised"),
        ("gate_hours", "gate deadline lengthened"),
        ("escalation_hours", "escalation period lengthened"),
        ("approval_valid_hours", "approvals valid for longer"),
    ]
    for name, words in higher:
        if getattr(new, name) > getattr(old, name):
            looser.append(words)
    if new.trust_threshold < old.trust_threshold:
        looser.append("trust threshold lowered")
    if old.cold_start == "escalate" and new.cold_start != "escalate":
        looser.append("approved steps of agents with no history no longer escalated")
    if new.destructive_quorum < old.destructive_quorum:
        looser.append("destructive quorum lowered")
    if set(new.amount_keys) < set(old.amount_keys) or not set(old.amount_keys) <= set(
        new.amount_keys
    ):
        looser.append("fewer input keys read as amounts")
    if new.approver_group != old.approver_group:
        looser.append("approver group changed")
    if new.escalation_group != old.escalation_group:
        looser.append("escalation group changed")
    return looser


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafFacts:
    """What the server knows about one leaf. Nothing in here comes from the plan's own claims
    about approval."""

    key: str
    agent: str
    tool: str | None = None
    # The tool's registered risk class; None when the tool is not registered.
    tool_risk: str | None = None
    # The risk the plan names (a pack's explicit mark); it can only raise the tool's.
    declared_risk: str | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    # None when the agent is unknown or disabled.
    agent_trust: float | None = None
    strategy: str = ""
    source: str = ""
    depth: int = 0

    @property
    def is_llm_planned(self) -> bool:
        return self.source.startswith("llm") or self.strategy == "llm"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One classifier's verdict on a leaf."""

    classifier: str
    detail: str
    gated: bool = True
    level: str = "low"
    quorum: int = 1
    needs_signature: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Classification:
    """The policy's answer for one leaf: autonomous, or a gate with its reason and terms."""

    key: str
    findings: tuple[Finding, ...]
    approver_group: str
    escalation_group: str

    @property
    def gated(self) -> bool:
        return any(f.gated for f in self.findings)

    @property
    def reasons(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.gated)

    @property
    def reason(self) -> str:
        """Why the leaf is gated, in words ("" when it is not)."""
        return "; ".join(f.detail for f in self.reasons)

    @property
    def level(self) -> str:
        return max((f.level for f in self.reasons), key=LEVELS.index, default="low")

    @property
    def quorum(self) -> int:
        return max((f.quorum for f in self.reasons), default=1)

    @property
    def needs_signature(self) -> bool:
        return any(f.needs_signature for f in self.reasons)


type Classifier = Callable[[LeafFacts, PolicySettings], Finding | None]


def _risk_level(risk: str) -> str:
    if risk in ("financial", "external", "destructive"):
        return "high"
    if risk == "write":
        return "medium"
    return "low"


def effective_risk(facts: LeafFacts) -> str | None:
    """Return the leaf's risk class: the registered one, raised by a declared one.

    Raises ValueError for an unknown tool or an unknown risk class (the caller gates).
    """
    if facts.tool is not None and facts.tool_risk is None:
        raise ValueError(f"unknown tool {facts.tool}")
    risks = [r for r in (facts.tool_risk, facts.declared_risk) if r]
    for risk in risks:
        if risk not in RISK_CLASSES:
            raise ValueError(f"unknown risk class {risk!r}")
    if not risks:
        return None
    return max(risks, key=RISK_CLASSES.index)


def by_risk_class(facts: LeafFacts, settings: PolicySettings) -> Finding | None:
    """Gate steps whose tool (or explicit mark) has a gated risk class."""
    try:
        risk = effective_risk(facts)
    except ValueError as exc:
        return Finding(
            classifier="risk",
            detail=f"{exc}: treated as high risk",
            level="high",
            needs_signature=True,
        )
    if risk is None or risk not in settings.gated_risks:
        return None
    what = f"{risk} tool {facts.tool}" if facts.tool else f"marked {risk} by its pack"
    quorum = settings.destructive_quorum if risk == "destructive" else 1
    return Finding(
        classifier="risk",
        detail=what,
        level=_risk_level(risk),
        quorum=quorum,
        needs_signature=risk in settings.signature_risks,
    )


_NUMBER = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$|^-?\d+(?:\.\d+)?$")
# A currency sign or code around an amount ("$25,000.00", "25,000.00 EUR") is not part of it.
_CURRENCY = re.compile(r"^(?:[A-Za-z]{3}|[$€£¥])\s*|\s*(?:[A-Za-z]{3}|[$€£¥])$")


def _number(text: str) -> Decimal | None:
    text = _CURRENCY.sub("", text.strip()).strip()
    if not _NUMBER.match(text):
        return None
    return Decimal(text.replace(",", ""))


def _amounts(value: Any, keys: tuple[str, ...], path: str = "") -> Iterator[tuple[str, Decimal]]:
    if isinstance(value, Mapping):
        for name, item in value.items():
            yield from _amounts(item, keys, f"{path}.{name}" if path else str(name))
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _amounts(item, keys, f"{path}[{index}]")
        return
    # The name of a value is its key; an item of a list is named by the list's key.
    leaf_name = re.sub(r"(?:\[\d+\])+$", "", path).rsplit(".", 1)[-1].lower()
    if not any(word.lower() in leaf_name for word in keys):
        return
    if isinstance(value, bool):
        return
    if isinstance(value, int | float | Decimal):
        yield path, Decimal(str(value))
    elif isinstance(value, str) and (amount := _number(value)) is not None:
        yield path, amount


def _money(amount: Decimal) -> str:
    return f"{amount:,.2f}".removesuffix(".00")


def by_amount(facts: LeafFacts, settings: PolicySettings) -> Finding | None:
    """Gate steps acting on an amount at or over the threshold (a read-only step only reads it)."""
    if (
        facts.tool is not None
        and facts.tool_risk == "read"
        and facts.declared_risk in (None, "read")
    ):
        return None
    found = [(p, abs(a)) for p, a in _amounts(facts.inputs, settings.amount_keys)]
    if not found:
        return None
    path, amount = max(found, key=lambda item: item[1])
    if amount < settings.amount_threshold:
        return None
    quorum = 2 if amount >= settings.amount_quorum_threshold else 1
    return Finding(
        classifier="amount",
        detail=f"{path} {_money(amount)} at or over {_money(settings.amount_threshold)}",
        level="high" if quorum > 1 else "medium",
        quorum=quorum,
    )


def by_trust(facts: LeafFacts, settings: PolicySettings) -> Finding | None:
    """Gate steps of unknown agents and of agents trusted less than the threshold."""
    if facts.agent_trust is None:
        return Finding(
            classifier="trust", detail=f"unknown or disabled agent {facts.agent}", level="high"
        )
    if facts.agent_trust < settings.trust_threshold:
        return Finding(
            classifier="trust",
            detail=(
                f"agent {facts.agent} trusted {facts.agent_trust:.2f}, under "
                f"{settings.trust_threshold:.2f}"
            ),
            level="medium",
        )
    return None


def by_provenance(facts: LeafFacts, settings: PolicySettings) -> Finding | None:
    """Gate LLM-planned steps at or below the configured depth of decomposition."""
    if facts.is_llm_planned and facts.depth >= settings.llm_depth_threshold:
        return Finding(
            classifier="provenance", detail=f"LLM-planned at depth {facts.depth}", level="medium"
        )
    return None


CLASSIFIERS: tuple[Classifier, ...] = (by_risk_class, by_amount, by_trust, by_provenance)


def classify(
    facts: LeafFacts,
    settings: PolicySettings,
    classifiers: Iterable[Classifier] = CLASSIFIERS,
) -> Classification:
    """Run every classifier on a leaf and combine them; the most restrictive result wins.

    A classifier that raises gates the leaf at high risk with the error in its reason.
    """
    findings = []
    for classifier in classifiers:
        name = getattr(classifier, "__name__", "classifier")
        try:
            finding = classifier(facts, settings)
        except Exception as exc:
            finding = Finding(
                classifier=name,
                detail=f"policy check {name} failed ({type(exc).__name__}): gated to be safe",
                level="high",
            )
        if finding is not None:
            findings.append(finding)
    return Classification(
        key=facts.key,
        findings=tuple(findings),
        approver_group=settings.approver_group,
        escalation_group=settings.escalation_group,
    )


__all__ = [
    "CLASSIFIERS",
    "COLD_START",
    "Classification",
    "Classifier",
    "Finding",
    "LeafFacts",
    "PolicySettings",
    "SettingsInvalid",
    "by_amount",
    "by_provenance",
    "by_risk_class",
    "by_trust",
    "classify",
    "effective_risk",
    "loosening",
]
