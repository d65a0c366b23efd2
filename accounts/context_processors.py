"""What every page's template may need of sign-in: whether the identity provider is offered."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def sign_in(request: HttpRequest) -> dict[str, Any]:
    """Return the identity provider's name when sign-in through it is configured, else None."""
    enabled = bool(settings.CASEHUB_OIDC_ISSUER)
    return {"oidc_provider_name": settings.CASEHUB_OIDC_PROVIDER_NAME if enabled else None}
