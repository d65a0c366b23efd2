"""Planning use cases. Each state change runs in one transaction with its audit events."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

import pydantic
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import close_old_connections, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from audit.chain import NewEvent, append_event, append_events, case_chain
from audit.transitions import audited
from planning import dispatch, rules
from planning.catalogue import (
    DatabaseDecompositionCache,
    all_tool_specs,
    current_catalogue,
    data_port,
    enabled_pack,
)
from planning.core.dag import DagPlan
from planning.core.errors import PlanningError
from planning.core.llm.records import LlmCallRecord
from planning.core.serialize import canonical_json
from planning.core.validation import PlanLimits, validate_plan
from planning.models import (
    LLM_STRATEGIES,
    PACK_STRATEGIES,
    Case,
    CaseStatus,
    LlmCall,
    PlanVersion,
    Strategy,
)
from planning.planner import CallLog, PlanningUnavailable, build_request, llm_settings
from planning.transitions import move_case
from planning.versions import store_version, with_tool_risks

logger = logging.getLogger(__name__)


@dataclass
class CaseInvalid(Exception):
    """The submitted case does not validate; `errors` maps field paths to messages."""

    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def message(self) -> str:
        fields = ", ".join(sorted(self.errors))
        return f"The case is not valid: check {fields}."

    def __str__(self) -> str:
        return self.message


def _validated_inputs(
    domain: str, inputs: Mapping[str, Any], errors: dict[str, list[str]]
) -> dict[str, Any]:
    pack = enabled_pack(domain)
    if pack is None:
        errors.setdefault("domain", []).append(f"Unknown or disabled domain {domain!r}.")
        return dict(inputs)
    # The schema's problems and those against the pack's data (an invoice the ERP does not
    # hold), all at once.
    problems = pack.check_inputs(inputs, data_port(pack))
    if problems:
        for path, messages in problems.items():
            errors.setdefault(path, []).extend(messages)
        return dict(inputs)
    return pack.initial_state(inputs)


@transaction.atomic
def submit_case(
    *,
    submitter: User,
    title: str,
    goal: str,
    description: str = "",
    inputs: Mapping[str, Any] | None = None,
    domain: str = "",
    strategy: str,
    max_depth: int = 2,
) -> Case:
    """Create a case in `planning` and enqueue its planning once the transaction commits.

    Raises PermissionDenied when the user may not submit cases, and CaseInvalid listing every
    invalid field; nothing is written then.
    """
    rules.require_submitter(submitter)
    errors: dict[str, list[str]] = {}
    title, goal, description, domain = (
        (title or "").strip(),
        (goal or "").strip(),
        (description or "").strip(),
        (domain or "").strip(),
    )
    for name, value, limit, required in (
        ("title", title, rules.TITLE_MAX_LENGTH, True),
        ("goal", goal, rules.GOAL_MAX_LENGTH, True),
        ("description", description, rules.DESCRIPTION_MAX_LENGTH, False),
    ):
        if required and not value:
            errors[name] = [f"A {name} is required."]
        elif len(value) > limit:
            errors[name] = [f"At most {limit:,} characters (this has {len(value):,})."]
        elif (problem := rules.text_problem(value)) is not None:
            errors[name] = [problem]
    if strategy not in Strategy.values:
        errors["strategy"] = [f"Choose one of {', '.join(Strategy.values)}."]
    elif strategy in PACK_STRATEGIES and not domain:
        errors["domain"] = [f"The {strategy} strategy plans with a domain pack: choose one."]
    elif reason := rules.unavailable_strategies(
        has_domain=bool(domain), has_provider=llm_settings().is_configured
    ).get(strategy):
        errors["strategy"] = [f"The {strategy} strategy {reason}."]
    if not isinstance(max_depth, int) or isinstance(max_depth, bool):
        errors["max_depth"] = ["Must be a whole number."]
    elif not rules.MIN_DEPTH <= max_depth <= rules.MAX_DEPTH_LIMIT:
        errors["max_depth"] = [f"Must be between {rules.MIN_DEPTH} and {rules.MAX_DEPTH_LIMIT}."]
    if inputs is not None and not isinstance(inputs, Mapping):
        errors["inputs"] = ["Must be a JSON object."]
        inputs = {}
    clean_inputs = dict(inputs or {})
    input_problems = rules.json_problems(clean_inputs, "inputs", bounded=not domain)
    if not domain and not input_problems:
        size = len(canonical_json(clean_inputs))
        if size > rules.INPUTS_MAX_CHARS:
            input_problems["inputs"] = [
                f"At most {rules.INPUTS_MAX_CHARS:,} characters of JSON (this has {size:,})."
            ]
    errors.update(input_problems)
    if domain and not input_problems:
        clean_inputs = _validated_inputs(domain, clean_inputs, errors)
    if errors:
        raise CaseInvalid(errors)

    case = Case.objects.create(
        title=title,
        goal=goal,
        description=description,
        inputs=clean_inputs,
        domain=domain,
        strategy=strategy,
        max_depth=max_depth,
        submitter=submitter,
        status=CaseStatus.PLANNING,
    )
    append_event(
        "planning.case.submitted",
        actor=submitter,
        chain=case_chain(case.pk),
        data={
            "case": case.pk,
            "title": title,
            "goal": goal,
            "domain": domain,
            "strategy": strategy,
            "max_depth": max_depth,
            "inputs": clean_inputs,
        },
    )
    dispatch.enqueue_planning(case.pk)
    return case


# Submission rate -----------------------------------------------------------------------------

RATE_WINDOW = timedelta(minutes=1)
RATE_LIMITED = "planning.case.rate_limited"


@dataclass
class SubmissionRateLimited(Exception):
    """The user has submitted as many cases as the rate allows; one more fits in `retry_after` s."""

    message: str
    retry_after: int

    def __str__(self) -> str:
        return self.message


def check_submission_rate(user: User, strategy: str) -> None:
    """Refuse a submission over the user's rate: so many cases a minute, fewer with the LLM.

    Raises SubmissionRateLimited; the first refusal of a user's minute is audited, later ones
    in the same minute are only answered.
    """
    now = timezone.now()
    recent = Case.objects.filter(submitter=user, created_at__gt=now - RATE_WINDOW)
    limits = [(recent, settings.CASEHUB_SUBMIT_RATE_PER_MINUTE, "cases")]
    if strategy in LLM_STRATEGIES:
        llm = recent.filter(strategy__in=LLM_STRATEGIES)
        limits.append(
            (llm, settings.CASEHUB_SUBMIT_LLM_RATE_PER_MINUTE, "cases planned by the LLM")
        )
    for cases, limit, what in limits:
        times = list(cases.order_by("-created_at").values_list("created_at", flat=True)[:limit])
        if len(times) < limit:
            continue
        # One more fits once the oldest of the last `limit` submissions leaves the window.
        retry_after = max(1, math.ceil((times[-1] + RATE_WINDOW - now).total_seconds()))
        message = (
            f"You may submit at most {limit} {what} a minute. "
            f"Try again in {retry_after} second{'s' if retry_after != 1 else ''}."
        )
        _audit_rate_refusal(user, strategy, limit, retry_after)
        raise SubmissionRateLimited(message, retry_after)


@transaction.atomic
def _audit_rate_refusal(user: User, strategy: str, limit: int, retry_after: int) -> None:
    # One event per user and clock minute in each server process (cache.add is the process's
    # or the shared cache's atomic "first"), so a script hammering the form cannot flood the trail.
    minute = timezone.now().strftime("%Y%m%d%H%M")
    if cache.add(f"casehub:rate-limited:{user.pk}:{minute}", True, timeout=120):
        append_event(
            RATE_LIMITED,
            actor=user,
            data={"strategy": strategy, "limit": limit, "retry_after_s": retry_after},
        )


# Materialising a plan ------------------------------------------------------------------------


class Outcome(StrEnum):
    MATERIALISED = "materialised"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class MaterialiseResult:
    """What one planning run did: stored a version, failed the case, or left it alone (why)."""

    outcome: Outcome
    version: PlanVersion | None = None
    reason: str = ""


def materialise_plan(case_id: int) -> MaterialiseResult:
    """Plan a case with its strategy and store the whole plan as a new version.

    The run first takes the case's planning lease (so a second delivery of the same message, or
    the reconciler, does not plan it twice at once). The planning itself (and its LLM calls) runs
    outside any transaction; the outcome is written in one: on success the version with all its
    nodes and the case in `awaiting_approval`, on failure the case in `plan_failed` with the
    reason and nothing partial. Every LLM call is recorded and audited either way. Idempotent: a
    case no longer planning, or planned by another run that holds the lease, is left alone.
    Raises Case.DoesNotExist for an unknown case.
    """
    claimed = _claim_planning(case_id)
    if isinstance(claimed, str):
        return MaterialiseResult(Outcome.SKIPPED, reason=claimed)
    try:
        return _plan_and_store(case_id)
    except Exception as exc:
        # Storing the outcome failed (a lost database connection, a bug): the run gives its lease
        # back so the reconciler tries again at its next pass, not after the whole lease, and the
        # case fails with a reason once its attempts are used up. Celery logs the error.
        _release_planning(case_id, claimed, exc)
        raise


def _plan_and_store(case_id: int) -> MaterialiseResult:
    calls = CallLog()
    cache = DatabaseDecompositionCache()
    case = Case.objects.get(pk=case_id)
    try:
        request = build_request(case, calls, cache)
        try:
            plan = request.strategy.plan(request.goal, request.state)
        finally:
            request.close()
        validate_plan(plan, current_catalogue(), plan_limits())
        plan = with_tool_risks(plan, {name: spec.risk for name, spec in all_tool_specs().items()})
    except (PlanningError, PlanningUnavailable, pydantic.ValidationError) as exc:
        return _fail_planning(case_id, _reason(exc), calls.records, cache)
    except Exception as exc:
        logger.exception("planning case %s failed unexpectedly", case_id)
        reason = f"Planning failed unexpectedly ({type(exc).__name__})."
        return _fail_planning(case_id, reason, calls.records, cache)
    return _store_plan(case_id, plan, calls.records, cache)


@transaction.atomic
def _claim_planning(case_id: int) -> str | int:
    """Take the case's planning lease; return why not (the run then skips), or the attempt."""
    case = Case.objects.select_for_update().get(pk=case_id)
    now = timezone.now()
    if case.status != CaseStatus.PLANNING:
        return f"the case is {case.status}, not planning"
    if case.planning_lease_until is not None and case.planning_lease_until > now:
        return "another planning run holds the case"
    case.planning_attempts += 1
    case.planning_lease_until = now + timedelta(seconds=settings.CASEHUB_PLANNING_LEASE_S)
    case.save(update_fields=["planning_attempts", "planning_lease_until", "updated_at"])
    append_event(
        "planning.plan.started",
        chain=case_chain(case.pk),
        data={"case": case.pk, "attempt": case.planning_attempts},
    )
    return case.planning_attempts


def _release_planning(case_id: int, attempt: int, exc: Exception) -> None:
    """Give back the lease of a run that raised, if the case is still its own; never raises."""
    try:
        if not transaction.get_connection().in_atomic_block:
            close_old_connections()  # a connection the error broke is replaced, not reused
        with transaction.atomic():
            case = Case.objects.select_for_update().filter(pk=case_id).first()
            if (
                case is None
                or case.status != CaseStatus.PLANNING
                or case.planning_attempts != attempt
                or case.planning_lease_until is None
            ):
                return  # finished, or planned again by a later run: not this run's to release
            case.planning_lease_until = timezone.now()
            case.save(update_fields=["planning_lease_until", "updated_at"])
            append_event(
                "planning.plan.interrupted",
                chain=case_chain(case.pk),
                data={"case": case.pk, "attempt": attempt, "error": type(exc).__name__},
            )
    except Exception:
        # The lease then runs out by itself; the reconciler retries after it.
        logger.exception("planning case %s: could not release the lease", case_id)


def plan_limits() -> PlanLimits:
    return PlanLimits(
        max_leaves=settings.CASEHUB_PLAN_MAX_LEAVES,
        max_fan_out=settings.CASEHUB_PLAN_MAX_FANOUT,
        max_depth=rules.MAX_DEPTH_LIMIT + 3,
    )


def _reason(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        return f"The case inputs no longer fit the domain pack: {exc.error_count()} error(s)."
    return str(exc) or type(exc).__name__


def record_calls(case: Case, records: list[LlmCallRecord]) -> None:
    rows = LlmCall.objects.bulk_create(
        [
            LlmCall(
                case=case,
                model=r.model,
                purpose=r.schema_name,
                prompt=[dict(m) for m in r.messages],
                prompt_hash=r.prompt_hash,
                response=r.response_text,
                response_hash=r.response_hash,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                latency_ms=round(r.latency_s * 1000),
                error=r.error or "",
            )
            for r in sorted(records, key=lambda r: r.started_at)
        ]
    )
    append_events(
        [
            NewEvent(
                "planning.llm.called",
                None,
                {
                    "llm_call": row.pk,
                    "model": row.model,
                    "purpose": row.purpose,
                    "prompt_hash": row.prompt_hash,
                    "response_hash": row.response_hash,
                    "prompt_tokens": row.prompt_tokens,
                    "completion_tokens": row.completion_tokens,
                    "latency_ms": row.latency_ms,
                    "error": row.error,
                },
            )
            for row in rows
        ],
        chain=case_chain(case.pk),
    )


def _finish_run(
    case: Case, records: list[LlmCallRecord], cache: DatabaseDecompositionCache
) -> str | None:
    # A run's LLM calls are recorded even when another run already finished the case (L9).
    record_calls(case, records)
    cache.flush()
    if case.status != CaseStatus.PLANNING:
        return f"the case is {case.status}, not planning"
    return None


def _mark_plan_failed(case: Case, reason: str, **data: int) -> None:
    # Called under the case's row lock, inside the caller's transaction.
    with audited(chain=case_chain(case.pk)) as audit:
        move_case(
            case, to=CaseStatus.PLAN_FAILED, audit=audit, error=reason, planning_lease_until=None
        )
        audit.add(
            NewEvent("planning.plan.failed", None, {"case": case.pk, "reason": reason, **data})
        )
    run_plan_failed_hooks(case)


@transaction.atomic
def _fail_planning(
    case_id: int, reason: str, records: list[LlmCallRecord], cache: DatabaseDecompositionCache
) -> MaterialiseResult:
    case = Case.objects.select_for_update().get(pk=case_id)
    if (skipped := _finish_run(case, records, cache)) is not None:
        return MaterialiseResult(Outcome.SKIPPED, reason=skipped)
    _mark_plan_failed(case, reason, llm_calls=len(records))
    return MaterialiseResult(Outcome.FAILED, reason=reason)


@transaction.atomic
def _store_plan(
    case_id: int, plan: DagPlan, records: list[LlmCallRecord], cache: DatabaseDecompositionCache
) -> MaterialiseResult:
    case = Case.objects.select_for_update().get(pk=case_id)
    if (skipped := _finish_run(case, records, cache)) is not None:
        return MaterialiseResult(Outcome.SKIPPED, reason=skipped)
    version = store_version(case, plan)
    with audited(chain=case_chain(case.pk)) as audit:
        move_case(
            case,
            to=CaseStatus.AWAITING_APPROVAL,
            audit=audit,
            current_version=version,
            error="",
            planning_lease_until=None,
        )
        audit.add(
            NewEvent(
                "planning.plan.materialised",
                None,
                {
                    "case": case.pk,
                    "version": version.number,
                    "content_hash": version.content_hash,
                    "strategy": case.strategy,
                    "leaves": version.leaf_count,
                    "llm_calls": version.llm_calls,
                    "warnings": version.warnings,
                    "critical_path": list(plan.critical_path()),
                    "width": version.width,
                },
            )
        )
    run_version_hooks(version)
    return MaterialiseResult(Outcome.MATERIALISED, version=version)


def run_version_hooks(version: PlanVersion) -> None:
    """Call each of `CASEHUB_PLAN_VERSION_HOOKS` on a version just stored, in its transaction.

    This is how the version's gates open in the transaction that stores it, while planning never
    imports oversight: the hooks are configuration (oversight's `open_gates`).
    """
    for path in settings.CASEHUB_PLAN_VERSION_HOOKS:
        import_string(path)(version)


def run_plan_failed_hooks(case: Case) -> None:
    """Call each of `CASEHUB_PLAN_FAILED_HOOKS` on a case whose planning just failed, in its
    transaction.

    This is how the submitter hears of it (oversight's notification) while planning never
    imports oversight.
    """
    for path in settings.CASEHUB_PLAN_FAILED_HOOKS:
        import_string(path)(case)


# Recovering lost planning --------------------------------------------------------------------


@transaction.atomic
def reconcile_planning() -> list[int]:
    """Re-enqueue the cases stuck in `planning`; fail those that used up their attempts.

    A case is stuck when no run took it within one reconcile interval of its submission (its
    message was lost) or its run's lease expired (the worker died). Returns the re-enqueued ids.
    """
    now = timezone.now()
    unclaimed_since = now - timedelta(seconds=settings.CASEHUB_RECONCILE_INTERVAL_S)
    stuck = (
        Case.objects.select_for_update(skip_locked=True)
        .filter(status=CaseStatus.PLANNING)
        .filter(
            Q(planning_lease_until__lt=now)
            | Q(planning_lease_until__isnull=True, updated_at__lt=unclaimed_since)
        )
        .order_by("pk")
    )
    requeued: list[int] = []
    for case in stuck:
        if case.planning_attempts >= settings.CASEHUB_PLANNING_MAX_ATTEMPTS:
            reason = (
                f"Planning did not finish after {case.planning_attempts} attempts (the workers "
                "running it stopped or failed; the audit trail names each attempt). Submit the "
                "case again."
            )
            _mark_plan_failed(case, reason, attempts=case.planning_attempts)
            continue
        lost = "lease expired" if case.planning_lease_until is not None else "never started"
        case.planning_lease_until = None
        # Touch updated_at so an unclaimed case waits a full interval before the next resend.
        case.save(update_fields=["planning_lease_until", "updated_at"])
        append_event(
            "planning.plan.requeued",
            chain=case_chain(case.pk),
            data={"case": case.pk, "attempts": case.planning_attempts, "why": lost},
        )
        dispatch.enqueue_planning(case.pk)
        requeued.append(case.pk)
    return requeued


__all__ = [
    "CaseInvalid",
    "MaterialiseResult",
    "Outcome",
    "materialise_plan",
    "reconcile_planning",
    "submit_case",
]
