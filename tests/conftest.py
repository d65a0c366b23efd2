"""Shared fixtures: personas, a real Celery worker process, and a real headless browser."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import personas
from tests.fakes.fixtures import fake_openai  # noqa: F401  (a fixture for every test)
from tests.fakes.openai_server import FakeOpenAIServer
from tests.oidc_provider.provider import CLIENT_ID, CLIENT_SECRET, OidcProvider

ROOT = Path(__file__).resolve().parent.parent
# CI sets this so that a test skipped for want of a service or a browser fails the run instead.
FAIL_ON_SKIP = os.environ.get("CASEHUB_FAIL_ON_SKIP", "") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if FAIL_ON_SKIP and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped, but CASEHUB_FAIL_ON_SKIP=1 forbids skips: {report.longrepr}"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # Real hashing costs ~0.3 s a password; tests only need passwords to match.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _navigation_counted_on_every_page(settings: Any) -> None:
    # Tests count a page's queries and see counts change at once; the few seconds the counts are
    # kept in production are tested on their own (tests/casehub/test_navigation_counts.py).
    settings.CASEHUB_NAV_COUNTS_TTL_S = 0


@pytest.fixture(scope="session", autouse=True)
def _demo_erp_in_the_test_database() -> None:
    # Cases are checked against their pack's systems at submission and act on them. Load the demo
    # systems (ERP, estate, accounts) wherever the packs are registered: after the test database
    # is migrated and after every flush, which also undoes what a test's steps did to them.
    from django.apps import apps
    from django.db.models.signals import post_migrate

    from planning.catalogue import load_demo_systems

    post_migrate.connect(
        lambda **kwargs: load_demo_systems(),
        sender=apps.get_app_config("planning"),
        weak=False,
        dispatch_uid="tests-demo-erp",
    )


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """Let the flush between transactional tests empty the audit table of the test databases.

    The flush (TRUNCATE on PostgreSQL, DELETE on SQLite) is refused by the append-only triggers,
    so it runs with them suspended for its own transaction, on the test databases only; every test
    body meets them in force.
    """
    from django.db import connections, transaction
    from django.db.backends.base.operations import BaseDatabaseOperations

    from tests.audit_triggers import audit_triggers_suspended

    test_databases = {alias: connections[alias].settings_dict["NAME"] for alias in connections}
    original = BaseDatabaseOperations.execute_sql_flush

    def execute_sql_flush(ops: BaseDatabaseOperations, sql_list: list[str]) -> None:
        conn = ops.connection
        if test_databases.get(conn.alias) != conn.settings_dict["NAME"]:
            original(ops, sql_list)
            return
        with transaction.atomic(using=conn.alias), audit_triggers_suspended(conn):
            original(ops, sql_list)

    BaseDatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]
    try:
        yield
    finally:
        BaseDatabaseOperations.execute_sql_flush = original  # type: ignore[method-assign]
        # The worker's completer thread holds a connection to the test database of its own
        # (`execution.worker`): closed before the database is dropped.
        from execution.worker import stop_completer

        stop_completer()


# Personas ---------------------------------------------------------------------------------------


@pytest.fixture
def analyst(db: None) -> Any:
    return personas.analyst()


@pytest.fixture
def officer(db: None) -> Any:
    return personas.officer()


@pytest.fixture
def second_officer(db: None) -> Any:
    return personas.second_officer()


@pytest.fixture
def auditor(db: None) -> Any:
    return personas.auditor()


@pytest.fixture
def admin_user(db: None) -> Any:
    return personas.admin()


@pytest.fixture
def outsider(db: None) -> Any:
    return personas.outsider()


# A real Celery worker process -------------------------------------------------------------------


def _database_url(settings_dict: dict[str, Any]) -> str:
    engine = settings_dict["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "localhost"
    port = settings_dict.get("PORT") or "5432"
    return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"


class WorkerProcess:
    """A `celery worker` subprocess on the test database and the configured broker."""

    def __init__(
        self, extra_env: dict[str, str] | None = None, concurrency: int = 4, pool: str = "threads"
    ) -> None:
        from django.db import connection

        self.env = {
            **os.environ,
            "DATABASE_URL": _database_url(connection.settings_dict),
            "CASEHUB_HEARTBEAT_INTERVAL_S": "1",
            **(extra_env or {}),
        }
        self.concurrency = concurrency
        self.pool = pool
        self.log_path = ROOT / "var" / f"test-worker-{os.getpid()}-{id(self):x}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, purge: bool = True) -> WorkerProcess:
        from celery import current_app

        if purge:  # messages left by an earlier run would name rows that no longer exist
            current_app.control.purge()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "casehub", "worker",
                "--loglevel", "INFO", "--pool", self.pool,
                "--concurrency", str(self.concurrency),
                # one name a worker: RabbitMQ gives each name one exclusive control queue
                "--hostname", f"test-{os.getpid()}-{id(self):x}@%h",
                "--without-mingle", "--without-gossip",
            ],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def running_worker(
    extra_env: dict[str, str] | None = None,
    *,
    purge: bool = True,
    concurrency: int = 4,
    pool: str = "threads",
) -> WorkerProcess:
    """Start a worker and wait until it answers a ping (purge=False keeps queued tasks)."""
    from oversight.tasks import ping

    worker = WorkerProcess(extra_env, concurrency=concurrency, pool=pool).start(purge=purge)
    deadline = time.monotonic() + 60
    while True:
        try:
            ping.apply_async(args=["nobody"]).get(timeout=2)
            return worker
        except Exception:
            if worker.process is not None and worker.process.poll() is not None:
                pytest.fail(f"the worker exited early:\n{worker.log()[-4000:]}")
            if time.monotonic() > deadline:
                worker.stop()
                pytest.fail(f"the worker did not answer within 60 s:\n{worker.log()[-4000:]}")


@pytest.fixture
def worker_process(transactional_db: None) -> Iterator[WorkerProcess]:
    """Start a real worker for one test (no LLM provider) and wait until it answers a ping."""
    worker = running_worker({"OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""})
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def llm_worker_process(
    transactional_db: None,
    settings: Any,
    fake_openai: FakeOpenAIServer,  # noqa: F811 (the fixture imported above)
) -> Iterator[WorkerProcess]:
    """Start a real worker whose LLM provider is the test's fake OpenAI server.

    The test process sees the same provider, so that LLM cases may be submitted.
    """
    for name, value in fake_openai.env().items():
        setattr(settings, name, value)
    worker = running_worker(fake_openai.env())
    try:
        yield worker
    finally:
        worker.stop()


# A real OpenID provider ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """Start django-oauth-toolkit's OpenID provider in a process of its own, once a session."""
    provider = OidcProvider(tmp_path_factory.mktemp("oidc-provider")).start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def oidc(oidc_provider: OidcProvider, settings: Any, request: pytest.FixtureRequest) -> Any:
    """Point CaseHub at the test provider for one test (a well-behaved provider to begin with)."""
    from django.core.cache import cache

    settings.CASEHUB_OIDC_ISSUER = oidc_provider.issuer
    settings.CASEHUB_OIDC_CLIENT_ID = CLIENT_ID
    settings.CASEHUB_OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.CASEHUB_OIDC_PROVIDER_NAME = "Test IdP"
    settings.SECURE_CSP = {
        **settings.SECURE_CSP,
        "form-action": ["'self'", f"http://127.0.0.1:{oidc_provider.port}"],
    }
    urls = ["http://testserver"]
    if "page" in request.fixturenames or "live_server" in request.fixturenames:
        urls.append(request.getfixturevalue("live_server").url)
    oidc_provider.register_client(urls)
    oidc_provider.quirks()
    cache.clear()
    yield oidc_provider
    oidc_provider.quirks()
    cache.clear()


# A real headless browser ------------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Nothing may leave loopback.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
]


def chromium_path() -> str | None:
    return os.environ.get("CASEHUB_CHROMIUM") or shutil.which("chromium")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Launch Debian's chromium through Playwright (never a downloaded browser)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test body's ORM calls are
    # still synchronous, so Django's async-safety guard must be told.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            yield instance
            instance.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def page(browser: Any, live_server: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser context and page; a screenshot lands under test-results/ on teardown."""
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    yield page
    out = ROOT / "test-results" / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "last.png"), full_page=True)
    context.close()
