"""Planning's part of the JSON API: cases (a ninja Router).

The agents are listed by execution's router, with the trust it learned from their outcomes.

A case's plan is read and edited through oversight's plans router (its nodes carry their gates).

`casehub/api.py` mounts this router on the one NinjaAPI, which authenticates every request
(bearer tokens), parses bodies strictly and turns errors into JSON. The schemas every router
shares (error bodies, bounded pagination) live here too, at the bottom of the app stack, so
that the NinjaAPI and oversight's router import them without an import running back up.
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

from datetime import datetime
from typing import Annotated, Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import LimitOffsetPagination, paginate
from pydantic import ConfigDict, Strict

from planning import actions, rules
from planning.models import Case, CaseStatus, Strategy
from planning.queries import case_for, visible_cases

# Shared by every router ---------------------------------------------------------------------

# A page holds at most this many items; an offset past this is refused rather than sent to the
# database, where a value beyond 2**63 overflows.
PAGE_MAX_LIMIT = 200
PAGE_DEFAULT_LIMIT = 100
PAGE_MAX_OFFSET = 2**31 - 1


class Message(Schema):
    message: str


class ValidationMessage(Schema):
    message: str
    fields: dict[str, list[str]] = Field(
        description="Messages by dotted field path; `__all__` for the request as a whole."
    )


class ServerError(Schema):
    message: str
    error_id: str = Field(description="Quote it to an administrator: the log has the details.")


class Page(LimitOffsetPagination):
    """Limit/offset pagination whose bounds are in the schema: out of range is a 422."""

    class Input(Schema):
        limit: int = Field(PAGE_DEFAULT_LIMIT, ge=1, le=PAGE_MAX_LIMIT)
        offset: int = Field(0, ge=0, le=PAGE_MAX_OFFSET)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_limit=PAGE_MAX_LIMIT, **kwargs)


def request_user(request: HttpRequest) -> User:
    """Return the user the API authenticated the request as."""
    return request.auth  # type: ignore[attr-defined]


router = Router()


# Schemas ------------------------------------------------------------------------------------


class CaseIn(Schema):
    # Fields the server owns (status, submitter, risk, ...) are refused by name, not ignored.
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=rules.TITLE_MAX_LENGTH)
    goal: str = Field(min_length=1, max_length=rules.GOAL_MAX_LENGTH)
    description: str = Field("", max_length=rules.DESCRIPTION_MAX_LENGTH)
    inputs: dict[str, Any] = Field(
        default_factory=dict,
        description="Checked by the domain pack's schema; without a domain, at most "
        f"{rules.INPUTS_MAX_ITEMS} values nested {rules.INPUTS_MAX_NESTING} levels deep, keys of "
        f"at most {rules.INPUTS_MAX_KEY_LENGTH} characters, {rules.INPUTS_MAX_CHARS:,} "
        "characters of JSON in all.",
    )
    domain: str | None = Field(
        None,
        max_length=Case._meta.get_field("domain").max_length,
        description="Domain pack slug; without one the llm or hybrid strategy plans from "
        "the goal and description.",
    )
    strategy: Strategy
    max_depth: Annotated[int, Strict()] = Field(
        rules.DEFAULT_MAX_DEPTH, ge=rules.MIN_DEPTH, le=rules.MAX_DEPTH_LIMIT
    )


class CaseOut(Schema):
    id: int
    title: str
    goal: str
    description: str
    inputs: dict[str, Any]
    status: CaseStatus
    domain: str | None
    strategy: Strategy
    max_depth: int
    submitter: str
    created_at: datetime
    error: str | None = Field(None, description="Why planning or execution failed; null otherwise.")
    plan_version: int | None = Field(None, description="Number of the current plan version.")
    verification: dict[str, Any] | None = Field(
        None, description="Goal-level verification once the case ended: passed, reasons, checks."
    )
    finished_at: datetime | None = None

    @staticmethod
    def resolve_domain(case: Case) -> str | None:
        return case.domain or None

    @staticmethod
    def resolve_submitter(case: Case) -> str:
        return case.submitter.get_username()

    @staticmethod
    def resolve_error(case: Case) -> str | None:
        return case.error or None

    @staticmethod
    def resolve_verification(case: Case) -> dict[str, Any] | None:
        return case.verification or None

    @staticmethod
    def resolve_plan_version(case: Case) -> int | None:
        return case.current_version.number if case.current_version is not None else None


class CaseFilters(Schema):
    status: CaseStatus | None = None
    domain: str | None = Field(None, max_length=Case._meta.get_field("domain").max_length)


# Endpoints ----------------------------------------------------------------------------------
# The NinjaAPI documents the refusals every operation shares (400, 401, 413, 422, 500); the
# responses below are the ones these endpoints decide themselves.


@router.post(
    "/cases",
    response={201: CaseOut, 403: Message, 429: Message},
    tags=["cases"],
    summary="Submit a case; it is planned in the background",
)
def create_case(request: HttpRequest, payload: CaseIn) -> Any:
    """Submit a case and enqueue its planning.

    403 unless you are an analyst; 422 naming every invalid field, and nothing is written; 429
    with Retry-After over the submission rate (CASEHUB_SUBMIT_RATE_PER_MINUTE and, for `llm` and
    `hybrid`, CASEHUB_SUBMIT_LLM_RATE_PER_MINUTE).
    """
    user = request_user(request)
    actions.check_submission_rate(user, payload.strategy.value)
    case = actions.submit_case(
        submitter=user,
        title=payload.title,
        goal=payload.goal,
        description=payload.description,
        inputs=payload.inputs,
        domain=payload.domain or "",
        strategy=payload.strategy.value,
        max_depth=payload.max_depth,
    )
    return Status(201, visible_cases(user).get(pk=case.pk))


@router.get(
    "/cases",
    response=list[CaseOut],
    tags=["cases"],
    summary="List the cases you may read, newest first",
)
@paginate(Page)
def list_cases(request: HttpRequest, filters: Query[CaseFilters]) -> Any:
    """List the cases you may read, paginated: analysts their own, officers and auditors all."""
    cases = visible_cases(request_user(request))
    if filters.status is not None:
        cases = cases.filter(status=filters.status)
    if filters.domain is not None:
        cases = cases.filter(domain=filters.domain)
    return cases


@router.get(
    "/cases/{int:case_id}",
    response={200: CaseOut, 404: Message},
    tags=["cases"],
    summary="Read one case",
)
def get_case(request: HttpRequest, case_id: int) -> Any:
    """Return one case.

    404 when it does not exist or is not yours to read (the same answer either way).
    """
    return case_for(request_user(request), case_id)
