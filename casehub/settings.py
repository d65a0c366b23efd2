"""CaseHub settings, read from environment variables (see .env.example)."""

from __future__ import annotations

import ipaddress
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.utils.csp import CSP

from planning.core.llm.pricing import PriceTable, PriceTableInvalid
from web.env import (
    ConfigError,
    env_bool,
    env_choice,
    env_decimal,
    env_float,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CASEHUB_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEMO = env_bool("CASEHUB_DEMO")
DEBUG = env_bool("DEBUG")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if not DEMO:
        raise ConfigError(
            "SECRET_KEY is required. Set it in the environment, or set CASEHUB_DEMO=1 "
            "to have a key generated once under var/."
        )
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "ninja",
    "audit",
    "accounts",
    "planning",
    "oversight",
    "execution",
    "quality",
    # The project itself, for its management command (runcasehub); it holds no models.
    "casehub",
]

MIDDLEWARE = [
    # First: request counts and latencies (and server spans) cover the whole stack.
    "observability.middleware.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Below WhiteNoise: static files keep their caching; every other answer is never stored.
    "web.middleware.NoStoreMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "web.middleware.SessionIdleMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "casehub.urls"
WSGI_APPLICATION = "casehub.wsgi.application"
ASGI_APPLICATION = "casehub.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "casehub.context_processors.navigation",
                "accounts.context_processors.sign_in",
            ],
        },
    },
]

# Database: PostgreSQL in production; SQLite under var/ by default. SQLite runs in WAL mode with a
# busy timeout and BEGIN IMMEDIATE, so the web server and the worker writing at once queue up
# instead of failing with "database is locked".
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'casehub.sqlite3'}"),
        conn_max_age=env_int("CONN_MAX_AGE", 0),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not memory, so that worker subprocesses in the integration tests share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-casehub.sqlite3")}
elif env_bool("CASEHUB_DB_PREPARED_STATEMENTS", True):
    # Django turns psycopg's prepared statements off (prepare_threshold None) and binds its own
    # queries on the client, which never prepare. A threshold lets the few statements that ask
    # for it be prepared once per connection (the audit append: audit.chain._PreparingCursor);
    # it is high enough that nothing else is prepared by repetition. Off for a connection
    # pooler in transaction mode that cannot keep prepared statements.
    _pg_options = DATABASES["default"].setdefault("OPTIONS", {})
    _pg_options["prepare_threshold"] = 1_000_000
    # Those statements look rows up by key (a leaf, its version, the chain head): one plan serves
    # every call. Left to choose, PostgreSQL plans a prepared statement anew at each call while its
    # generic plan looks dearer than a custom one, and the release of a leaf's dependents always
    # did (0.6 ms of planning at every completion). Django's own queries are not prepared: this
    # changes nothing for them.
    _pg_options["options"] = (
        f"{_pg_options.get('options', '')} -c plan_cache_mode=force_generic_plan".strip()
    )

# PostgreSQL with two roles (scripts/setup-postgres-roles.sql): migrations run as the tables' owner
# and leave the application's role, named here, with INSERT and SELECT only on the audit events.
CASEHUB_DB_APP_ROLE = env_str("CASEHUB_DB_APP_ROLE")
# Seconds a Celery worker keeps a database connection between tasks (web.db.keep_connections);
# CONN_MAX_AGE is the web server's.
CASEHUB_WORKER_CONN_MAX_AGE = env_int("CASEHUB_WORKER_CONN_MAX_AGE", 300, minimum=0)
# Celery's Django fixup closes every connection after each task unless this many tasks may reuse
# one; casehub.celery closes them by CASEHUB_WORKER_CONN_MAX_AGE and health instead.
CELERY_DB_REUSE_MAX = 1_000_000 if CASEHUB_WORKER_CONN_MAX_AGE else None

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Argon2id first (about a quarter of PBKDF2's CPU at Django's parameters on this kind of machine;
# 100 MiB a hash); PBKDF2 still verifies older hashes, which are upgraded at the next sign-in.
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_MIMETYPES = {".wasm": "application/wasm", ".mjs": "text/javascript"}

# Headers and limits ---------------------------------------------------------------------------
# The CSP allows no inline script but one carrying the request's nonce (templates put
# nonce="{{ csp_nonce }}" on every <script>), no inline style, no plugins, no <base>, no framing.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE, CSP.WASM_UNSAFE_EVAL],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}
# The largest legitimate body (a case with its description and inputs) is well under 100 kB; a
# larger one is refused before it is read (413 from the API, 400 elsewhere). Files are not counted.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Cases one user may submit a minute (web form and API together), and of those how many may plan
# with the LLM (strategies llm and hybrid: each costs model calls). Over it: 429 with Retry-After.
CASEHUB_SUBMIT_RATE_PER_MINUTE = env_int("CASEHUB_SUBMIT_RATE_PER_MINUTE", 30, minimum=1)
CASEHUB_SUBMIT_LLM_RATE_PER_MINUTE = env_int("CASEHUB_SUBMIT_LLM_RATE_PER_MINUTE", 10, minimum=1)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", not DEBUG and not DEMO)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", SECURE_HSTS_SECONDS > 0)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Celery: Redis or RabbitMQ in production; kombu's filesystem transport under var/ by default,
# polled every 50 ms so the embedded mode feels instant.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", f"file://{VAR_DIR / 'celery-results'}")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's transport, each message renamed into place once written (casehub/broker.py)
    CELERY_BROKER_TRANSPORT = "casehub.broker:Transport"
    _queue_dir = VAR_DIR / "broker"
    _queue_dir.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "control_folder": str(VAR_DIR / "broker-control"),
        "store_processed": False,
        "polling_interval": 0.05,
    }
if CELERY_RESULT_BACKEND.startswith("file://"):
    (VAR_DIR / "celery-results").mkdir(parents=True, exist_ok=True)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = 3600
# A planning run holds its case for this long; past it the reconciler plans the case again.
CASEHUB_PLANNING_LEASE_S = env_int("CASEHUB_PLANNING_LEASE_S", 900, minimum=1)
CASEHUB_PLANNING_MAX_ATTEMPTS = env_int("CASEHUB_PLANNING_MAX_ATTEMPTS", 3, minimum=1)
CASEHUB_RECONCILE_INTERVAL_S = env_int("CASEHUB_RECONCILE_INTERVAL_S", 30, minimum=1)
# Execution (DESIGN §5). A running leaf holds a lease it renews every third of it; a lease
# that runs out (a dead or stopped worker) lets the reconciler recover the leaf. Past the soft
# limit a leaf is interrupted (prefork/solo workers); past the hard limit it is timed out, never
# re-run silently. Retries (failure policy retry, transient errors) back off exponentially with
# full jitter; a leaf whose worker was lost this many times is dead-lettered.
CASEHUB_LEAF_LEASE_S = env_int("CASEHUB_LEAF_LEASE_S", 30, minimum=1)
CASEHUB_LEAF_SOFT_LIMIT_S = env_int("CASEHUB_LEAF_SOFT_LIMIT_S", 120, minimum=1)
CASEHUB_LEAF_HARD_LIMIT_S = env_int("CASEHUB_LEAF_HARD_LIMIT_S", 180, minimum=1)
CASEHUB_LEAF_MAX_ATTEMPTS = env_int("CASEHUB_LEAF_MAX_ATTEMPTS", 3, minimum=1)
CASEHUB_LEAF_MAX_DELIVERIES = env_int("CASEHUB_LEAF_MAX_DELIVERIES", 3, minimum=1)
CASEHUB_LEAF_RETRY_BASE_S = env_int("CASEHUB_LEAF_RETRY_BASE_S", 2, minimum=0)
CASEHUB_LEAF_RETRY_MAX_S = env_int("CASEHUB_LEAF_RETRY_MAX_S", 60, minimum=0)
# A ready leaf not claimed this long after it was sent is sent again (a lost message).
CASEHUB_LEAF_REDISPATCH_AFTER_S = env_int("CASEHUB_LEAF_REDISPATCH_AFTER_S", 30, minimum=1)
# A task runs the leaves its completions claim for this long, then hands the rest to the queue.
CASEHUB_LEAF_INLINE_S = env_int("CASEHUB_LEAF_INLINE_S", 10, minimum=0)
# On PostgreSQL a worker runs its next step while the last one's result is recorded on a thread
# of its own (its completion claims the step after the one running now).
CASEHUB_LEAF_OVERLAP = env_bool("CASEHUB_LEAF_OVERLAP", True)
# ... but a step that ran for less than this has its result recorded before the next one starts:
# recording it on the other thread would cost more than it hides.
CASEHUB_LEAF_OVERLAP_MIN_MS = env_int("CASEHUB_LEAF_OVERLAP_MIN_MS", 2, minimum=0)
CASEHUB_EXECUTION_RECONCILE_INTERVAL_S = env_int(
    "CASEHUB_EXECUTION_RECONCILE_INTERVAL_S", 10, minimum=1
)
# More domain packs, as dotted paths to a planning.core.pack.DomainPack.
CASEHUB_EXTRA_PACKS = env_list("CASEHUB_EXTRA_PACKS", [])
# Redis redelivers an unacknowledged message after this long: longer than any leaf may run
# (`check --deploy` warns when it is shorter than a run_leaf task's time limit; a message
# redelivered early is refused by the claim all the same). Overdue messages are looked for
# every tenth of it: at least every second, at most every 100 s (kombu's own default).
CASEHUB_BROKER_VISIBILITY_TIMEOUT_S = env_int(
    "CASEHUB_BROKER_VISIBILITY_TIMEOUT_S", max(3600, 4 * CASEHUB_LEAF_HARD_LIMIT_S), minimum=1
)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    _restore_sweep_s = min(100, max(1, CASEHUB_BROKER_VISIBILITY_TIMEOUT_S // 10))
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": CASEHUB_BROKER_VISIBILITY_TIMEOUT_S,
        "unacked_restore_interval": min(10, _restore_sweep_s),
        "unacked_restore_throttle": max(1, _restore_sweep_s // 10),
    }
if CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://")):
    # RabbitMQ: quorum queues (replicated, a message acknowledged only once it ran: acks_late),
    # every publish confirmed by the broker before `send_task` returns, and a retry's backoff
    # held by RabbitMQ (Celery's native delayed delivery, which routes through topic exchanges),
    # not by the worker that took it. The worker's prefetch is then per consumer (Celery turns
    # global QoS off for quorum queues).
    CELERY_TASK_DEFAULT_QUEUE_TYPE = "quorum"
    CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
# Every audit chain is verified and checkpointed this often (seconds).
CASEHUB_AUDIT_CHECKPOINT_INTERVAL_S = env_int(
    "CASEHUB_AUDIT_CHECKPOINT_INTERVAL_S", 3600, minimum=1
)
CELERY_BEAT_SCHEDULE = {
    "planning-reconcile": {
        "task": "planning.reconcile_planning",
        "schedule": float(CASEHUB_RECONCILE_INTERVAL_S),
    },
    "audit-checkpoints": {
        "task": "oversight.write_audit_checkpoints",
        "schedule": float(CASEHUB_AUDIT_CHECKPOINT_INTERVAL_S),
    },
    "execution-reconcile": {
        "task": "oversight.reconcile_execution",
        "schedule": float(CASEHUB_EXECUTION_RECONCILE_INTERVAL_S),
    },
}
# Ed25519 keys that sign audit export bundles: kept outside the database, never in a backup of it.
CASEHUB_SIGNING_KEY_DIR = Path(env_str("CASEHUB_SIGNING_KEY_DIR", str(VAR_DIR / "signing-keys")))
# Signed checkpoints of every audit chain, outside the database (one JSON-lines file a chain).
CASEHUB_AUDIT_ANCHOR_DIR = Path(env_str("CASEHUB_AUDIT_ANCHOR_DIR", str(VAR_DIR / "audit-anchors")))
CASEHUB_HEARTBEAT_INTERVAL_S = env_int("CASEHUB_HEARTBEAT_INTERVAL_S", 5)
CASEHUB_HEARTBEAT_STALE_S = env_int("CASEHUB_HEARTBEAT_STALE_S", 30)

# LLM provider (any OpenAI-compatible server); agents may override the model.
OPENAI_API_KEY = env_str("OPENAI_API_KEY")
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL")
CASEHUB_LLM_MODEL = env_str("CASEHUB_LLM_MODEL", "gpt-4o-mini")
# Goal-level verification also asks this model (same provider) once the pack's rules hold;
# empty: no LLM judge (execution/goal_judge.py).
CASEHUB_GOAL_JUDGE_MODEL = env_str("CASEHUB_GOAL_JUDGE_MODEL")
CASEHUB_LLM_TIMEOUT_S = env_int("CASEHUB_LLM_TIMEOUT_S", 60, minimum=1)
CASEHUB_LLM_MAX_RETRIES = env_int("CASEHUB_LLM_MAX_RETRIES", 2, minimum=0)
# LLM calls in flight at once in one planning run (a level of b^(d-1) calls runs in one latency).
CASEHUB_LLM_CONCURRENCY = env_int("CASEHUB_LLM_CONCURRENCY", 64, minimum=1)
# Every call bounds its answer: this ceiling, or what is left of the case's token budget.
CASEHUB_LLM_MAX_TOKENS_PER_CALL = env_int("CASEHUB_LLM_MAX_TOKENS_PER_CALL", 2048, minimum=16)
# json_object for servers without json_schema output (the schema then goes in the prompt).
CASEHUB_LLM_RESPONSE_FORMAT = env_choice(
    "CASEHUB_LLM_RESPONSE_FORMAT", ("json_schema", "json_object"), "json_schema"
)
# Sampling temperature sent with every LLM call (0 to 2); unset: none is sent (the server's own).
CASEHUB_LLM_TEMPERATURE = env_float("CASEHUB_LLM_TEMPERATURE", low=0.0, high=2.0)
# Model calls an `llm` agent may make for one leaf (tool rounds and its answer); more fails it.
CASEHUB_LLM_AGENT_MAX_ROUNDS = env_int("CASEHUB_LLM_AGENT_MAX_ROUNDS", 4, minimum=1)
# Budgets of one planning run: exceeding one fails planning cleanly.
CASEHUB_LLM_MAX_CALLS = env_int("CASEHUB_LLM_MAX_CALLS", 60, minimum=1)
CASEHUB_LLM_MAX_TOKENS = env_int("CASEHUB_LLM_MAX_TOKENS", 500_000, minimum=1)
CASEHUB_PLAN_MAX_LEAVES = env_int("CASEHUB_PLAN_MAX_LEAVES", 500, minimum=1)
CASEHUB_PLAN_MAX_FANOUT = env_int("CASEHUB_PLAN_MAX_FANOUT", 12, minimum=1)
# Prices of LLM calls, dollars per million tokens: "model=input/output,…" ("*" for any other
# model); estimated costs and money budgets use it (planning/core/llm/pricing.py).
CASEHUB_LLM_PRICES = env_str("CASEHUB_LLM_PRICES")
try:
    CASEHUB_LLM_PRICE_TABLE = PriceTable.parse(CASEHUB_LLM_PRICES)
except PriceTableInvalid as _exc:
    raise ConfigError(f"CASEHUB_LLM_PRICES: {_exc}") from None
# LLM budgets (planning/budgets.py), 0 or empty = no limit. Per case: every call of the case,
# planning (all its runs, re-planning too), llm agents and the goal judge; the per-run ceilings
# above still stop one planning run earlier. Per day (the day of TIME_ZONE): all cases together.
# Checked before each call against its worst case (the request's size + its max_tokens at the
# model's price); a call that would pass a budget is not made. A money budget refuses calls of
# models that CASEHUB_LLM_PRICES does not price (fail closed).
CASEHUB_LLM_CASE_MAX_CALLS = env_int("CASEHUB_LLM_CASE_MAX_CALLS", 0, minimum=0)
CASEHUB_LLM_CASE_MAX_TOKENS = env_int("CASEHUB_LLM_CASE_MAX_TOKENS", 0, minimum=0)
CASEHUB_LLM_CASE_MAX_COST_USD = env_decimal("CASEHUB_LLM_CASE_MAX_COST_USD")
CASEHUB_LLM_DAY_MAX_CALLS = env_int("CASEHUB_LLM_DAY_MAX_CALLS", 0, minimum=0)
CASEHUB_LLM_DAY_MAX_TOKENS = env_int("CASEHUB_LLM_DAY_MAX_TOKENS", 0, minimum=0)
CASEHUB_LLM_DAY_MAX_COST_USD = env_decimal("CASEHUB_LLM_DAY_MAX_COST_USD")
for _name in ("CASEHUB_LLM_CASE_MAX_COST_USD", "CASEHUB_LLM_DAY_MAX_COST_USD"):
    if globals()[_name] and not CASEHUB_LLM_PRICE_TABLE.price_of(CASEHUB_LLM_MODEL):
        raise ConfigError(
            f"{_name} is set but CASEHUB_LLM_PRICES has no price for CASEHUB_LLM_MODEL "
            f"{CASEHUB_LLM_MODEL!r} (nor a '*' entry): a money budget needs the model's price"
        )
# The class that keeps the budget ledger, by dotted path: planning may not import oversight.
CASEHUB_LLM_BUDGET_BACKEND = "planning.budgets.LedgerBudgets"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# Oversight -----------------------------------------------------------------------------------
# Called with each plan version just stored, in its transaction: the version's gates open there.
CASEHUB_PLAN_VERSION_HOOKS = ["oversight.actions.opening.open_gates"]
# Called with each case whose planning just failed (plan_failed), in its transaction: its
# submitter is notified there.
CASEHUB_PLAN_FAILED_HOOKS = ["oversight.notify.case_plan_failed"]
# Called with each gate just decided and its decision, in the deciding transaction: execution
# starts, resumes or fails steps there.
CASEHUB_GATE_DECIDED_HOOKS = ["execution.decisions.on_gate_decided"]
# Re-plans a case gets (failure policy `replan`); past that the step escalates.
CASEHUB_MAX_REPLANS = env_int("CASEHUB_MAX_REPLANS", 2, minimum=0)
# Gates (reminders, escalation, hold) and work items (reminders, escalation) are swept this often
# (seconds).
CASEHUB_GATE_SWEEP_INTERVAL_S = env_int("CASEHUB_GATE_SWEEP_INTERVAL_S", 60, minimum=1)
CELERY_BEAT_SCHEDULE["gate-sweep"] = {
    "task": "oversight.sweep_gates",
    "schedule": float(CASEHUB_GATE_SWEEP_INTERVAL_S),
}
CELERY_BEAT_SCHEDULE["work-item-sweep"] = {
    "task": "oversight.sweep_work_items",
    "schedule": float(CASEHUB_GATE_SWEEP_INTERVAL_S),
}
# Wrong signature passwords in a row before signing locks for the user (an admin unlocks it).
CASEHUB_SIGNING_MAX_FAILURES = env_int("CASEHUB_SIGNING_MAX_FAILURES", 5, minimum=1)
# A password reset of an officer, supervisor, auditor or admin waits this long for a second admin.
CASEHUB_PASSWORD_RESET_LIFETIME_HOURS = env_int(
    "CASEHUB_PASSWORD_RESET_LIFETIME_HOURS", 24, minimum=1
)

# E-mail notifications (gate opened, case decided). Demo mode writes them under var/mail/.
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "casehub@localhost")
CASEHUB_BASE_URL = env_str("CASEHUB_BASE_URL", "http://127.0.0.1:8000")
_MAIL_BACKEND = env_str(
    "CASEHUB_MAIL_BACKEND",
    "django.core.mail.backends.filebased.EmailBackend"
    if DEMO
    else "django.core.mail.backends.smtp.EmailBackend",
)
if _MAIL_BACKEND.endswith("filebased.EmailBackend"):
    _MAIL_OPTIONS: dict[str, object] = {"file_path": str(VAR_DIR / "mail")}
elif _MAIL_BACKEND.endswith("smtp.EmailBackend"):
    _MAIL_OPTIONS = {
        "host": env_str("CASEHUB_SMTP_HOST", "localhost"),
        "port": env_int("CASEHUB_SMTP_PORT", 25, minimum=1),
        "username": env_str("CASEHUB_SMTP_USER"),
        "password": env_str("CASEHUB_SMTP_PASSWORD"),
        "use_tls": env_bool("CASEHUB_SMTP_TLS"),
        "timeout": env_int("CASEHUB_SMTP_TIMEOUT_S", 10, minimum=1),
    }
else:
    _MAIL_OPTIONS = {}
MAILERS = {"default": {"BACKEND": _MAIL_BACKEND, "OPTIONS": _MAIL_OPTIONS}}

# Access denials (403, 404, bad tokens) are counted per client and minute; each finished minute
# that counted more than one is summarised in one audit event by this task.
CELERY_BEAT_SCHEDULE["access-denials"] = {
    "task": "oversight.flush_access_denials",
    "schedule": 60.0,
}
# Pending password resets and role grants past CASEHUB_PASSWORD_RESET_LIFETIME_HOURS expire.
CELERY_BEAT_SCHEDULE["admin-requests"] = {
    "task": "oversight.expire_admin_requests",
    "schedule": 600.0,
}

# Login throttling, sessions and tokens ------------------------------------------------------
# django-axes counts failed sign-ins (/login/, the admin's login, POST /api/auth/token) in its
# database tables, which every web worker shares (the default cache is per process, so no counter
# lives there). Three limits, each answered 429 with Retry-After before any password is checked
# (accounts.throttling; docs/security.md, Sign-in throttling, says why each is what it is):
# - a username from one address (the pair): CASEHUB_LOGIN_FAILURE_LIMIT failures within
#   CASEHUB_LOGIN_COOLOFF_MINUTES lock that pair only, never the user elsewhere nor another user
#   from the same address; an admin may lift it (Sign-in lockouts page, audited);
# - one address over all usernames (password spraying): CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT
#   failures within the same cool-off;
# - one username over all addresses (a distributed attack): CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT
#   failures within CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS slow it to that rate, never lock it
#   (5 in 3 minutes: at most 100 guesses an hour at one account from addresses it never used).
# The username limit spares an address someone signed in from within
# CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS (axes's access log; 0: none is spared), for every username
# tried there, so an attacker elsewhere cannot keep an owner out at their usual address and no
# answer depends on whether the username exists; the pair and address limits hold there. Every
# refusal reads the same whichever limit it is. Failures during a refusal are not counted and do
# not extend it; a successful sign-in clears that pair's failures.
INSTALLED_APPS += ["axes"]
MIDDLEWARE += ["axes.middleware.AxesMiddleware"]
CASEHUB_LOGIN_FAILURE_LIMIT = env_int("CASEHUB_LOGIN_FAILURE_LIMIT", 10, minimum=1)
CASEHUB_LOGIN_COOLOFF_MINUTES = env_int("CASEHUB_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT", 100, minimum=1)
CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT = env_int("CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT", 5, minimum=1)
CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS = env_int(
    "CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS", 180, minimum=1
)
if CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS > CASEHUB_LOGIN_COOLOFF_MINUTES * 60:
    # axes deletes failures older than the cool-off: a longer window would count too few.
    raise ConfigError(
        "CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS cannot be longer than CASEHUB_LOGIN_COOLOFF_MINUTES."
    )
CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS = env_int("CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS", 30, minimum=0)
# Behind N reverse proxies that each append to X-Forwarded-For, set N: the client is the N-th
# address from the right. 0 (the default): REMOTE_ADDR, and X-Forwarded-For is ignored.
CASEHUB_TRUSTED_PROXY_COUNT = env_int("CASEHUB_TRUSTED_PROXY_COUNT", 0, minimum=0)
AXES_FAILURE_LIMIT = CASEHUB_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=CASEHUB_LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "accounts.throttling.ThrottlingHandler"
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "web.http.client_ip"
AXES_LOCKOUT_CALLABLE = "accounts.throttling.throttled_response"
AXES_HTTP_RESPONSE_CODE = 429
# The audit trail records sign-ins and lockouts; axes's own admin (unaudited deletes) stays off
# (admins lift lockouts on the Sign-in lockouts page). axes's access log is written by
# accounts.throttling, not by axes (which would give an API call a session): one row per
# successful sign-in, web or API, kept CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS.
AXES_ENABLE_ADMIN = False
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False
# Sessions: database-backed (accounts.sessions ends a user's sessions by reading them),
# HttpOnly, Secure outside DEBUG and demo mode (SECURE_COOKIES above), SameSite=Lax, and ended
# after CASEHUB_SESSION_IDLE_MINUTES without a request (use moves the expiry on every minute).
SESSION_ENGINE = "django.contrib.sessions.backends.db"
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
CASEHUB_SESSION_IDLE_MINUTES = env_int("CASEHUB_SESSION_IDLE_MINUTES", 30, minimum=1)
# The navigation's counts (inbox, work items, unread notices, the stop switch) are kept this many
# seconds per user in each web process; a user's own change counts afresh at once (0: never kept).
CASEHUB_NAV_COUNTS_TTL_S = env_int("CASEHUB_NAV_COUNTS_TTL_S", 5, minimum=0)
SESSION_COOKIE_AGE = CASEHUB_SESSION_IDLE_MINUTES * 60
# web.middleware.SessionIdleMiddleware moves the expiry on, once a minute of use at most.
SESSION_SAVE_EVERY_REQUEST = False
# API tokens live this long from their creation; a user holds at most this many (a new one
# beyond it revokes the oldest).
CASEHUB_API_TOKEN_TTL_HOURS = env_int("CASEHUB_API_TOKEN_TTL_HOURS", 168, minimum=1)
CASEHUB_API_TOKEN_MAX_PER_USER = env_int("CASEHUB_API_TOKEN_MAX_PER_USER", 5, minimum=1)

# Sign-in through the organisation's identity provider (OpenID Connect, authorization code flow
# with PKCE; accounts/oidc.py, docs/security.md). Off unless CASEHUB_OIDC_ISSUER is set; the
# endpoints come from <issuer>/.well-known/openid-configuration, fetched when first needed and
# cached for an hour. Group claim values map to roles through the admins' OIDC group mappings.
CASEHUB_OIDC_ISSUER = env_str("CASEHUB_OIDC_ISSUER").rstrip("/")
CASEHUB_OIDC_CLIENT_ID = env_str("CASEHUB_OIDC_CLIENT_ID")
CASEHUB_OIDC_CLIENT_SECRET = env_str("CASEHUB_OIDC_CLIENT_SECRET")
CASEHUB_OIDC_PROVIDER_NAME = env_str("CASEHUB_OIDC_PROVIDER_NAME", "your organisation")
CASEHUB_OIDC_SCOPES = env_str("CASEHUB_OIDC_SCOPES", "openid profile email")
CASEHUB_OIDC_GROUPS_CLAIM = env_str("CASEHUB_OIDC_GROUPS_CLAIM", "groups")
# An e-signature of a user whose password sign-in is off asks for a fresh sign-in at the
# provider: its auth_time may be at most this old when CaseHub gets the ID token.
CASEHUB_OIDC_REAUTH_MAX_AGE_S = env_int("CASEHUB_OIDC_REAUTH_MAX_AGE_S", 300, minimum=10)
CASEHUB_OIDC_TIMEOUT_S = env_int("CASEHUB_OIDC_TIMEOUT_S", 10, minimum=1)
if CASEHUB_OIDC_ISSUER and not (CASEHUB_OIDC_CLIENT_ID and CASEHUB_OIDC_CLIENT_SECRET):
    raise ConfigError(
        "CASEHUB_OIDC_ISSUER is set: CASEHUB_OIDC_CLIENT_ID and CASEHUB_OIDC_CLIENT_SECRET are "
        "required too."
    )
# The password backend refuses users whose password sign-in is off; the OIDC backend answers
# only the provider's callback (and nothing while no issuer is set).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "accounts.signin.PasswordBackend",
    "accounts.oidc.OidcBackend",
]
# mozilla-django-oidc's fixed choices (the env-driven ones are read by accounts.oidc itself).
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True
OIDC_AUTHENTICATION_CALLBACK_URL = "accounts:oidc-callback"
LOGIN_REDIRECT_URL_FAILURE = "login"
if CASEHUB_OIDC_ISSUER:
    # Log out posts a form that the server redirects to the provider's end-session endpoint:
    # Chrome applies form-action to that redirect.
    _issuer = urlsplit(CASEHUB_OIDC_ISSUER)
    SECURE_CSP["form-action"] = [CSP.SELF, f"{_issuer.scheme}://{_issuer.netloc}"]
# The audit trail records every failed sign-in; axes need not log each one as a warning too.
LOGGING["loggers"]["axes"] = {"level": "ERROR"}  # type: ignore[index]

# Operations: GET /metrics (Prometheus) answers clients whose address is in these networks
# (after CASEHUB_TRUSTED_PROXY_COUNT), and, when a token is set, only with `Authorization:
# Bearer <token>`; anyone else gets 403. Tracing is configured by the OTEL_* variables
# (observability/tracing.py), off unless they ask for it.
try:
    CASEHUB_METRICS_ALLOW = [
        ipaddress.ip_network(network, strict=False)
        for network in env_list("CASEHUB_METRICS_ALLOW", ["127.0.0.0/8", "::1/128"])
    ]
except ValueError as _exc:
    raise ConfigError(f"CASEHUB_METRICS_ALLOW: {_exc}") from None
CASEHUB_METRICS_TOKEN = env_str("CASEHUB_METRICS_TOKEN")
