"""Planning-quality metrics: per case, per strategy and pack, per gate kind, and over time.

Each figure of a case is aggregated by the database (one query for every case of the period,
its plan, LLM calls, leaves, attempts and gates as subqueries), so the number of queries does
not grow with the number of cases, leaves, calls or gates. Python then only groups those case
rows by strategy, pack and period bucket, prices the tokens per model (`PriceTable.cost`) and
walks each executed plan's dependency graph for its critical path in time. Nothing here writes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from django.conf import settings
from django.db.models import (
    CharField,
    Count,
    DateTimeField,
    Exists,
    F,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Concat, TruncDate, TruncWeek
from django.utils import timezone

from audit.models import AuditEvent
from execution.models import LeafAttempt
from oversight.models import Gate, GateKind, GateStatus
from planning.catalogue import registered_packs
from planning.core.llm.pricing import PriceTable
from planning.models import Case, CaseStatus, LlmCall, NodeStatus, PlanNode, PlanVersion, Strategy

__all__ = [
    "CASE_TABLE_LIMIT",
    "NO_PACK",
    "PERIODS",
    "CaseQuality",
    "FilterInvalid",
    "GateRates",
    "GroupQuality",
    "ModelUsage",
    "QualityFilter",
    "QualityReport",
    "SeriesPoint",
    "case_quality",
    "parse_filter",
    "quality_report",
]

# Periods offered in the URL, in days (None: since the first case).
PERIODS: dict[str, int | None] = {"7d": 7, "30d": 30, "90d": 90, "all": None}
DEFAULT_PERIOD = "30d"
# `pack=none` selects the cases planned without a domain pack (LLM and hybrid plans).
NO_PACK = "none"
# The page lists at most this many cases (the newest); the CSV and every aggregate hold all.
CASE_TABLE_LIMIT = 200
PLANNING_STARTED = "planning.plan.started"
# Cases whose leaves may all have ended: their makespan and critical path in time are final.
ENDED_EXECUTION = (CaseStatus.VERIFYING, CaseStatus.COMPLETED, CaseStatus.FAILED)
ENDED_LEAF = (NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.SKIPPED)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

type Bucket = Literal["day", "week"]


class FilterInvalid(ValueError):
    """A filter in the URL is not one the page knows (the message says which and why)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class QualityFilter:
    """Which cases the figures cover: created in [since, until), of a pack and a strategy."""

    period: str = DEFAULT_PERIOD
    since: datetime | None = None
    until: datetime | None = None
    pack: str = ""
    strategy: str = ""
    bucket: Bucket = "day"

    def as_query(self) -> dict[str, str]:
        """Return the URL parameters that select these cases again."""
        query = {"period": self.period}
        if self.period == "custom":
            query = {}
            if self.since is not None:
                query["from"] = timezone.localtime(self.since).date().isoformat()
            if self.until is not None:
                day = timezone.localtime(self.until).date() - timedelta(days=1)
                query["to"] = day.isoformat()
        if self.pack:
            query["pack"] = self.pack
        if self.strategy:
            query["strategy"] = self.strategy
        return query


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime(day.year, day.month, day.day))


def _parse_day(name: str, text: str) -> date:
    if not _DATE.match(text):
        raise FilterInvalid(name, f"{text[:40]!r} is not a date (YYYY-MM-DD)")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise FilterInvalid(name, f"{text[:40]!r} is not a date (YYYY-MM-DD)") from None


def parse_filter(params: Mapping[str, str], *, now: datetime | None = None) -> QualityFilter:
    """Return the filter the URL asks for: `period=7d|30d|90d|all` or `from=`/`to=` dates
    (inclusive), `pack=` (a pack slug or `none`), `strategy=`.

    Raises FilterInvalid naming the parameter for an unknown period, pack or strategy, a
    malformed date, a period given with dates, or `from` after `to`.
    """
    now = now or timezone.now()
    pack = (params.get("pack") or "").strip()
    if pack and pack != NO_PACK and pack not in registered_packs():
        known = ", ".join(sorted(registered_packs()))
        raise FilterInvalid("pack", f"unknown pack {pack[:40]!r} (known: {known}, or none)")
    strategy = (params.get("strategy") or "").strip()
    if strategy and strategy not in Strategy.values:
        known = ", ".join(Strategy.values)
        raise FilterInvalid("strategy", f"unknown strategy {strategy[:40]!r} (known: {known})")
    first, last = (params.get("from") or "").strip(), (params.get("to") or "").strip()
    period = (params.get("period") or "").strip()
    if first or last:
        if period:
            raise FilterInvalid("period", "give either a period or from/to dates, not both")
        since = _day_start(_parse_day("from", first)) if first else None
        until = _day_start(_parse_day("to", last) + timedelta(days=1)) if last else None
        if since is not None and until is not None and since >= until:
            raise FilterInvalid("from", "the first day is after the last")
        start = since or until or now
        span = ((until or now) - start).days
        bucket: Bucket = "day" if span <= 31 else "week"
        return QualityFilter(
            period="custom", since=since, until=until, pack=pack, strategy=strategy, bucket=bucket
        )
    period = period or DEFAULT_PERIOD
    if period not in PERIODS:
        raise FilterInvalid("period", f"unknown period {period[:40]!r} (known: 7d, 30d, 90d, all)")
    days = PERIODS[period]
    since = None
    if days is not None:
        since = _day_start(timezone.localtime(now).date() - timedelta(days=days - 1))
    return QualityFilter(
        period=period,
        since=since,
        pack=pack,
        strategy=strategy,
        bucket="day" if days is not None and days <= 31 else "week",
    )


# Rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseQuality:
    """One case's figures (None: not known yet, e.g. no plan or not executed)."""

    case_id: int
    title: str
    pack: str
    strategy: str
    status: str
    created_at: datetime
    version: int | None
    versions: int
    leaves: int | None
    depth: int | None
    width: int | None
    critical_path: int | None
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    cost: Decimal | None
    unpriced_models: tuple[str, ...]
    planning_s: float | None
    approval_s: float | None
    leaves_succeeded: int
    leaves_failed: int
    attempts: int
    retries: int
    makespan_s: float | None
    path_s: float | None
    verified: bool | None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def ratio(self) -> float | None:
        """Makespan ÷ critical path in time (1.0: no wait beyond the longest chain)."""
        if self.makespan_s is None or not self.path_s:
            return None
        return self.makespan_s / self.path_s

    @property
    def leaf_success(self) -> float | None:
        ended = self.leaves_succeeded + self.leaves_failed
        return self.leaves_succeeded / ended if ended else None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupQuality:
    """The cases of one strategy or pack, summed or averaged (means over the cases that have
    the figure)."""

    key: str
    cases: int
    mean_leaves: float | None
    mean_depth: float | None
    mean_width: float | None
    mean_critical_path: float | None
    llm_calls: int
    tokens: int
    mean_latency_ms: float | None
    cost: Decimal
    unpriced_models: tuple[str, ...]
    mean_planning_s: float | None
    mean_approval_s: float | None
    leaf_success: float | None
    retries: int
    mean_ratio: float | None
    verified: int
    verification_runs: int

    @property
    def verified_rate(self) -> float | None:
        return self.verified / self.verification_runs if self.verification_runs else None


@dataclass(frozen=True, slots=True, kw_only=True)
class GateRates:
    """How the gates of one kind and one strategy, pack or agent were closed."""

    dimension: str
    value: str
    kind: str
    approved: int
    rejected: int
    edited: int

    @property
    def decided(self) -> int:
        return self.approved + self.rejected + self.edited

    @property
    def edit_rate(self) -> float | None:
        return self.edited / self.decided if self.decided else None

    @property
    def reject_rate(self) -> float | None:
        return self.rejected / self.decided if self.decided else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelUsage:
    """LLM calls and tokens of one model, and what they cost (None: price unknown)."""

    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesPoint:
    """One day or week: the cases created then and the gates opened then."""

    start: date
    cases: int
    mean_leaves: float | None
    tokens: int
    cost: Decimal
    unpriced: bool
    verified: int
    verification_runs: int
    gates_decided: int
    gates_edited: int
    gates_rejected: int

    @property
    def verified_rate(self) -> float | None:
        return self.verified / self.verification_runs if self.verification_runs else None

    @property
    def edit_rate(self) -> float | None:
        return self.gates_edited / self.gates_decided if self.gates_decided else None

    @property
    def reject_rate(self) -> float | None:
        return self.gates_rejected / self.gates_decided if self.gates_decided else None


@dataclass(frozen=True, slots=True, kw_only=True)
class QualityReport:
    filter: QualityFilter
    cases: list[CaseQuality]
    strategies: list[GroupQuality]
    packs: list[GroupQuality]
    gates: list[GateRates]
    models: list[ModelUsage]
    series: list[SeriesPoint]
    totals: GroupQuality | None = field(default=None)


# Queries -------------------------------------------------------------------------------------


def _filtered_cases(f: QualityFilter) -> QuerySet[Case]:
    cases = Case.objects.all()
    if f.since is not None:
        cases = cases.filter(created_at__gte=f.since)
    if f.until is not None:
        cases = cases.filter(created_at__lt=f.until)
    if f.pack == NO_PACK:
        cases = cases.filter(domain="")
    elif f.pack:
        cases = cases.filter(domain=f.pack)
    if f.strategy:
        cases = cases.filter(strategy=f.strategy)
    return cases


def _one(rows: QuerySet[Any], output: Any, **aggregate: Any) -> Subquery:
    # One aggregated value per outer row: group by nothing (a constant), keep the aggregate.
    grouped = rows.order_by().annotate(_g=Value(1)).values("_g").annotate(**aggregate)
    return Subquery(grouped.values(*aggregate)[:1], output_field=output)


def _annotated(cases: QuerySet[Case]) -> QuerySet[Case]:
    version = OuterRef("current_version")
    leaves = PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF)
    calls = LlmCall.objects.filter(case=OuterRef("pk"))
    integer = IntegerField()
    when = DateTimeField()
    first_version = PlanVersion.objects.filter(case=OuterRef("pk"), number=1)
    started = AuditEvent.objects.filter(
        chain=OuterRef("chain_name"), action=PLANNING_STARTED, time__lte=OuterRef("planned_at")
    ).order_by("-seq")
    approved = Gate.objects.filter(
        case=OuterRef("pk"), kind=GateKind.PLAN, status=GateStatus.APPROVED
    ).order_by("decided_at")
    attempts = LeafAttempt.objects.filter(node__version=version)
    return cases.annotate(
        chain_name=Concat(Value("case:"), Cast("pk", CharField()), output_field=CharField()),
        version_number=F("current_version__number"),
        leaf_total=F("current_version__leaf_count"),
        plan_width=F("current_version__width"),
        plan_critical_path=F("current_version__critical_path"),
        version_count=_one(PlanVersion.objects.filter(case=OuterRef("pk")), integer, n=Count("id")),
        plan_depth=_one(leaves, integer, n=Max("depth")),
        call_count=Coalesce(_one(calls, integer, n=Count("id")), 0),
        prompt_total=Coalesce(_one(calls, integer, n=Sum("prompt_tokens")), 0),
        completion_total=Coalesce(_one(calls, integer, n=Sum("completion_tokens")), 0),
        latency_total=Coalesce(_one(calls, integer, n=Sum("latency_ms")), 0),
        planned_at=Subquery(first_version.values("created_at")[:1], output_field=when),
        planning_started_at=Subquery(started.values("time")[:1], output_field=when),
        approved_at=Subquery(approved.values("decided_at")[:1], output_field=when),
        succeeded_total=Coalesce(
            _one(leaves.filter(status=NodeStatus.SUCCEEDED), integer, n=Count("id")), 0
        ),
        failed_total=Coalesce(
            _one(leaves.filter(status=NodeStatus.FAILED), integer, n=Count("id")), 0
        ),
        attempt_total=Coalesce(_one(attempts, integer, n=Count("id")), 0),
        attempted_leaves=Coalesce(_one(attempts, integer, n=Count("node", distinct=True)), 0),
        first_start=_one(leaves, when, n=Min("started_at")),
        last_finish=_one(leaves, when, n=Max("finished_at")),
        unfinished=Coalesce(_one(leaves.exclude(status__in=ENDED_LEAF), integer, n=Count("id")), 0),
    )


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def _critical_paths(version_ids: Sequence[int]) -> dict[int, float]:
    """Return, per plan version, the longest chain of leaf run times through `depends_on`
    (seconds; a leaf that never ran counts zero). One query for all versions."""
    if not version_ids:
        return {}
    leaves = PlanNode.objects.filter(
        version_id__in=version_ids, kind=PlanNode.Kind.LEAF
    ).values_list("version_id", "key", "depends_on", "started_at", "finished_at", "position")
    by_version: dict[int, list[tuple[str, list[str], float, int]]] = defaultdict(list)
    for version_id, key, depends_on, started, finished, position in leaves:
        duration = _seconds(finished, started) or 0.0
        by_version[version_id].append((key, list(depends_on or []), max(duration, 0.0), position))
    return {version_id: _longest_path(rows) for version_id, rows in by_version.items()}


def _longest_path(leaves: Iterable[tuple[str, list[str], float, int]]) -> float:
    rows = {key: (deps, duration) for key, deps, duration, _ in leaves}
    finish: dict[str, float] = {}

    def finish_of(key: str, seen: frozenset[str]) -> float:
        if key in finish:
            return finish[key]
        deps, duration = rows[key]
        # A stored plan is a DAG (validated before it is stored); `seen` guards a broken row.
        before = [finish_of(d, seen | {key}) for d in deps if d in rows and d not in seen]
        finish[key] = max(before, default=0.0) + duration
        return finish[key]

    return max((finish_of(key, frozenset()) for key in rows), default=0.0)


@dataclass(slots=True)
class _Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _usage_by_case(cases: QuerySet[Case]) -> dict[int, dict[str, _Usage]]:
    rows = (
        LlmCall.objects.filter(case__in=cases.values("pk"))
        .order_by()
        .values("case_id", "model")
        .annotate(n=Count("id"), p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    )
    usage: dict[int, dict[str, _Usage]] = defaultdict(dict)
    for row in rows:
        usage[row["case_id"]][row["model"]] = _Usage(row["n"], row["p"] or 0, row["c"] or 0)
    return usage


def _price_table() -> PriceTable:
    table = getattr(settings, "CASEHUB_LLM_PRICE_TABLE", None)
    return table if isinstance(table, PriceTable) else PriceTable()


def _cost(usage: Mapping[str, _Usage], prices: PriceTable) -> tuple[Decimal, tuple[str, ...]]:
    total = Decimal(0)
    unpriced: list[str] = []
    for model, used in sorted(usage.items()):
        cost = prices.cost(model, used.prompt_tokens, used.completion_tokens)
        if cost is None:
            unpriced.append(model)
        else:
            total += cost
    return total, tuple(unpriced)


def _verified(case: Case, leaves_failed: int) -> bool | None:
    # Only a case whose steps all ran through to the goal checks was verified at goal level.
    if case.status not in (CaseStatus.COMPLETED, CaseStatus.FAILED) or leaves_failed:
        return None
    verification = case.verification if isinstance(case.verification, dict) else {}
    passed = verification.get("passed")
    return passed if isinstance(passed, bool) else None


def _case_rows(cases: QuerySet[Case], prices: PriceTable) -> list[CaseQuality]:
    usage = _usage_by_case(cases)
    annotated: list[Any] = list(_annotated(cases).order_by("-created_at", "-id"))
    ended = [
        c.current_version_id
        for c in annotated
        if c.status in ENDED_EXECUTION and c.current_version_id is not None and not c.unfinished
    ]
    paths = _critical_paths(ended)
    rows = []
    for c in annotated:
        cost, unpriced = _cost(usage.get(c.pk, {}), prices)
        path_s = paths.get(c.current_version_id) if c.current_version_id in ended else None
        makespan = _seconds(c.last_finish, c.first_start) if path_s is not None else None
        rows.append(
            CaseQuality(
                case_id=c.pk,
                title=c.title,
                pack=c.domain,
                strategy=c.strategy,
                status=c.status,
                created_at=c.created_at,
                version=c.version_number,
                versions=c.version_count or 0,
                leaves=c.leaf_total,
                depth=c.plan_depth,
                width=c.plan_width,
                critical_path=c.plan_critical_path,
                llm_calls=c.call_count,
                prompt_tokens=c.prompt_total,
                completion_tokens=c.completion_total,
                latency_ms=c.latency_total,
                cost=None if unpriced else cost,
                unpriced_models=unpriced,
                planning_s=_seconds(c.planned_at, c.planning_started_at),
                approval_s=_seconds(c.approved_at, c.planned_at),
                leaves_succeeded=c.succeeded_total,
                leaves_failed=c.failed_total,
                attempts=c.attempt_total,
                retries=c.attempt_total - c.attempted_leaves,
                makespan_s=makespan,
                path_s=path_s,
                verified=_verified(c, c.failed_total),
            )
        )
    return rows


def _mean(values: Iterable[float | int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _group(key: str, rows: Sequence[CaseQuality]) -> GroupQuality:
    calls = sum(r.llm_calls for r in rows)
    succeeded = sum(r.leaves_succeeded for r in rows)
    ended = succeeded + sum(r.leaves_failed for r in rows)
    runs = [r.verified for r in rows if r.verified is not None]
    cost = Decimal(0)
    unpriced: set[str] = set()
    for r in rows:
        unpriced.update(r.unpriced_models)
        if r.cost is not None:
            cost += r.cost
    return GroupQuality(
        key=key,
        cases=len(rows),
        mean_leaves=_mean(r.leaves for r in rows),
        mean_depth=_mean(r.depth for r in rows),
        mean_width=_mean(r.width for r in rows),
        mean_critical_path=_mean(r.critical_path for r in rows),
        llm_calls=calls,
        tokens=sum(r.tokens for r in rows),
        mean_latency_ms=sum(r.latency_ms for r in rows) / calls if calls else None,
        cost=cost,
        unpriced_models=tuple(sorted(unpriced)),
        mean_planning_s=_mean(r.planning_s for r in rows),
        mean_approval_s=_mean(r.approval_s for r in rows),
        leaf_success=succeeded / ended if ended else None,
        retries=sum(r.retries for r in rows),
        mean_ratio=_mean(r.ratio for r in rows),
        verified=sum(1 for v in runs if v),
        verification_runs=len(runs),
    )


def _groups(rows: Sequence[CaseQuality], key: Callable[[CaseQuality], str]) -> list[GroupQuality]:
    grouped: dict[str, list[CaseQuality]] = defaultdict(list)
    for row in rows:
        grouped[key(row)].append(row)
    return [_group(name, grouped[name]) for name in sorted(grouped)]


def _gates(cases: QuerySet[Case]) -> QuerySet[Gate]:
    """The gates of these cases, each marked with whether an edit replaced it.

    An edit makes the next version (number + 1, `edited_by` set) and voids the old version's
    open gates: the old plan gate was closed by the edit, and so was the step gate of the step
    edited (the other steps' gates are opened again, or carried, on the new version). Carried
    gates copy an earlier approval and are not counted again.
    """
    next_edit = PlanVersion.objects.filter(
        case=OuterRef("case"), number=OuterRef("version__number") + 1, edited_by__isnull=False
    )
    return (
        Gate.objects.filter(
            case__in=cases.values("pk"),
            kind__in=(GateKind.PLAN, GateKind.STEP),
            carried_from__isnull=True,
        )
        .annotate(
            replaced_by_edit=Exists(next_edit),
            step_edited=Exists(
                next_edit.annotate(edited_node=KeyTextTransform("node", "edit")).filter(
                    edited_node=OuterRef("node__key")
                )
            ),
        )
        .order_by()
    )


_EDITED = Q(status=GateStatus.VOID) & (
    Q(kind=GateKind.PLAN, replaced_by_edit=True) | Q(kind=GateKind.STEP, step_edited=True)
)
_COUNTS = {
    "approved": Count("id", filter=Q(status=GateStatus.APPROVED)),
    "rejected": Count("id", filter=Q(status=GateStatus.REJECTED)),
    "edited": Count("id", filter=_EDITED),
}
_DIMENSIONS = {"strategy": "case__strategy", "pack": "case__domain", "agent": "node__agent"}


def _gate_rates(cases: QuerySet[Case]) -> list[GateRates]:
    rates: list[GateRates] = []
    for dimension, column in _DIMENSIONS.items():
        gates = _gates(cases)
        if dimension == "agent":
            gates = gates.filter(kind=GateKind.STEP)
        rows = gates.values(column, "kind").annotate(**_COUNTS).order_by(column, "kind")
        for row in rows:
            rates.append(
                GateRates(
                    dimension=dimension,
                    value=row[column] or "",
                    kind=row["kind"],
                    approved=row["approved"],
                    rejected=row["rejected"],
                    edited=row["edited"],
                )
            )
    return rates


def _bucket_of(moment: datetime, bucket: Bucket) -> date:
    day = timezone.localtime(moment).date()
    return day - timedelta(days=day.weekday()) if bucket == "week" else day


def _buckets(f: QualityFilter, rows: Sequence[CaseQuality], now: datetime) -> list[date]:
    first = f.since or (min(r.created_at for r in rows) if rows else None)
    if first is None:
        return []
    last = (f.until - timedelta(microseconds=1)) if f.until is not None else now
    start, end = _bucket_of(first, f.bucket), _bucket_of(last, f.bucket)
    step = timedelta(days=7 if f.bucket == "week" else 1)
    days = []
    while start <= end:
        days.append(start)
        start += step
    return days


def _series(
    f: QualityFilter, cases: QuerySet[Case], rows: Sequence[CaseQuality], now: datetime
) -> list[SeriesPoint]:
    trunc = TruncWeek if f.bucket == "week" else TruncDate
    gate_rows = (
        _gates(cases)
        .annotate(bucket=trunc("opened_at"))
        .values("bucket")
        .annotate(**_COUNTS)
        .order_by("bucket")
    )
    gates: dict[date, dict[str, Any]] = {}
    for counted in gate_rows:
        opened: Any = counted["bucket"]
        gates[opened.date() if isinstance(opened, datetime) else opened] = dict(counted)
    by_bucket: dict[date, list[CaseQuality]] = defaultdict(list)
    for row in rows:
        by_bucket[_bucket_of(row.created_at, f.bucket)].append(row)
    points = []
    for start in _buckets(f, rows, now):
        members = by_bucket.get(start, [])
        runs = [r.verified for r in members if r.verified is not None]
        counts = gates.get(start, {})
        approved, rejected = counts.get("approved", 0), counts.get("rejected", 0)
        edited = counts.get("edited", 0)
        points.append(
            SeriesPoint(
                start=start,
                cases=len(members),
                mean_leaves=_mean(r.leaves for r in members),
                tokens=sum(r.tokens for r in members),
                cost=sum((r.cost for r in members if r.cost is not None), Decimal(0)),
                unpriced=any(r.unpriced_models for r in members),
                verified=sum(1 for v in runs if v),
                verification_runs=len(runs),
                gates_decided=approved + rejected + edited,
                gates_edited=edited,
                gates_rejected=rejected,
            )
        )
    return points


def _models(cases: QuerySet[Case], prices: PriceTable) -> list[ModelUsage]:
    rows = (
        LlmCall.objects.filter(case__in=cases.values("pk"))
        .order_by()
        .values("model")
        .annotate(n=Count("id"), p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
        .order_by("model")
    )
    return [
        ModelUsage(
            model=row["model"],
            calls=row["n"],
            prompt_tokens=row["p"] or 0,
            completion_tokens=row["c"] or 0,
            cost=prices.cost(row["model"], row["p"] or 0, row["c"] or 0),
        )
        for row in rows
    ]


def quality_report(f: QualityFilter, *, now: datetime | None = None) -> QualityReport:
    """Return every figure of the cases the filter selects, in a constant number of queries."""
    now = now or timezone.now()
    prices = _price_table()
    cases = _filtered_cases(f)
    rows = _case_rows(cases, prices)
    return QualityReport(
        filter=f,
        cases=rows,
        strategies=_groups(rows, lambda r: r.strategy),
        packs=_groups(rows, lambda r: r.pack or NO_PACK),
        gates=_gate_rates(cases),
        models=_models(cases, prices),
        series=_series(f, cases, rows, now),
        totals=_group("all", rows) if rows else None,
    )


def case_quality(case_id: int) -> tuple[CaseQuality, list[GateRates]] | None:
    """Return one case's figures and its gates' outcomes by kind, or None when no such case."""
    cases = Case.objects.filter(pk=case_id)
    rows = _case_rows(cases, _price_table())
    if not rows:
        return None
    counted: list[Any] = list(_gates(cases).values("kind").annotate(**_COUNTS).order_by("kind"))
    gates = [
        GateRates(
            dimension="case",
            value=str(case_id),
            kind=row["kind"],
            approved=row["approved"],
            rejected=row["rejected"],
            edited=row["edited"],
        )
        for row in counted
    ]
    return rows[0], gates
