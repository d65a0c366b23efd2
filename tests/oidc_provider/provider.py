"""A real OpenID provider for the tests: django-oauth-toolkit in a process of its own on loopback.

The fixture `oidc_provider` (tests/conftest.py) starts one per test session, with a fresh SQLite
database and RSA key in a temporary directory; `oidc` points CaseHub at it for one test. Tests
drive the provider's sign-in over real HTTP (`sign_in_at_provider`) or with the browser.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT_ID = "casehub-tests"
CLIENT_SECRET = "casehub-tests-secret"
PASSWORD = "provider-password-1"


def _pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OidcProvider:
    """The provider process, its issuer, and what tests do to it."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}/o"
        (state / "key.pem").write_text(_pem())
        (state / "other-key.pem").write_text(_pem())
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            "OIDC_PROVIDER_STATE": str(state),
            "OIDC_PROVIDER_ISSUER": self.issuer,
        }
        self.log_path = state / "provider.log"
        self.process: subprocess.Popen[bytes] | None = None

    def _command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.oidc_provider.serve", *args]

    def start(self) -> OidcProvider:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self._command("serve", str(self.port)),
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the provider exited:\n{self.log_path.read_text()[-4000:]}")
            try:
                if requests.get(self.discovery_url, timeout=2).ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the provider did not start:\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def setup(self, **spec: Any) -> None:
        """Register the client or users (`users=[{"username", "password", "groups"}]`)."""
        subprocess.run(
            self._command("setup", json.dumps(spec)),
            cwd=ROOT, env=self.env, check=True, capture_output=True,
        )  # fmt: skip

    def register_client(self, casehub_urls: list[str]) -> None:
        """Register CaseHub at these base URLs (callback and post-logout addresses)."""
        self.setup(
            client={
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uris": [f"{url}/oidc/callback/" for url in casehub_urls],
                "post_logout_redirect_uris": [f"{url}/login/" for url in casehub_urls],
            }
        )

    def user(self, username: str, groups: list[str]) -> None:
        """Create the provider's user (password PASSWORD) or give them exactly these groups."""
        self.setup(users=[{"username": username, "password": PASSWORD, "groups": groups}])

    def quirks(self, **quirks: Any) -> None:
        """Have the next ID tokens differ (see validator.py); none: a well-behaved provider."""
        path = self.state / "quirks.json"
        if quirks:
            path.write_text(json.dumps(quirks))
        else:
            path.unlink(missing_ok=True)


def sign_in_at_provider(
    authorize_url: str, username: str, password: str = PASSWORD, *, session: Any = None
) -> str:
    """Follow the provider's authorization request as a browser would, signing in at its login
    form; return the URL it sends the browser back to (CaseHub's callback with code and state)."""
    browser = session or requests.Session()
    url = authorize_url
    for _ in range(10):
        answer = browser.get(url, allow_redirects=False, timeout=10)
        if answer.status_code == 200 and "csrfmiddlewaretoken" in answer.text:
            token = browser.cookies.get("provider_csrftoken")
            next_url = answer.url.split("next=", 1)[1] if "next=" in answer.url else ""
            answer = browser.post(
                answer.url,
                data={
                    "csrfmiddlewaretoken": token,
                    "username": username,
                    "password": password,
                    "next": requests.utils.unquote(next_url),
                },
                allow_redirects=False,
                timeout=10,
            )
        if answer.status_code not in (301, 302, 303):
            raise AssertionError(f"the provider answered {answer.status_code}: {answer.text[:500]}")
        location = urljoin(url, answer.headers["Location"])
        if "/oidc/callback/" in location:
            return location
        url = location
    raise AssertionError("the provider never sent the browser back")
