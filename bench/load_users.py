"""The simulated officers of the load run: locust users, run headless in this process.

``python -m bench.load_users CONFIG.json`` is started by ``bench_load`` (locust patches the
standard library with gevent on import, so it runs in a process of its own). Each user signs in
through ``/login/`` as one of the seeded officers (the sessions of one account share one API
token from ``POST /api/auth/token``), then, with a pause of
``wait`` seconds between tasks, reads the inbox (page one or two, all gates or steps only), gate
pages, case pages with their gates partial and the API's gate list, and decides gates picked from
the inbox it read last: approve (with the password: step gates are signatures) or, one time in
ten, reject, half through the gate page's form and half through ``POST /api/gates/{id}/decision``.
A 409 (someone decided the gate first) is an expected answer; every other non-2xx/3xx answer
counts as a failure. One extra user probes ``/health`` every two seconds, where 503 is the
documented answer when a dependency is unhealthy.

Every request is recorded (name, status, exact milliseconds, seconds since start), so the
percentiles are exact rather than locust's rounded ones; decisions are counted by outcome. The
record goes to the ``out`` file named in the config. Only 127.0.0.1 is accepted as the host.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
import locust  # noqa: F401  (gevent patches the standard library when locust is imported)
from locust import FastHttpUser, constant, task
from locust.env import Environment

from bench.load_patterns import CASE_LINK, CONTENT_HASH, CSRF, GATE_LINK, VERSION

CONFIG: dict[str, Any] = {}
RECORD: list[tuple[str, int, float, float]] = []  # name, status (0: no answer), ms, start (epoch)
DECISIONS: Counter[str] = Counter()
# The measured window opens when the last officer has signed in (password hashing makes a burst
# of sign-ins slow on purpose) and lasts CONFIG["seconds"].
WINDOW: dict[str, float] = {}
_accounts = itertools.count()
_signed_in = itertools.count(1)
_runner: list[Any] = []
TOKENS: dict[str, str] = {}


def _record(
    request_type: str,
    name: str,
    response_time: float,
    response_length: int,
    exception: BaseException | None = None,
    response: Any = None,
    **_: Any,
) -> None:
    status = int(getattr(response, "status_code", 0) or 0)
    started = float(_.get("start_time") or time.time() - response_time / 1000)
    RECORD.append((f"{request_type} {name}", status, float(response_time), started))


def _open_window() -> None:
    WINDOW["from"] = time.time()
    gevent.spawn_later(CONFIG["seconds"], _runner[0].quit)


class Officer(FastHttpUser):
    """A compliance officer reviewing and deciding gates."""

    weight = 1
    network_timeout = 120.0
    connection_timeout = 120.0

    def wait_time(self) -> float:
        low, high = CONFIG["wait"]
        return random.uniform(low, high)

    def on_start(self) -> None:
        self.username = CONFIG["officers"][next(_accounts) % len(CONFIG["officers"])]
        self.gates: list[int] = []
        self.cases: list[int] = []
        self.token = ""
        page = self.client.get("/login/", name="/login/")
        found = CSRF.search(page.text or "")
        with self.client.post(
            "/login/",
            data={
                "username": self.username,
                "password": CONFIG["password"],
                "csrfmiddlewaretoken": found.group(1) if found else "",
            },
            headers={"Referer": f"{self.host}/login/", "Origin": self.host},
            name="/login/ POST",
            allow_redirects=False,
            catch_response=True,
        ) as response:
            if response.status_code != 302:
                response.failure(f"login answered {response.status_code}")
        # The sessions of one account share its API token, as one person's scripts would.
        self.token = TOKENS.get(self.username, "")
        if not self.token:
            with self.client.post(
                "/api/auth/token",
                json={"username": self.username, "password": CONFIG["password"]},
                name="/api/auth/token",
                catch_response=True,
            ) as response:
                if response.status_code == 200:
                    self.token = TOKENS[self.username] = response.json()["token"]
                else:
                    response.failure(f"token answered {response.status_code}")
        if next(_signed_in) == CONFIG["users"]:
            _open_window()
        self.inbox()

    @task(4)
    def inbox(self) -> None:
        query = random.choice(["", "", "?page=2", "?kind=step"])
        page = self.client.get(f"/inbox/{query}", name="/inbox/")
        text = page.text or ""
        self.gates = [int(g) for g in GATE_LINK.findall(text)] or self.gates
        self.cases = [int(c) for c in CASE_LINK.findall(text)] or self.cases

    @task(3)
    def gate_page(self) -> None:
        if self.gates:
            self.client.get(f"/gates/{random.choice(self.gates)}/", name="/gates/[id]/")

    @task(2)
    def case_page(self) -> None:
        if self.cases:
            case = random.choice(self.cases)
            self.client.get(f"/cases/{case}/", name="/cases/[id]/")
            self.client.get(
                f"/cases/{case}/gates/", headers={"HX-Request": "true"}, name="/cases/[id]/gates/"
            )

    @task(1)
    def api_gates(self) -> None:
        self.client.get(
            "/api/gates?status=pending",
            headers={"Authorization": f"Bearer {self.token}"},
            name="/api/gates",
        )

    @task(2)
    def decide(self) -> None:
        if not self.gates:
            return
        gate = random.choice(self.gates)
        page = self.client.get(f"/gates/{gate}/", name="/gates/[id]/")
        text = page.text or ""
        csrf, version, digest = CSRF.search(text), VERSION.search(text), CONTENT_HASH.search(text)
        if page.status_code != 200 or not (csrf and version and digest):
            DECISIONS["not_decidable"] += 1  # decided meanwhile: the page shows no form
            return
        approve = random.random() >= 0.1
        decision: dict[str, Any] = {
            "decision": "approve" if approve else "reject",
            "version": int(version.group(1)),
            "content_hash": digest.group(1),
        }
        if approve:
            decision["password"] = CONFIG["password"]
        else:
            decision |= {"reason_code": CONFIG["reject_code"], "reason": "load run"}
        via = random.choice(["form", "api"])
        if via == "form":
            ctx = self.client.post(
                f"/gates/{gate}/decide",
                data={**decision, "detail_opened": "1", "csrfmiddlewaretoken": csrf.group(1)},
                headers={"Referer": f"{self.host}/gates/{gate}/", "Origin": self.host},
                name="/gates/[id]/decide",
                allow_redirects=False,
                catch_response=True,
            )
            ok = 302
        else:
            ctx = self.client.post(
                f"/api/gates/{gate}/decision",
                json=decision,
                headers={"Authorization": f"Bearer {self.token}"},
                name="/api/gates/[id]/decision",
                catch_response=True,
            )
            ok = 200
        with ctx as response:
            if response.status_code == ok:
                DECISIONS[f"decided.{via}.{decision['decision']}"] += 1
            elif response.status_code == 409:
                DECISIONS[f"conflict.{via}"] += 1
                response.success()
            else:
                DECISIONS[f"unexpected.{via}.{response.status_code}"] += 1
                response.failure(f"decision answered {response.status_code}")


class HealthProbe(FastHttpUser):
    """A monitor asking /health every two seconds (200, or the documented 503 when degraded)."""

    fixed_count = 1
    wait_time = constant(2)
    network_timeout = 60.0
    connection_timeout = 60.0

    @task
    def health(self) -> None:
        with self.client.get("/health", name="/health", catch_response=True) as response:
            if response.status_code in (200, 503):
                response.success()


def main(config_path: str) -> None:
    """Run the users for the configured time and write the record."""
    CONFIG.update(json.loads(Path(config_path).read_text()))
    host = CONFIG["host"]
    if urlsplit(host).hostname != "127.0.0.1":
        raise SystemExit(f"the load run targets 127.0.0.1 only, not {host!r}")
    # Stopping lets each user finish the task it is in, so no decision is cut off unanswered.
    env = Environment(
        user_classes=[Officer, HealthProbe], host=host, stop_timeout=CONFIG["stop_timeout"]
    )
    env.events.request.add_listener(_record)
    runner = env.create_local_runner()
    _runner.append(runner)
    started = time.time()
    runner.start(CONFIG["users"] + 1, spawn_rate=CONFIG["spawn_rate"])
    # Bounded: with no window sign_in_limit seconds after the start, the run ends there.
    gevent.spawn_later(CONFIG["sign_in_limit"], lambda: "from" in WINDOW or runner.quit())
    runner.greenlet.join()
    ended = time.time()
    window_from = WINDOW.get("from", ended)
    out = {
        "seconds": ended - window_from,
        "sign_in_s": window_from - started,
        "window_opened": "from" in WINDOW,
        "requests": [(n, s, ms, t - window_from) for n, s, ms, t in RECORD],
        "decisions": dict(DECISIONS),
        "locust_failures": env.stats.total.num_failures,
        "errors": {
            f"{err.method} {err.name}: {err.error}": err.occurrences
            for err in env.stats.errors.values()
        },
    }
    Path(CONFIG["out"]).write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
