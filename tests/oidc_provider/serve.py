"""The test provider's process: `python -m tests.oidc_provider.serve serve PORT` migrates its
database and serves it (a threaded WSGI server on 127.0.0.1); `... setup JSON` registers the client
and users with their groups in that database. The environment names the state directory."""

from __future__ import annotations

import json
import os
import sys
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"

import django

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(port: int) -> None:
    call_command("migrate", verbosity=0, interactive=False)
    server = make_server(
        "127.0.0.1", port, WSGIHandler(), server_class=ThreadingServer, handler_class=QuietHandler
    )
    server.serve_forever()


def setup(spec: dict[str, Any]) -> None:
    if client := spec.get("client"):
        Application.objects.update_or_create(
            client_id=client["client_id"],
            defaults={
                "name": "CaseHub",
                "client_secret": client["client_secret"],
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "redirect_uris": " ".join(client["redirect_uris"]),
                "post_logout_redirect_uris": " ".join(client["post_logout_redirect_uris"]),
                "algorithm": Application.RS256_ALGORITHM,
                "skip_authorization": True,
            },
        )
    for spec_user in spec.get("users", []):
        user, _ = User.objects.get_or_create(username=spec_user["username"])
        user.set_password(spec_user["password"])
        user.email = spec_user.get("email", f"{user.username}@example.org")
        user.save()
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in spec_user["groups"]])


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        setup(json.loads(sys.argv[2]))
