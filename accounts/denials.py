"""Record access denials (403, 404, bad bearer tokens) in the system audit chain, aggregated.

A refused request costs one counter row per client address, user, kind and minute
(AccessDenial). The first denial of such a minute writes `security.access.denied` at once, naming
the path and method; later ones only count. Once the minute is over, `flush_denials` (a beat task,
every minute) writes one `security.access.denied.summary` with the minute's count for each row that
counted more than one. So an anonymous caller scanning ids or paths adds at most one event per
minute and kind to the chain, plus one summary, however many requests it sends.

The client is the address behind CASEHUB_TRUSTED_PROXY_COUNT proxies (`web.http.client_ip`:
REMOTE_ADDR when that is 0), for every kind: behind a reverse proxy each caller keeps its own
counters, and a forged X-Forwarded-For entry left of the trusted ones changes nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F
from django.http import HttpRequest
from django.utils import timezone

from accounts.models import AccessDenial
from audit.chain import SYSTEM_CHAIN, NewEvent, append_event, append_events
from web.http import client_ip

__all__ = [
    "DENIED",
    "SUMMARY",
    "flush_denials",
    "is_static_path",
    "record_denial",
]

logger = logging.getLogger(__name__)

DENIED = "security.access.denied"
SUMMARY = "security.access.denied.summary"
# A minute is summarised this long after it ends, so that a request still being answered at the
# end of its minute has counted before the summary is written.
FLUSH_GRACE = timedelta(seconds=5)
FLUSH_BATCH = 500
# Flushed counters are kept this long (their events stay in the chain for good).
RETENTION = timedelta(days=1)
SOURCE_LENGTH = AccessDenial._meta.get_field("source").max_length or 64
METHOD_LENGTH = 16


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _text(value: str, limit: int) -> str:
    # Paths may hold NUL and lone surrogates (from %00, %ED%A0%80); neither can be stored.
    cleaned = value.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return cleaned[:limit]


def is_static_path(path: str) -> bool:
    """Tell whether a path lies under STATIC_URL (a missing static file is no access denial)."""
    static = "/" + str(settings.STATIC_URL or "").lstrip("/")
    return static != "/" and path.startswith(static)


def _user_of(request: HttpRequest) -> AbstractBaseUser | None:
    user = getattr(request, "user", None)
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return None
    return user if isinstance(user, get_user_model()) else None


def _count_again(key: dict[str, Any], path: str) -> bool:
    updated = AccessDenial.objects.filter(**key).update(count=F("count") + 1, last_path=path)
    return updated > 0


def record_denial(
    request: HttpRequest,
    kind: AccessDenial.Kind | str,
    *,
    now: datetime | None = None,
    source: str | None = None,
) -> bool:
    """Count one denial of `request`; return True when it was its minute's first (and audited).

    The counter is bumped in its own transaction (a savepoint inside the caller's), and the first
    denial of a (source, user, kind, minute) writes `security.access.denied` with it. The source
    is the client behind the trusted proxies unless the caller names it. For a bad token the
    caller is anonymous whatever the session says. Missing static files are not recorded. A
    database error is logged, never raised: the refusal is answered all the same.
    """
    kind = AccessDenial.Kind(kind)
    path = request.path
    if kind == AccessDenial.Kind.NOT_FOUND and is_static_path(path):
        return False
    user = None if kind == AccessDenial.Kind.BAD_TOKEN else _user_of(request)
    source = _text(str(source or client_ip(request) or "unknown"), SOURCE_LENGTH)
    path = _text(path, AccessDenial.PATH_LENGTH)
    minute = _minute(now or timezone.now())
    key: dict[str, Any] = {"source": source, "user": user, "kind": kind, "minute": minute}
    try:
        with transaction.atomic():
            if _count_again(key, path):
                return False
            try:
                with transaction.atomic():
                    AccessDenial.objects.create(**key, first_path=path, last_path=path)
                    append_event(
                        DENIED,
                        actor=user or AnonymousUser(),
                        chain=SYSTEM_CHAIN,
                        data={
                            "source": source,
                            "user": user.get_username() if user else None,
                            "user_id": user.pk if user else None,
                            "kind": kind.value,
                            "path": path,
                            "method": _text(request.method or "", METHOD_LENGTH),
                        },
                    )
            except IntegrityError:
                # A concurrent request of the same minute created the row first.
                if _count_again(key, path):
                    return False
                raise
            return True
    except DatabaseError:
        logger.exception("Could not record the %s denial of %s %s", kind, request.method, path)
        return False


def _summarise(rows: list[AccessDenial]) -> int:
    user_ids = {row.user_id for row in rows if row.user_id is not None}
    names = dict(
        get_user_model()
        .objects.filter(pk__in=user_ids)
        .values_list("pk", get_user_model().USERNAME_FIELD)
    )
    summaries = [
        NewEvent(
            SUMMARY,
            None,
            {
                "source": row.source,
                "user": names.get(row.user_id),
                "user_id": row.user_id,
                "kind": row.kind,
                "minute": row.minute,
                "count": row.count,
                "first_path": row.first_path,
                "last_path": row.last_path,
            },
        )
        for row in rows
        if row.count > 1  # a single denial has its own event already
    ]
    append_events(summaries, chain=SYSTEM_CHAIN)
    written = len(summaries)
    return written


def flush_denials(now: datetime | None = None) -> dict[str, int]:
    """Summarise every finished minute's counters once; return the summaries and rows flushed.

    A counter of more than one denial gets one `security.access.denied.summary` with its count;
    every finished counter is then marked flushed, in the same transaction, so a second run (or a
    second scheduler at the same time: rows another run holds are skipped) writes nothing again.
    Flushed counters older than RETENTION are deleted.
    """
    now = now or timezone.now()
    finished = now - timedelta(minutes=1) - FLUSH_GRACE
    summaries = flushed = 0
    while True:
        with transaction.atomic():
            rows = list(
                AccessDenial.objects.select_for_update(skip_locked=True)
                .filter(flushed=False, minute__lte=finished)
                .order_by("minute", "id")[:FLUSH_BATCH]
            )
            if not rows:
                break
            summaries += _summarise(rows)
            AccessDenial.objects.filter(pk__in=[row.pk for row in rows]).update(flushed=True)
            flushed += len(rows)
    AccessDenial.objects.filter(flushed=True, minute__lt=now - RETENTION).delete()
    return {"summaries": summaries, "flushed": flushed}
