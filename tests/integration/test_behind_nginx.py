"""CaseHub behind a real nginx with TLS and one trusted proxy (RELIABILITY F1).

gunicorn runs CaseHub with the production settings of docs/operations.md and
`CASEHUB_TRUSTED_PROXY_COUNT=1`; nginx terminates TLS with a certificate made for the test and
passes `X-Forwarded-For` ($proxy_add_x_forwarded_for) and `X-Forwarded-Proto`. The caller connects
from 127.0.0.2 (all of 127/8 is loopback on Linux), so the proxy (127.0.0.1) and the caller have
different addresses, and sends a forged `X-Forwarded-For` of its own.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.db import connection

from accounts.models import AccessDenial
from audit.chain import SYSTEM_CHAIN
from audit.models import AuditEvent
from tests import personas
from tests.casehub.test_deploy_check import production_env
from tests.conftest import ROOT, _database_url

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CALLER = "127.0.0.2"
FORGED = "6.6.6.6"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _certificate(folder: Path) -> tuple[Path, Path]:
    """Write a self-signed certificate for 127.0.0.1 and its key; return their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "proxy.crt", folder / "proxy.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


NGINX_CONF = """
{user}
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
  access_log {folder}/nginx-access.log;
  client_body_temp_path {folder}/body;
  proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fastcgi;
  uwsgi_temp_path {folder}/uwsgi;
  scgi_temp_path {folder}/scgi;
  upstream casehub {{ server 127.0.0.1:{app}; }}
  server {{
    listen 127.0.0.1:{tls} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{
      proxy_pass http://casehub;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
  server {{
    listen 127.0.0.1:{plain};
    location / {{
      proxy_pass http://casehub;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
}}
"""


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"exited early:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"nothing listened on {port}:\n{log.read_text(errors='replace')[-3000:]}")


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """gunicorn with the production settings behind nginx; yield the ports and the TLS context."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else "")
    if not nginx:
        pytest.skip("nginx is not installed (.ci/run installs it)")
    app, tls, plain = _free_port(), _free_port(), _free_port()
    cert, key = _certificate(tmp_path)
    env = {
        **production_env(tmp_path / "var"),
        "DATABASE_URL": _database_url(connection.settings_dict),
        "ALLOWED_HOSTS": "127.0.0.1",
        "CSRF_TRUSTED_ORIGINS": f"https://127.0.0.1:{tls}",
        "CASEHUB_TRUSTED_PROXY_COUNT": "1",
    }
    for name in ("CASEHUB_DB_APP_ROLE",):
        if name in os.environ:
            env[name] = os.environ[name]
    web_log, proxy_log = tmp_path / "gunicorn.log", tmp_path / "nginx.log"
    web = _start(
        [sys.executable, "-m", "gunicorn", "casehub.wsgi:application", "--bind",
         f"127.0.0.1:{app}", "--workers", "1", "--threads", "4"],
        env, web_log,
    )  # fmt: skip
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            user="user root;" if os.geteuid() == 0 else "",
            folder=tmp_path,
            app=app,
            tls=tls,
            plain=plain,
            cert=cert,
            key=key,
        )
    )
    proxy = _start([nginx, "-c", str(conf), "-p", str(tmp_path)], env, proxy_log)
    try:
        _wait_for_port(app, web, web_log)
        _wait_for_port(tls, proxy, proxy_log)
        context = ssl.create_default_context(cafile=str(cert))
        yield {"tls": tls, "plain": plain, "context": context, "web_log": web_log}
    finally:
        _stop(proxy)
        _stop(web)


def _https(proxied: dict[str, Any]) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection(
        "127.0.0.1", proxied["tls"], context=proxied["context"], source_address=(CALLER, 0)
    )


def _cookies(response: http.client.HTTPResponse) -> dict[str, str]:
    """Return each Set-Cookie header by the cookie's name (the whole header, attributes too)."""
    return {
        header.split("=", 1)[0]: header
        for name, header in response.getheaders()
        if name.lower() == "set-cookie"
    }


def _sign_in(proxied: dict[str, Any], password: str) -> http.client.HTTPResponse:
    connection_ = _https(proxied)
    connection_.request("GET", "/login/", headers={"X-Forwarded-For": FORGED})
    page = connection_.getresponse()
    body = page.read().decode()
    assert page.status == 200, body[:2000]
    csrf_cookie = _cookies(page)["csrftoken"]
    assert "; Secure" in csrf_cookie
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    assert token is not None
    form = urlencode(
        {"csrfmiddlewaretoken": token.group(1), "username": "ana", "password": password}
    )
    connection_.request(
        "POST",
        "/login/",
        body=form,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": csrf_cookie.split(";", 1)[0],
            "Referer": f"https://127.0.0.1:{proxied['tls']}/login/",
            "Origin": f"https://127.0.0.1:{proxied['tls']}",
            "X-Forwarded-For": FORGED,
        },
    )
    response = connection_.getresponse()
    response.body = response.read().decode()  # type: ignore[attr-defined]
    return response


@pytest.mark.scenario("F1")
def test_behind_nginx_the_trail_records_the_caller_and_https_holds(
    proxied: dict[str, Any], settings: Any
) -> None:
    # the production hasher: gunicorn runs without the tests' fast one
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.Argon2PasswordHasher"]
    personas.analyst()
    failed = _sign_in(proxied, "wrong-password")
    assert failed.status == 200  # the form again, with its error
    signed_in = _sign_in(proxied, personas.PASSWORD)
    assert signed_in.status == 302, re.sub(r"\s+", " ", signed_in.body)[-3000:]  # type: ignore[attr-defined]
    session = _cookies(signed_in)["sessionid"]
    assert "; Secure" in session and "; HttpOnly" in session
    assert "max-age=31536000" in (signed_in.getheader("Strict-Transport-Security") or "")

    events = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action__startswith="auth.login")
    assert {(e.action, e.data["ip"]) for e in events} == {
        ("auth.login.failed", CALLER),
        ("auth.login.succeeded", CALLER),
    }

    # A refused request: its access denial counts against the caller, not the proxy or the forgery.
    denied = _https(proxied)
    denied.request("GET", "/api/cases", headers={"Authorization": "Bearer nope"})
    assert denied.getresponse().status == 401
    assert set(AccessDenial.objects.values_list("source", flat=True)) == {CALLER}

    # Plain HTTP through the proxy is sent to HTTPS.
    plain = http.client.HTTPConnection("127.0.0.1", proxied["plain"], source_address=(CALLER, 0))
    plain.request("GET", "/login/")
    redirect = plain.getresponse()
    assert redirect.status == 301
    assert (redirect.getheader("Location") or "").startswith("https://127.0.0.1")
