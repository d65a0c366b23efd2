"""The sign-in form."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from accounts import signin


class PasswordSignInForm(AuthenticationForm):
    """Django's sign-in form, saying so when the right password's user signs in elsewhere only."""

    sign_in_off_message = ""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            if signin.was_refused(self.request):
                self.sign_in_off_message = signin.MESSAGE.format(
                    provider=settings.CASEHUB_OIDC_PROVIDER_NAME
                )
                raise ValidationError(
                    self.sign_in_off_message, code="password_sign_in_off"
                ) from None
            raise
