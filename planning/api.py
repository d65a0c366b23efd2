"""The JSON API (django-ninja): bearer tokens, agents, cases and their plans.

Every endpoint but `POST /api/auth/token` requires `Authorization: Bearer <token>`. Errors are JSON:
`{"message": ...}`, plus `"fields": {"path": [...]}` on a 422. The views are exempt from
LoginRequiredMiddleware (they redirect nobody to a login page; they answer 401 instead).
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

import logging
from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import Any, Literal

from django.contrib.auth import authenticate
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.urls import URLPattern, URLResolver
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.pagination import LimitOffsetPagination, paginate
from ninja.security import HttpBearer

from planning import actions
from planning.models import Agent, Case, CaseStatus, PlanNode, Strategy
from planning.queries import case_for, plan_nodes, visible_cases

logger = logging.getLogger(__name__)

# Permissions that make a user one of the product's roles; anybody else reads nothing.
ROLE_PERMISSIONS = ("oversight.submit_case", "oversight.view_all_cases", "oversight.configure")


class BearerToken(HttpBearer):
    """Authenticate a request by its API token; ninja answers 401 when this returns None."""

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        user = actions.user_for_token(token)
        if user is None or not user.is_active:
            return None
        request.user = user
        return user


def _api_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # The API authenticates every request itself (bearer tokens), so LoginRequiredMiddleware must
    # not redirect to the HTML login page; and ninja's plain-text 405 becomes JSON like the rest.
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response = view(request, *args, **kwargs)
        except Http404 as exc:  # raised outside an operation, e.g. by ninja's root view
            return _error(str(exc) or "Not found.", 404)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            response = JsonResponse(
                {"message": f"Method {request.method} not allowed; use {allowed}."}, status=405
            )
            response["Allow"] = allowed
        return response

    wrapper.login_required = False  # type: ignore[attr-defined]
    wrapper.csrf_exempt = True  # type: ignore[attr-defined]
    return wrapper


class CaseHubApi(NinjaAPI):
    """NinjaAPI whose URL patterns are exempt from the login redirect and answer 405 in JSON."""

    def _get_urls(self) -> list[URLResolver | URLPattern]:
        patterns = super()._get_urls()
        return [
            URLPattern(p.pattern, _api_view(p.callback), p.default_args, p.name)
            if isinstance(p, URLPattern)
            else p
            for p in patterns
        ]


api = CaseHubApi(
    title="CaseHub API",
    version="1",
    description="Submit cases, follow their plans. Authenticate with POST /api/auth/token, "
    "then send `Authorization: Bearer <token>`.",
    urls_namespace="api",
    auth=BearerToken(),
)


# Errors -------------------------------------------------------------------------------------


def _error(message: str, status: int, **extra: Any) -> HttpResponse:
    return JsonResponse({"message": message, **extra}, status=status)


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    # ninja prefixes the source ("body", "query", "path") and, for a body, the parameter name.
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[2:] or parts[1:]
    elif parts and parts[0] in {"query", "path", "header", "cookie", "form"}:
        parts = parts[1:]
    return ".".join(str(p) for p in parts) or "__all__"


def _fields(errors: list[dict[str, Any]]) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for error in errors:
        fields.setdefault(_field_path(error.get("loc", ())), []).append(str(error.get("msg", "")))
    return fields


@api.exception_handler(ValidationError)
def _on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return _error("The request is not valid.", 422, fields=_fields(exc.errors))


@api.exception_handler(actions.CaseInvalid)
def _on_case_invalid(request: HttpRequest, exc: actions.CaseInvalid) -> HttpResponse:
    return _error(exc.message, 422, fields=exc.errors)


@api.exception_handler(AuthenticationError)
def _on_unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = _error(
        "Authentication required: send 'Authorization: Bearer <token>' "
        "with a token from POST /api/auth/token.",
        401,
    )
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(HttpError)
def _on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return _error(exc.message, exc.status_code)


@api.exception_handler(Http404)
def _on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _error(str(exc) or "Not found.", 404)


@api.exception_handler(PermissionDenied)
def _on_permission_denied(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return _error(str(exc) or "You do not have permission to do this.", 403)


@api.exception_handler(Exception)
def _on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.exception("API request %s %s failed", request.method, request.path, exc_info=exc)
    return _error("Internal server error.", 500)


def _require_role(user: AbstractBaseUser) -> None:
    if not any(user.has_perm(perm) for perm in ROLE_PERMISSIONS):  # type: ignore[attr-defined]
        raise PermissionDenied("Your account has no CaseHub role.")


# Schemas ------------------------------------------------------------------------------------


class Message(Schema):
    message: str


class ValidationMessage(Schema):
    message: str
    fields: dict[str, list[str]]


class TokenIn(Schema):
    username: str = Field(min_length=1, max_length=150)
    password: str = Field(min_length=1, max_length=4096)


class TokenOut(Schema):
    token: str


class AgentOut(Schema):
    slug: str
    name: str
    description: str
    kind: Literal["tool", "llm", "human"]
    capabilities: list[str]
    trust: float
    enabled: bool


class CaseIn(Schema):
    title: str = Field(min_length=1, max_length=200)
    goal: str = Field(min_length=1, max_length=500)
    description: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)
    domain: str | None = Field(
        None,
        description="Domain pack slug; without one the llm or hybrid strategy plans from "
        "the goal and description.",
    )
    strategy: Strategy
    max_depth: int = Field(2, ge=1, le=5)


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
    def resolve_plan_version(case: Case) -> int | None:
        return case.current_version.number if case.current_version is not None else None


class CaseFilters(Schema):
    status: CaseStatus | None = None
    domain: str | None = None


class NodeOut(Schema):
    id: str
    parent: str | None
    kind: Literal["compound", "leaf"]
    name: str
    description: str
    task: str
    agent: str | None
    rationale: str
    tool: str | None
    inputs: dict[str, Any]
    depends_on: list[str]
    status: str
    risk: str | None
    gate: int | None = Field(None, description="Id of the node's open gate; null when none.")
    provenance: dict[str, Any]


class PlanOut(Schema):
    case: int
    version: int
    content_hash: str
    strategy: Strategy
    warnings: list[str]
    llm_calls: int
    created_at: datetime
    nodes: list[NodeOut]


def _node_out(node: PlanNode, keys: dict[int, str]) -> NodeOut:
    return NodeOut(
        id=node.key,
        parent=keys.get(node.parent_id) if node.parent_id is not None else None,
        kind=node.kind,  # type: ignore[arg-type]
        name=node.name,
        description=node.description,
        task=node.task,
        agent=node.agent or None,
        rationale=node.rationale,
        tool=node.tool or None,
        inputs=node.inputs,
        depends_on=list(node.depends_on),
        status=node.status,
        risk=node.risk or None,
        # Gates belong to the oversight app, which planning does not import; until gates exist
        # the field is always null.
        gate=None,
        provenance=node.provenance,
    )


# Endpoints ----------------------------------------------------------------------------------


@api.post(
    "/auth/token",
    auth=None,
    response={200: TokenOut, 401: Message, 422: ValidationMessage},
    tags=["auth"],
    summary="Exchange a username and password for an API token",
)
def create_token(request: HttpRequest, credentials: TokenIn) -> Any:
    # authenticate() sends user_login_failed on bad credentials, which the audit trail records.
    user = authenticate(request, username=credentials.username, password=credentials.password)
    if user is None:
        return Status(401, {"message": "Invalid username or password."})
    return Status(200, {"token": actions.issue_api_token(user)})


@api.get(
    "/agents",
    response={200: list[AgentOut], 401: Message, 403: Message},
    tags=["agents"],
    summary="List the agents plans may assign steps to",
)
@paginate(LimitOffsetPagination, max_limit=200)
def list_agents(request: HttpRequest) -> Any:
    _require_role(request.auth)  # type: ignore[attr-defined]
    return Agent.objects.order_by("slug")


@api.post(
    "/cases",
    response={201: CaseOut, 401: Message, 403: Message, 422: ValidationMessage},
    tags=["cases"],
    summary="Submit a case; it is planned in the background",
)
def create_case(request: HttpRequest, payload: CaseIn) -> Any:
    user = request.auth  # type: ignore[attr-defined]
    if not user.has_perm("oversight.submit_case"):
        raise PermissionDenied("Only analysts submit cases.")
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


@api.get(
    "/cases",
    response={200: list[CaseOut], 401: Message, 422: ValidationMessage},
    tags=["cases"],
    summary="List the cases you may read, newest first",
)
@paginate(LimitOffsetPagination, max_limit=200)
def list_cases(request: HttpRequest, filters: Query[CaseFilters]) -> Any:
    cases = visible_cases(request.auth)  # type: ignore[attr-defined]
    if filters.status is not None:
        cases = cases.filter(status=filters.status)
    if filters.domain is not None:
        cases = cases.filter(domain=filters.domain)
    return cases


@api.get(
    "/cases/{int:case_id}",
    response={200: CaseOut, 401: Message, 404: Message},
    tags=["cases"],
    summary="Read one case",
)
def get_case(request: HttpRequest, case_id: int) -> Any:
    return case_for(request.auth, case_id)  # type: ignore[attr-defined]


@api.get(
    "/cases/{int:case_id}/plan",
    response={200: PlanOut, 401: Message, 404: Message},
    tags=["cases"],
    summary="Read the current plan version of a case: its tree and DAG",
)
def get_plan(request: HttpRequest, case_id: int) -> Any:
    case = case_for(request.auth, case_id)  # type: ignore[attr-defined]
    version = case.current_version
    if version is None:
        raise Http404(f"Case {case.pk} has no plan yet (status: {case.status}).")
    nodes = list(plan_nodes(case))
    keys = {node.pk: node.key for node in nodes}
    return PlanOut(
        case=case.pk,
        version=version.number,
        content_hash=version.content_hash,
        strategy=version.strategy,  # type: ignore[arg-type]
        warnings=list(version.warnings),
        llm_calls=version.llm_calls,
        created_at=version.created_at,
        nodes=[_node_out(node, keys) for node in nodes],
    )


@api.api_operation(
    ["GET", "POST", "PUT", "PATCH", "DELETE"],
    "/{path:rest}",
    auth=None,
    include_in_schema=False,
)
def not_found(request: HttpRequest, rest: str) -> Any:
    raise Http404(f"No API endpoint at {request.path}.")
