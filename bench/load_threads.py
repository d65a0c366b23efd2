"""A handful of simulated officers on threads, for the load run's test in the suite (no locust).

``run_users`` does what ``bench/load_users.py`` does with locust, on plain threads and urllib, so
that ``tests/bench/test_load_short.py`` runs where only the dev dependencies are installed: each
user signs in through ``/login/`` as one of the seeded officers (the users of one account share
its API token), then reads the inbox, gate pages, case pages with their gates partial and the
API's gate list, and decides gates from the inbox it read last (approve with the password, or one
time in ten reject; half by form, half by API), with a short pause between tasks. A 409 is an
expected answer to a decision. It returns the same record as ``load_users``: every request's
name, status (0: no answer), milliseconds and start (seconds from the window's opening, which is
when the last user has signed in), and the decisions by outcome. Only 127.0.0.1 is accepted.
"""

from __future__ import annotations

import http.cookiejar
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from typing import Any

from bench.load_patterns import CASE_LINK, CONTENT_HASH, CSRF, GATE_LINK, VERSION

TIMEOUT_S = 120.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 302 is the answer counted, not the page it leads to


class _Recorder:
    """The requests and decisions of every user, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, int, float, float]] = []
        self.decisions: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    def add(self, name: str, status: int, ms: float, started: float) -> None:
        with self.lock:
            self.requests.append((name, status, ms, started))

    def count(self, outcome: str) -> None:
        with self.lock:
            self.decisions[outcome] += 1


class _Officer:
    """One simulated officer: a cookie jar for the pages and a bearer token for the API."""

    def __init__(self, base: str, username: str, config: dict[str, Any], rec: _Recorder) -> None:
        self.base, self.username, self.config, self.rec = base, username, config, rec
        jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(jar), _NoRedirect()
        )
        self.token = ""
        self.gates: list[int] = []
        self.cases: list[int] = []

    def request(
        self,
        name: str,
        path: str,
        *,
        form: dict[str, str] | None = None,
        payload: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        """Send one request; record it; return its status (0: no answer) and body."""
        data = None
        sent = dict(headers or {})
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            sent |= {"Referer": f"{self.base}{path}", "Origin": self.base}
        elif payload is not None:
            data = json.dumps(payload).encode()
            sent["Content-Type"] = "application/json"
        request = urllib.request.Request(f"{self.base}{path}", data=data, headers=sent)
        started = time.time()
        status, body = 0, ""
        try:
            with self.opener.open(request, timeout=TIMEOUT_S) as response:
                status, body = int(response.status), response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, body = int(exc.code), exc.read().decode(errors="replace")
        except OSError as exc:
            with self.rec.lock:
                self.rec.errors[f"{name}: {type(exc).__name__}"] += 1
        self.rec.add(name, status, (time.time() - started) * 1000, started)
        return status, body

    def sign_in(self, tokens: dict[str, str], tokens_lock: threading.Lock) -> None:
        _, page = self.request("GET /login/", "/login/")
        found = CSRF.search(page)
        form = {
            "username": self.username,
            "password": self.config["password"],
            "csrfmiddlewaretoken": found.group(1) if found else "",
        }
        self.request("POST /login/ POST", "/login/", form=form)
        with tokens_lock:  # the users of one account share its token, as in load_users
            self.token = tokens.get(self.username, "")
            if not self.token:
                credentials = {"username": self.username, "password": self.config["password"]}
                status, body = self.request(
                    "POST /api/auth/token", "/api/auth/token", payload=credentials
                )
                if status == 200:
                    self.token = tokens[self.username] = json.loads(body)["token"]

    def inbox(self) -> None:
        query = random.choice(["", "", "?page=2", "?kind=step"])
        _, text = self.request("GET /inbox/", f"/inbox/{query}")
        self.gates = [int(g) for g in GATE_LINK.findall(text)] or self.gates
        self.cases = [int(c) for c in CASE_LINK.findall(text)] or self.cases

    def gate_page(self) -> None:
        if self.gates:
            self.request("GET /gates/[id]/", f"/gates/{random.choice(self.gates)}/")

    def case_page(self) -> None:
        if self.cases:
            case = random.choice(self.cases)
            self.request("GET /cases/[id]/", f"/cases/{case}/")
            self.request(
                "GET /cases/[id]/gates/", f"/cases/{case}/gates/", headers={"HX-Request": "true"}
            )

    def api_gates(self) -> None:
        bearer = {"Authorization": f"Bearer {self.token}"}
        self.request("GET /api/gates", "/api/gates?status=pending", headers=bearer)

    def decide(self) -> None:
        if not self.gates:
            return
        gate = random.choice(self.gates)
        status, text = self.request("GET /gates/[id]/", f"/gates/{gate}/")
        csrf, version, digest = CSRF.search(text), VERSION.search(text), CONTENT_HASH.search(text)
        if status != 200 or not (csrf and version and digest):
            self.rec.count("not_decidable")
            return
        approve = random.random() >= 0.1
        decision: dict[str, Any] = {
            "decision": "approve" if approve else "reject",
            "version": int(version.group(1)),
            "content_hash": digest.group(1),
        }
        if approve:
            decision["password"] = self.config["password"]
        else:
            decision |= {"reason_code": self.config["reject_code"], "reason": "load run"}
        if random.random() < 0.5:
            via, ok = "form", 302
            form = {k: str(v) for k, v in decision.items()}
            form |= {"detail_opened": "1", "csrfmiddlewaretoken": csrf.group(1)}
            status, _ = self.request("POST /gates/[id]/decide", f"/gates/{gate}/decide", form=form)
        else:
            via, ok = "api", 200
            status, _ = self.request(
                "POST /api/gates/[id]/decision",
                f"/api/gates/{gate}/decision",
                payload=decision,
                headers={"Authorization": f"Bearer {self.token}"},
            )
        if status == ok:
            self.rec.count(f"decided.{via}.{decision['decision']}")
        elif status == 409:
            self.rec.count(f"conflict.{via}")
        else:
            self.rec.count(f"unexpected.{via}.{status}")


# The tasks and their weights, as in load_users.
TASKS = [("inbox", 4), ("gate_page", 3), ("case_page", 2), ("api_gates", 1), ("decide", 2)]


def run_users(config: dict[str, Any]) -> dict[str, Any]:
    """Run config["users"] officers for config["seconds"] after they have all signed in.

    The config has the keys load_users reads: host, users, seconds, wait (low and high pause,
    seconds), officers, password, reject_code; spawn_rate (users started per second).
    """
    base = config["host"]
    if urllib.parse.urlsplit(base).hostname != "127.0.0.1":
        raise ValueError(f"the load run targets 127.0.0.1 only, not {base!r}")
    rec = _Recorder()
    tokens: dict[str, str] = {}
    tokens_lock = threading.Lock()
    signed_in = threading.Barrier(config["users"] + 1)
    stop = threading.Event()
    names = [name for name, _ in TASKS]
    weights = [weight for _, weight in TASKS]

    def officer(index: int) -> None:
        user = _Officer(base, config["officers"][index % len(config["officers"])], config, rec)
        try:
            user.sign_in(tokens, tokens_lock)
            user.inbox()
        except Exception as exc:  # counted; the window never opens
            with rec.lock:
                rec.errors[f"signing in: {exc!r}"] += 1
            signed_in.abort()
            return
        try:
            signed_in.wait()
        except threading.BrokenBarrierError:
            return
        while not stop.is_set():
            try:
                getattr(user, random.choices(names, weights)[0])()
            except Exception as exc:
                with rec.lock:
                    rec.errors[repr(exc)] += 1
            stop.wait(random.uniform(*config["wait"]))

    threads = [
        threading.Thread(target=officer, args=(i,), daemon=True) for i in range(config["users"])
    ]
    started = time.time()
    for thread in threads:
        thread.start()
        time.sleep(1 / config["spawn_rate"])
    try:
        signed_in.wait(timeout=config.get("sign_in_limit", 300.0))
        opened = True
    except threading.BrokenBarrierError:
        opened = False
    window_from = time.time()
    if opened:
        time.sleep(config["seconds"])
    stop.set()
    for thread in threads:
        thread.join(timeout=TIMEOUT_S)  # each finishes the task it is in
    ended = time.time()
    return {
        "seconds": ended - window_from,
        "sign_in_s": window_from - started,
        "window_opened": opened,
        "requests": [(n, s, ms, t - window_from) for n, s, ms, t in rec.requests],
        "decisions": dict(rec.decisions),
        "errors": dict(rec.errors),
    }
