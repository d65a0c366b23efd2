"""The test provider's claims: the user's Django groups as `groups`, and the quirks a test asks for.

A test writes quirks.json in the provider's state directory to have the next ID tokens differ
from a well-behaved provider's: another issuer or audience, an expiry in the past, an old
auth_time, no group claim, or a signature by another key under the real key's id. The token is
made as usual and then changed and signed again.
"""

from __future__ import annotations

import json
from typing import Any

import jwt
from django.conf import settings
from oauth2_provider.oauth2_validators import OAuth2Validator


def _quirks() -> dict[str, Any]:
    path = settings.STATE / "quirks.json"
    return json.loads(path.read_text()) if path.exists() else {}


class GroupsValidator(OAuth2Validator):
    # Every claim goes into the ID token whatever the scopes.
    oidc_claim_scope = None

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    def finalize_id_token(self, id_token: Any, token: Any, token_handler: Any, request: Any) -> str:
        serialized: str = super().finalize_id_token(id_token, token, token_handler, request)
        quirks = _quirks()
        if not quirks:
            return serialized
        header = jwt.get_unverified_header(serialized)
        claims = jwt.decode(serialized, options={"verify_signature": False})
        if "issuer" in quirks:
            claims["iss"] = quirks["issuer"]
        if "expires_in" in quirks:
            claims["exp"] = claims["iat"] + int(quirks["expires_in"])
        if "audience" in quirks:
            claims["aud"] = quirks["audience"]
        if "auth_age" in quirks:
            claims["auth_time"] = claims["iat"] - int(quirks["auth_age"])
        if quirks.get("drop_groups"):
            claims.pop("groups", None)
        key = settings.OAUTH2_PROVIDER["OIDC_RSA_PRIVATE_KEY"]
        if quirks.get("other_key"):
            key = (settings.STATE / "other-key.pem").read_text()
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": header["kid"]})
