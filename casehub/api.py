"""The one JSON API (django-ninja): bearer tokens, strict JSON, errors in JSON, docs.

Each app adds its endpoints as a `Router` from `<app>/api.py`, mounted below. Every endpoint but
`POST /api/auth/token` requires `Authorization: Bearer <token>`. Errors are JSON:
`{"message": ...}`, plus `"fields": {"path": [...]}` on a 422 and `"error_id"` on a 500. Every
operation's OpenAPI entry lists the refusals this module answers for it (400, 401, 413, 422,
500). The views are exempt from LoginRequiredMiddleware: they answer 401, they redirect nobody.
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

import json
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    JsonResponse,
    QueryDict,
)
from django.urls import URLPattern, URLResolver, register_converter
from django.urls.converters import PathConverter
from django.utils.datastructures import MultiValueDict
from ninja import Field, NinjaAPI, Router, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.schema import OpenAPISchema
from ninja.parser import Parser
from ninja.security import HttpBearer
from pydantic import ConfigDict

from accounts import tokens as api_tokens
from accounts.denials import record_denial
from accounts.models import AccessDenial, ApiToken
from accounts.throttling import record_sign_in, throttled_response
from execution.api import router as execution_router
from oversight.actions import edits, gates
from oversight.api import router as oversight_router
from oversight.api.gates import router as gates_router
from oversight.api.plans import router as plans_router
from planning import actions, rules
from planning.api import Message, ServerError, ValidationMessage
from planning.api import router as planning_router
from planning.core.errors import flatten_errors

logger = logging.getLogger(__name__)

# Bounds of any JSON body, whatever the endpoint: deeper or larger documents are refused before
# validation walks them (Python's json gives up near 1,000 levels with a RecursionError).
JSON_MAX_DEPTH = 32
JSON_MAX_VALUES = 10_000
# Longer query strings are refused (414 in JSON) before anything reads them. The list endpoints'
# parameters need a few dozen characters; gunicorn lets request lines through up to 8,190 bytes
# (observability/gunicorn.py), so a longer one still reaches this answer.
QUERY_MAX_LENGTH = 2048
# The text every string of the OpenAPI document admits: no NUL, no lone surrogate (what
# `rules.text_problem` refuses with 422), as a JSON Schema (ECMA 262) and Python regex.
TEXT_PATTERN = r"^[^\x00\ud800-\udfff]*$"
REFUSED_TEXT = "NUL characters or lone surrogates in any string or key"


class InputRejected(Exception):
    """The request cannot be processed as sent; `fields` maps dotted paths to messages."""

    def __init__(self, status: int, message: str, fields: dict[str, list[str]]) -> None:
        self.status = status
        self.message = message
        self.fields = fields
        super().__init__(message)


# Parsing ------------------------------------------------------------------------------------


def _child_path(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _check_shape(data: Any) -> None:
    # Iterative, so it bounds the walks that come after it (validation, rules.json_problems).
    pending: list[tuple[Any, str, int]] = [(data, "", 1)]
    values = 1
    while pending:
        item, path, depth = pending.pop()
        if isinstance(item, dict):
            children: Iterator[tuple[object, Any]] = iter(item.items())
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        if depth >= JSON_MAX_DEPTH:
            raise InputRejected(
                422,
                "The request is not valid.",
                {path or "__all__": [f"Nested more than {JSON_MAX_DEPTH} levels deep."]},
            )
        values += len(item)
        if values > JSON_MAX_VALUES:
            raise InputRejected(
                422,
                "The request is not valid.",
                {path or "__all__": [f"More than {JSON_MAX_VALUES:,} values in the request."]},
            )
        pending.extend((child, _child_path(path, key), depth + 1) for key, child in children)


def _body_fields(problems: Mapping[str, list[str]]) -> dict[str, list[str]]:
    # rules.json_problems paths start at the root name given to it: "body", "body.inputs.a".
    return {
        "__all__" if path == "body" else path.removeprefix("body."): messages
        for path, messages in problems.items()
    }


class StrictJsonParser(Parser):
    """Parse JSON bodies and query strings, refusing what cannot be stored or walked safely.

    Refused with InputRejected (422, naming the field): nesting deeper than JSON_MAX_DEPTH,
    more than JSON_MAX_VALUES values, NUL characters or lone surrogates in any string or key,
    and numbers that are not finite (`NaN`, `Infinity`, `1e400`).
    """

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        """Return the JSON body; raise InputRejected, or ValueError for text that is not JSON."""
        try:
            data = json.loads(request.body)
        except RecursionError:
            raise InputRejected(
                422,
                "The request is not valid.",
                {"__all__": [f"Nested more than {JSON_MAX_DEPTH} levels deep."]},
            ) from None
        _check_shape(data)
        problems = rules.json_problems(data, "body", bounded=False)
        if problems:
            raise InputRejected(422, "The request is not valid.", _body_fields(problems))
        return data

    def parse_querydict(
        self, data: MultiValueDict[str, str], list_fields: list[str], request: HttpRequest
    ) -> dict[str, Any]:
        """Return the query parameters; raise InputRejected for text that cannot be stored."""
        problems: dict[str, list[str]] = {}
        for key, values in data.lists():
            for text in (key, *values):
                if (problem := rules.text_problem(text)) is not None:
                    problems.setdefault(key, []).append(problem)
        if problems:
            raise InputRejected(422, "The request is not valid.", problems)
        return super().parse_querydict(data, list_fields, request)


# Authentication -----------------------------------------------------------------------------


class BearerToken(HttpBearer):
    """Authenticate a request by its API token; ninja answers 401 when this returns None."""

    def authenticate(self, request: HttpRequest, token: str) -> User | None:
        """Return the live token's active user, or None for an unknown or expired token.

        The token itself is kept on the request (`request.api_token`) for DELETE /api/auth/token.
        """
        found = api_tokens.api_token_for(token)
        if found is None:
            return None
        request.user = found.user
        request.api_token = found  # type: ignore[attr-defined]
        return found.user


# The API ------------------------------------------------------------------------------------


def _api_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # The API authenticates every request itself (bearer tokens), so LoginRequiredMiddleware must
    # not redirect to the HTML login page; and ninja's plain-text 405 becomes JSON like the rest.
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if len(request.META.get("QUERY_STRING", "")) > QUERY_MAX_LENGTH:
            return _error(f"The query string is longer than {QUERY_MAX_LENGTH:,} characters.", 414)
        try:
            response = view(request, *args, **kwargs)
        except Http404 as exc:  # raised outside an operation, e.g. by ninja's root view
            record_denial(request, AccessDenial.Kind.NOT_FOUND)
            return _error(str(exc) or "Not found.", 404)
        except Exception as exc:  # outside an operation too: the docs, the OpenAPI document
            return _on_unexpected(request, exc)
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


def _shared_refusals(operation: Mapping[str, Any]) -> Iterator[tuple[int, type[Schema], str]]:
    if "requestBody" in operation:
        yield 400, Message, "The body is not JSON."
        yield 413, Message, "The body is larger than the server accepts."
    if "requestBody" in operation or operation.get("parameters"):
        yield (
            422,
            ValidationMessage,
            f"Invalid input ({REFUSED_TEXT} among them); `fields` names every problem.",
        )
    if operation.get("security"):
        yield 401, Message, "No valid bearer token."
    yield 414, Message, f"The query string is longer than {QUERY_MAX_LENGTH:,} characters."
    yield 500, ServerError, "Unexpected server error; `error_id` identifies it in the log."


def _signed_in_docs(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # The docs and the OpenAPI document map every endpoint: only for a signed-in user (a session
    # or a valid bearer token). The docs page sends others to the login page, the document 401s.
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            user = api_tokens.user_for_token(token.strip()) if scheme.lower() == "bearer" else None
            if user is None or not user.is_active:
                if request.path.endswith("/docs"):
                    return redirect_to_login(request.get_full_path())
                return _on_unauthenticated(request, AuthenticationError())
        return view(request, *args, **kwargs)

    return wrapper


class CaseHubApi(NinjaAPI):
    """NinjaAPI exempt from the login redirect, answering 405 in JSON, documenting refusals."""

    def _get_urls(self) -> list[URLResolver | URLPattern]:
        patterns = super()._get_urls()
        return [
            URLPattern(p.pattern, _api_view(p.callback), p.default_args, p.name)
            if isinstance(p, URLPattern)
            else p
            for p in patterns
        ]

    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        """Return the OpenAPI document with every operation's shared refusals added."""
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for shared in (Message, ValidationMessage, ServerError):
            components.setdefault(
                shared.__name__,
                shared.model_json_schema(ref_template="#/components/schemas/{model}"),
            )
        _admit_storable_text(schema)
        for item in schema["paths"].values():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                declared = {str(status) for status in responses}
                for status, model, description in _shared_refusals(operation):
                    if str(status) in declared:
                        continue
                    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                    responses[status] = {
                        "description": description,
                        "content": {"application/json": {"schema": ref}},
                    }
        return schema


def _admit_storable_text(node: Any) -> None:
    # Every plain string and every free-form object's keys says what the parser refuses.
    if isinstance(node, dict):
        if node.get("type") == "string" and not {"format", "enum", "pattern"} & set(node):
            node["pattern"] = TEXT_PATTERN
        free_form = "properties" not in node and node.get("additionalProperties") is not False
        if node.get("type") == "object" and free_form:
            node.setdefault("propertyNames", {"pattern": TEXT_PATTERN})
        for child in list(node.values()):
            _admit_storable_text(child)
    elif isinstance(node, list):
        for child in node:
            _admit_storable_text(child)


api = CaseHubApi(
    title="CaseHub API",
    version="1",
    description="Submit cases, follow their plans. Authenticate with POST /api/auth/token, "
    "then send `Authorization: Bearer <token>`.",
    urls_namespace="api",
    auth=BearerToken(),
    parser=StrictJsonParser(),
    docs_decorator=_signed_in_docs,
)


# Errors -------------------------------------------------------------------------------------


def _error(message: str, status: int, **extra: Any) -> HttpResponse:
    return JsonResponse({"message": message, **extra}, status=status)


def _field_loc(loc: Sequence[Any]) -> tuple[Any, ...]:
    # ninja prefixes the source ("body", "query", "path") and, for a body, the parameter name.
    parts = tuple(loc)
    if parts[:1] == ("body",):
        return parts[2:]
    if parts[:1] and parts[0] in {"query", "path", "header", "cookie", "form"}:
        return parts[1:]
    return parts


@api.exception_handler(ValidationError)
def _on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = ({**error, "loc": _field_loc(error.get("loc", ()))} for error in exc.errors)
    return _error("The request is not valid.", 422, fields=flatten_errors(errors))


@api.exception_handler(InputRejected)
def _on_input_rejected(request: HttpRequest, exc: InputRejected) -> HttpResponse:
    return _error(exc.message, exc.status, fields=exc.fields)


@api.exception_handler(actions.CaseInvalid)
def _on_case_invalid(request: HttpRequest, exc: actions.CaseInvalid) -> HttpResponse:
    return _error(exc.message, 422, fields=exc.errors)


@api.exception_handler(actions.SubmissionRateLimited)
def _on_rate_limited(request: HttpRequest, exc: actions.SubmissionRateLimited) -> HttpResponse:
    response = _error(exc.message, 429)
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(gates.ReasonInvalid)
def _on_reason_invalid(request: HttpRequest, exc: gates.ReasonInvalid) -> HttpResponse:
    return _error(exc.message, 422, fields={exc.field: [exc.message]})


@api.exception_handler(gates.GateConflict)
def _on_gate_conflict(request: HttpRequest, exc: gates.GateConflict) -> HttpResponse:
    return _error(str(exc), 409)


@api.exception_handler(edits.EditInvalid)
def _on_edit_invalid(request: HttpRequest, exc: edits.EditInvalid) -> HttpResponse:
    return _error(exc.message, 422, fields={exc.field: [exc.message]})


@api.exception_handler(edits.EditRefused)
def _on_edit_refused(request: HttpRequest, exc: edits.EditRefused) -> HttpResponse:
    return _error(str(exc), 409)


@api.exception_handler(AuthenticationError)
def _on_unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    # A missing, unknown or expired token, or an inactive user's: recorded as a bad token.
    record_denial(request, AccessDenial.Kind.BAD_TOKEN)
    response = _error(
        "Authentication required: send 'Authorization: Bearer <token>' "
        "with a token from POST /api/auth/token.",
        401,
    )
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(HttpError)
def _on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps whatever the parser raised in a 400 "Cannot parse request body".
    if isinstance(exc.__cause__, InputRejected):
        return _on_input_rejected(request, exc.__cause__)
    if exc.status_code == 400 and exc.__cause__ is not None:
        return _error("The body is not valid JSON.", 400)
    return _error(exc.message, exc.status_code)


@api.exception_handler(RequestDataTooBig)
def _on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return _error(f"The request body is too large: at most {limit:,} bytes.", 413)


@api.exception_handler(SuspiciousOperation)
def _on_suspicious(request: HttpRequest, exc: SuspiciousOperation) -> HttpResponse:
    logger.warning("API request %s %s refused: %s", request.method, request.path, exc)
    return _error("Bad request.", 400)


@api.exception_handler(BadRequest)
def _on_bad_request(request: HttpRequest, exc: BadRequest) -> HttpResponse:
    return _error(str(exc) or "Bad request.", 400)


@api.exception_handler(Http404)
def _on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    record_denial(request, AccessDenial.Kind.NOT_FOUND)
    return _error(str(exc) or "Not found.", 404)


@api.exception_handler(PermissionDenied)
def _on_permission_denied(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    record_denial(request, AccessDenial.Kind.FORBIDDEN)
    return _error(str(exc) or "You do not have permission to do this.", 403)


@api.exception_handler(Exception)
def _on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    error_id = secrets.token_hex(8)
    logger.error("API error %s: %s %s failed", error_id, request.method, request.path, exc_info=exc)
    return _error(f"Internal server error (error id {error_id}).", 500, error_id=error_id)


# Tokens -------------------------------------------------------------------------------------


class TokenIn(Schema):
    model_config = ConfigDict(extra="forbid")

    username: str = Field(min_length=1, max_length=150)
    password: str = Field(min_length=1, max_length=4096)


class TokenOut(Schema):
    token: str
    expires_at: datetime


class TokenInfo(Schema):
    id: int
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime
    current: bool = Field(description="True for the token this request was sent with.")


class TokenList(Schema):
    items: list[TokenInfo]
    count: int


@api.post(
    "/auth/token",
    auth=None,
    response={200: TokenOut, 401: Message, 429: Message},
    tags=["auth"],
    summary="Exchange a username and password for an API token",
)
def create_token(request: HttpRequest, credentials: TokenIn) -> Any:
    """Issue a bearer token for the account, good for CASEHUB_API_TOKEN_TTL_HOURS.

    A user holds at most CASEHUB_API_TOKEN_MAX_PER_USER tokens: a new one beyond that revokes
    the oldest. 401 for a wrong username or password or an inactive account (one message for
    all; the failure is audited); 429 with Retry-After past the sign-in limits, the same as the
    web sign-in's (accounts.throttling).
    """
    # authenticate() sends user_login_failed on bad credentials, which the audit trail records;
    # django-axes refuses it before any password check past a limit.
    # axes also stores a failed attempt's form fields: the body is JSON whatever Content-Type
    # says, so it gets none (a multipart type without a boundary would raise, not answer 400).
    request.POST = QueryDict()
    user = authenticate(request, username=credentials.username, password=credentials.password)
    if getattr(request, "axes_locked_out", False):
        return throttled_response(request, credentials={"username": credentials.username})
    if user is None:
        return Status(401, {"message": "Invalid username or password."})
    record_sign_in(request, user)
    raw = api_tokens.issue_api_token(user)
    return Status(200, {"token": raw, "expires_at": api_tokens.token_secret_expires_at(raw)})


def _token_info(token: ApiToken, current: ApiToken | None) -> dict[str, Any]:
    return {
        "id": token.pk,
        "created_at": token.created_at,
        "last_used_at": token.last_used_at,
        "expires_at": api_tokens.token_expires_at(token),
        "current": current is not None and token.pk == current.pk,
    }


@api.get(
    "/auth/tokens",
    response={200: TokenList},
    tags=["auth"],
    summary="List your live API tokens (never their secrets)",
)
def list_tokens(request: HttpRequest) -> Any:
    """List the caller's tokens that have not expired, newest first."""
    current = getattr(request, "api_token", None)
    tokens = api_tokens.live_api_tokens(request.user)  # type: ignore[arg-type]
    return {"items": [_token_info(token, current) for token in tokens], "count": len(tokens)}


@api.delete(
    "/auth/token",
    response={204: None},
    tags=["auth"],
    summary="Revoke the token this request is sent with",
)
def revoke_current_token(request: HttpRequest) -> Any:
    """Revoke the presented token (`auth.token.revoked`); it answers 401 from then on."""
    token: ApiToken = request.api_token  # type: ignore[attr-defined]
    api_tokens.revoke_api_token(request.user, token.pk)  # type: ignore[arg-type]
    return Status(204, None)


@api.delete(
    "/auth/tokens/{token_id}",
    response={204: None, 404: Message},
    tags=["auth"],
    summary="Revoke one of your tokens by its id",
)
def revoke_token(request: HttpRequest, token_id: int) -> Any:
    """Revoke one of the caller's live tokens (`auth.token.revoked`).

    404 for an id that is not one of the caller's live tokens (another user's included).
    """
    try:
        api_tokens.revoke_api_token(request.user, token_id)  # type: ignore[arg-type]
    except api_tokens.TokenNotFound as exc:
        raise Http404(str(exc)) from None
    return Status(204, None)


# Routers ------------------------------------------------------------------------------------
# One line per app; the fallback stays last, since the first matching path wins.

api.add_router("", planning_router)
api.add_router("", oversight_router)
api.add_router("", plans_router)
api.add_router("", gates_router)
api.add_router("", execution_router)


class _AnyPathConverter(PathConverter):
    # Django's `path` converter stops at a newline, and `/api/x%0A` would get the HTML 404.
    regex = r"[\s\S]+"


register_converter(_AnyPathConverter, "anypath")
_fallback = Router()


@_fallback.api_operation(
    ["GET", "POST", "PUT", "PATCH", "DELETE"],
    "/{anypath:rest}",
    auth=None,
    include_in_schema=False,
)
def not_found(request: HttpRequest, rest: str) -> Any:
    """Answer 404 in JSON for any path no router serves."""
    raise Http404(f"No API endpoint at {request.path}.")


api.add_router("", _fallback)
