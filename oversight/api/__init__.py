"""Oversight's part of the JSON API: a case's audit trail, its export bundle and verification.

`casehub/api.py` mounts this router on the one NinjaAPI (bearer tokens, strict parsing, JSON
errors). Verification here and in the bundles is casehub_verify.py's, through audit.chain.
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.pagination import paginate

from audit.chain import case_chain
from audit.checkpoints import verify_anchored_chain
from audit.export import export_case_bundle
from audit.models import AuditEvent
from audit.signing import current_key_id, public_keys
from planning.api import Message, Page, request_user
from planning.queries import case_for

EXPORT_AUDIT = "oversight.export_audit"
CONFIGURE = "oversight.configure"
# Ids beyond a signed 64-bit integer cannot name a row; refused before they reach the database.
MAX_ID = 2**63 - 1

router = Router()


class AuditEventOut(Schema):
    seq: int
    time: datetime
    actor_kind: str = Field(description="user, agent, system or anonymous.")
    actor: str = Field(description="The username, the agent's slug, or system.")
    action: str = Field(description="Dotted code, e.g. `oversight.gate.approved`.")
    data: dict[str, Any]
    prev_hash: str
    hash: str

    @staticmethod
    def resolve_actor(event: AuditEvent) -> str:
        return event.actor_label


class CaseScope(Schema):
    case: int = Field(ge=1, le=MAX_ID, description="Id of the case whose audit chain is meant.")


class ProblemOut(Schema):
    seq: int
    problem: str = Field(
        description="Starts with the kind of break: changed, missing, reordered, unlinked, "
        "foreign, head, or against the last checkpoint: rollback, rewritten, checkpoint."
    )


class VerificationOut(Schema):
    ok: bool
    events: int
    problems: list[ProblemOut]


class SigningKeyOut(Schema):
    key_id: str = Field(description="The key's fingerprint: 16 hex digits of its SHA-256.")
    public_key: str = Field(description="The raw Ed25519 public key, 64 hex digits.")
    current: bool = Field(description="Whether new bundles are signed with it.")


def _require_exporter(user: User) -> None:
    if not user.has_perm(EXPORT_AUDIT):
        raise PermissionDenied("Only auditors may export and verify audit trails.")


@router.get(
    "/cases/{int:case_id}/audit",
    response={200: list[AuditEventOut], 404: Message},
    tags=["audit"],
    summary="Read a case's audit trail, oldest event first",
)
@paginate(Page)
def list_case_audit(request: HttpRequest, case_id: int) -> Any:
    """List the events of the case's audit chain, paginated.

    404 when the case does not exist or is not yours to read (the same answer either way).
    """
    case = case_for(request_user(request), case_id)
    return AuditEvent.objects.filter(chain=case_chain(case.pk)).order_by("seq")


@router.get(
    "/audit/export",
    response={403: Message, 404: Message},
    tags=["audit"],
    summary="Download a case's audit trail as a signed bundle (zip)",
    openapi_extra={
        "responses": {
            200: {
                "description": "The bundle: events.jsonl, events.csv, manifest.json and "
                "manifest.sig; verify it with casehub_verify.py.",
                "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
            }
        }
    },
)
def export_audit(request: HttpRequest, scope: Query[CaseScope]) -> Any:
    """Export the case's audit chain as a signed zip bundle; the export is audited.

    403 unless you are an auditor; 404 when the case does not exist.
    """
    user = request_user(request)
    _require_exporter(user)
    case = case_for(user, scope.case)
    bundle = export_case_bundle(case_id=case.pk, exporter=user)
    return FileResponse(
        bundle.file,
        as_attachment=True,
        filename=bundle.filename,
        content_type="application/zip",
    )


@router.get(
    "/audit/verify",
    response={200: VerificationOut, 403: Message, 404: Message},
    tags=["audit"],
    summary="Verify a case's stored audit chain",
)
def verify_audit(request: HttpRequest, scope: Query[CaseScope]) -> Any:
    """Check the case's stored chain by the chain rules and its last checkpoint; list every break.

    403 unless you are an auditor; 404 when the case does not exist.
    """
    user = request_user(request)
    _require_exporter(user)
    case = case_for(user, scope.case)
    verification = verify_anchored_chain(case_chain(case.pk))
    return VerificationOut(
        ok=not verification.problems,
        events=verification.count,
        problems=[ProblemOut(seq=p.seq, problem=p.problem) for p in verification.problems],
    )


@router.get(
    "/audit/keys",
    response={200: list[SigningKeyOut], 403: Message},
    tags=["audit"],
    summary="List the public keys that sign audit bundles, the current one and retired ones",
)
def list_signing_keys(request: HttpRequest) -> Any:
    """List the signing keys' public halves, current first; verify bundles against them.

    403 unless you are an auditor or an admin.
    """
    user = request_user(request)
    if not (user.has_perm(EXPORT_AUDIT) or user.has_perm(CONFIGURE)):
        raise PermissionDenied("Only auditors and admins may list the signing keys.")
    current = current_key_id()
    keys = [
        SigningKeyOut(key_id=key_id, public_key=raw.hex(), current=key_id == current)
        for key_id, raw in public_keys().items()
    ]
    return sorted(keys, key=lambda key: (not key.current, key.key_id))
