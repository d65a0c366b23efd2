"""The browser's `/favicon.ico` probe finds a real icon (the admin's pages link none)."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_favicon_ico_leads_to_a_real_icon_served_by_the_static_files() -> None:
    client = Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("/casehub/favicon.ico")
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    body = b"".join(icon.streaming_content) if icon.streaming else icon.content
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO header, not an error page
