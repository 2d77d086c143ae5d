"""Django settings for the SMQP broker.

Everything an operator may want to change comes from the environment, with defaults that give a
working single-machine broker with no configuration at all (SQLite under ``var/``, Redis on
localhost).
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from broker import redisconf

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SMQP_VAR_DIR", BASE_DIR / "var")).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)
(VAR_DIR / "static").mkdir(exist_ok=True)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, else one generated on first start and kept under var/."""
    key = os.environ.get("DJANGO_SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_urlsafe(50)
        # O_EXCL: two processes starting at once must not both write a key.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text().strip()
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if h.strip()
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]
# The admin and REST behind a TLS-terminating proxy (Daphne itself serves plain HTTP): the
# proxy sets X-Forwarded-Proto, cookies go only over HTTPS, browsers are told to stay on it.
DJANGO_BEHIND_TLS_PROXY = env_bool("DJANGO_BEHIND_TLS_PROXY", False)
if DJANGO_BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000)
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SSL_REDIRECT", True)

INSTALLED_APPS = [
    # Without autodiscovery: broker/urls.py loads the admin modules, so the processes that
    # serve no page (listener, storage processes, manage.py commands) do not pay for them.
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "channels",
    "accounts",
    "topics",
    "ual",
    "broker",
    "spark_jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Names the logged-in user as the actor of every UAL change (the audit log).
    "ual.audit.AuditActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "broker.urls"
ASGI_APPLICATION = "broker.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=600, conn_health_checks=True)
}
_SQLITE = DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
SMQP_SQLITE_SYNCHRONOUS = os.environ.get("SMQP_SQLITE_SYNCHRONOUS", "FULL").upper()
# How ACKs are committed: "relaxed" (default) commits without waiting for the disk flush, so
# a subscriber's next NOTIFY is not held back by an fsync per message; a crash of the
# listener (kill -9) loses nothing, a power loss may deliver an ACKed message once more
# (never loses one: publishes are always flushed). "full" flushes every ACK as well.
SMQP_ACK_DURABILITY = os.environ.get("SMQP_ACK_DURABILITY", "relaxed").lower()
# ACKs are appended to the listener's ACK journal (broker/store/journal.py) and 310 ACK goes at
# once; the database follows in batches (durable as above: "full" flushes the journal).
# Off: 310 ACK waits for the ACK's database commit.
SMQP_ACK_JOURNAL = env_bool("SMQP_ACK_JOURNAL", True)
# The listener's group commits (publishes, ACKs) run in storage processes of their own
# (broker/store/lanes.py), so they use another core than its event loop. Off: on its
# threads.
SMQP_STORAGE_PROCESSES = env_bool("SMQP_STORAGE_PROCESSES", True)
# A storage process that ended is started again after this many seconds (doubled, up to 30 s,
# while they keep ending within 10 s of their start), without waiting for the next call.
SMQP_STORAGE_RESTART_SECONDS = float(os.environ.get("SMQP_STORAGE_RESTART_SECONDS", "1"))
# Under a stream of publishes (broker/delivery/linger.py) a small publish batch waits up to
# this many milliseconds for more to join it: fewer, larger transactions, for at most this
# much more latency. 0: a batch goes at once. The defaults per backend are what the e2e
# benchmark favoured on each (bench/results/history.md).
SMQP_PUBLISH_LINGER_MS = env_int(
    "SMQP_PUBLISH_LINGER_MS",
    4 if _SQLITE else 0)
# PostgreSQL: the storage processes' connections prepare the statements they run again and
# again (broker/store/backends/postgresql.py). Off behind a pooler that cannot keep prepared
# statements (PgBouncer in transaction mode before 1.21, or without max_prepared_statements).
SMQP_PG_PREPARED_STATEMENTS = env_bool("SMQP_PG_PREPARED_STATEMENTS", True)
if _SQLITE:
    # Persistent: Channels closes connections older than this around every database call, and
    # reopening SQLite (with its PRAGMAs) costs more than most commands.
    DATABASES["default"]["CONN_MAX_AGE"] = None
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets readers run beside the one writer; synchronous=FULL keeps a committed
        # publish on disk before the publisher hears 200. IMMEDIATE takes the write lock at
        # BEGIN so concurrent writers queue on busy_timeout instead of failing mid-transaction.
        "init_command": (
            "PRAGMA journal_mode=WAL;"
            f"PRAGMA synchronous={SMQP_SQLITE_SYNCHRONOUS};"
            "PRAGMA foreign_keys=ON;"
        ),
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "accounts.Account"
PASSWORD_HASHERS = [
    "accounts.hashers.SMQPPBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]
# Iteration count of new password hashes; Django's own default unless set. SCRAM-SHA-256 reads
# the count back from each stored hash, so changing it never breaks existing accounts.
SMQP_PBKDF2_ITERATIONS = env_int("SMQP_PBKDF2_ITERATIONS", 0) or None

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# --- Redis: channel layer, Celery, cache ------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# High availability: with REDIS_SENTINELS ("host:port,host:port,...") every client finds the
# master named REDIS_MASTER_NAME through Redis Sentinel and follows its failovers; REDIS_URL
# then gives only the database number and password (broker/redisconf.py, docs/cluster.md).
try:
    REDIS = redisconf.from_environment(os.environ)
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from exc
REDIS_SENTINELS = REDIS.sentinels
REDIS_MASTER_NAME = REDIS.master_name
_cache_location, _cache_options = REDIS.cache_location_and_options()
CHANNEL_LAYERS = {
    "default": {
        # Redis pub/sub: a group_send is one PUBLISH and every process reads pushed
        # messages from one subscription, cheaper for the listener's event loop than the
        # list-based layer's round trips. Nothing here relies on messages waiting for a
        # consumer that is not there: wake-ups and notifications are for live sessions.
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [REDIS.channel_host()],
            "prefix": os.environ.get("SMQP_CHANNEL_PREFIX", "smqp"),
        },
    }
}
CACHES = {
    "default": {
        "BACKEND": "broker.redis_cache.RedisCache",
        "LOCATION": _cache_location,
        "KEY_PREFIX": os.environ.get("SMQP_CACHE_PREFIX", "smqp"),
        **({"OPTIONS": _cache_options} if _cache_options else {}),
    }
}
_celery_url, _celery_options = REDIS.celery_broker()
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", _celery_url)
if _celery_options and "CELERY_BROKER_URL" not in os.environ:
    CELERY_BROKER_TRANSPORT_OPTIONS = _celery_options
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("SMQP_CELERY_QUEUE", "smqp")
CELERY_BEAT_SCHEDULE: dict[str, dict] = {
    "expire-messages": {
        "task": "broker.expire_messages",
        "schedule": env_int("SMQP_EXPIRY_SWEEP_SECONDS", 5),
    },
    "purge-trash": {"task": "broker.purge_trash", "schedule": 3600},
    # Queue mode: locks past their deadline (their holder's process gone), and messages
    # waiting too long for one account.
    "expire-queue-locks": {
        "task": "broker.expire_queue_locks",
        "schedule": env_int("SMQP_REQUEUE_SWEEP_SECONDS", 5),
    },
    "requeue-queue-deliveries": {
        "task": "broker.requeue_queue_deliveries",
        "schedule": env_int("SMQP_REQUEUE_SWEEP_SECONDS", 5),
    },
    "recover-ack-journals": {
        "task": "broker.recover_ack_journals",
        "schedule": env_int("SMQP_JOURNAL_SWEEP_SECONDS", 30),
    },
    "finalize-topic-removals": {
        "task": "broker.finalize_topic_removals",
        "schedule": env_int("SMQP_REMOVAL_SWEEP_SECONDS", 30),
    },
}

# --- SMQP -------------------------------------------------------------------------------------
SMQP_HOST = os.environ.get("SMQP_HOST", "127.0.0.1")
# The SMQP listener's event loop: "uvloop" (libuv; its socket reads and writes, tasks and
# timers cost the listener less per message than the standard loop's) or "asyncio".
SMQP_EVENT_LOOP = os.environ.get("SMQP_EVENT_LOOP", "uvloop").strip().lower()
if SMQP_EVENT_LOOP not in ("uvloop", "asyncio"):
    raise ImproperlyConfigured(
        f"SMQP_EVENT_LOOP must be 'uvloop' or 'asyncio', not {SMQP_EVENT_LOOP!r}")
SMQP_PORT = env_int("SMQP_PORT", 720)
# The listener's HTTP health port (/healthz, /readyz) for a load balancer's check of SMQP;
# unset: none (runsmqp --health-port).
SMQP_HEALTH_PORT = env_int("SMQP_HEALTH_PORT", 0) if os.environ.get("SMQP_HEALTH_PORT") else None
SMQP_SERVER_CONTEXT = os.environ.get("SMQP_SERVER_CONTEXT") or socket.gethostname()
# SMQPS (profile §9.4): a TLS listener on SMQP_TLS_PORT when a certificate and its key are
# configured (PEM files; the certificate file may hold the chain). TLS 1.2 is the minimum.
SMQP_TLS_PORT = env_int("SMQP_TLS_PORT", 7443)
SMQP_TLS_CERT = os.environ.get("SMQP_TLS_CERT", "")
SMQP_TLS_KEY = os.environ.get("SMQP_TLS_KEY", "") or SMQP_TLS_CERT
SMQP_TLS = bool(SMQP_TLS_CERT)
# With the same certificate, runbroker's Daphne serves HTTPS (admin, REST, wss:// for XMPP)
# on this port beside plain HTTP.
SMQP_HTTPS_PORT = env_int("SMQP_HTTPS_PORT", 8443)
# The plain TCP listener (SMQP_PORT); SMQP_PLAIN=0 leaves only the TLS one.
SMQP_PLAIN = env_bool("SMQP_PLAIN", True)
# CLEAR logins on plain TCP: "yes", "no", or "loopback" (only from a loopback address). Once
# TLS is configured the default is "loopback": passwords cross the network only encrypted.
SMQP_CLEAR_ON_PLAIN = os.environ.get(
    "SMQP_CLEAR_ON_PLAIN", "loopback" if SMQP_TLS else "yes").strip().lower()
if SMQP_CLEAR_ON_PLAIN not in ("yes", "no", "loopback"):
    raise ImproperlyConfigured(
        f"SMQP_CLEAR_ON_PLAIN must be 'yes', 'no' or 'loopback', not {SMQP_CLEAR_ON_PLAIN!r}")
SMQP_SERVER_IDENT = os.environ.get("SMQP_SERVER_IDENT", "Django SMQP Broker/0.1")
# --- QQP (the ingestion door, docs: ../shared/design/QQP-PROFILE.md) ---------------------------
# The spec's ports 26 and 27 need root: 2626 plain, 2727 TLS (with the SMQP certificate).
SMQP_QQP_PORT = env_int("SMQP_QQP_PORT", 2626)
SMQP_QQP_TLS_PORT = env_int("SMQP_QQP_TLS_PORT", 2727)
# The Greeting's ItemLimit (largest item accepted) and SessionLimit (bytes per connection).
SMQP_QQP_ITEM_LIMIT = env_int("SMQP_QQP_ITEM_LIMIT", 1024 * 1024)
SMQP_QQP_SESSION_LIMIT = env_int("SMQP_QQP_SESSION_LIMIT", 256 * 1024 * 1024)
SMQP_QQP_EXCEPTIONS_TO = os.environ.get("SMQP_QQP_EXCEPTIONS_TO", "")
# Unsigned items are published as this account, from these peer addresses (comma-separated
# addresses or networks; "loopback" means 127.0.0.0/8 and ::1); no account: refused.
SMQP_QQP_UNSIGNED_ACCOUNT = os.environ.get("SMQP_QQP_UNSIGNED_ACCOUNT", "")
SMQP_QQP_UNSIGNED_FROM = os.environ.get("SMQP_QQP_UNSIGNED_FROM", "loopback")
# Days a publisher's ResourceIDs are remembered for duplicate detection.
SMQP_QQP_DEDUP_DAYS = env_int("SMQP_QQP_DEDUP_DAYS", 7)
# Message timeout for messages that name none and whose topics set none: one day.
SMQP_DEFAULT_TIMEOUT = env_int("SMQP_DEFAULT_TIMEOUT", 86_400)
SMQP_MAX_LINE = env_int("SMQP_MAX_LINE", 4096)
SMQP_MAX_MESSAGE_BYTES = env_int("SMQP_MAX_MESSAGE_BYTES", 64 * 1024 * 1024)
# A connection that has not logged in within this many seconds is closed.
SMQP_LOGIN_TIMEOUT = env_int("SMQP_LOGIN_TIMEOUT", 60)
# A logged-in connection with no traffic either way for this long is closed.
SMQP_IDLE_TIMEOUT = env_int("SMQP_IDLE_TIMEOUT", 1800)
# How often a listener's sessions with nothing to send look in the store for messages that
# are waiting for their account: a wake-up lost between processes (Redis restarting, say)
# then delays a message by this much instead of until the next login. 0 turns it off.
SMQP_BACKLOG_SWEEP_SECONDS = env_int("SMQP_BACKLOG_SWEEP_SECONDS", 15)
# A wake-up from another process older than this when it arrives (its sender's clock
# against this one's: keep the nodes' clocks synchronised) is not offered as live: the
# accounts it names read the store instead (broker.delivery.dispatcher.Dispatcher.offer).
SMQP_WAKEUP_MAX_AGE_SECONDS = float(os.environ.get("SMQP_WAKEUP_MAX_AGE_SECONDS", "1"))
# How often each process asks Redis whether topics or UAL entries changed elsewhere: a grant
# or revoke counts in every process at most this long after its commit. (A refusal, 401 or
# 404, is checked against Redis before it is given, a PUB's within its publish batch; a
# login reads the counters too.)
SMQP_CACHE_POLL_SECONDS = float(os.environ.get("SMQP_CACHE_POLL_SECONDS", "0.5"))
# A session holds at most this many waiting messages in memory (a backlog read from the
# store, or live messages for a subscriber slower than its publishers) and reads the next
# page, in delivery order, once it has sent those: a backlog of millions costs no more.
SMQP_BACKLOG_PAGE = env_int("SMQP_BACKLOG_PAGE", 10_000)
# The sweeps (expiry, trash purge, queue-mode retries) work in transactions of this many
# messages, batch after batch, for at most this long per run.
SMQP_SWEEP_BATCH = env_int("SMQP_SWEEP_BATCH", 10_000)
SMQP_SWEEP_BUDGET_SECONDS = env_int("SMQP_SWEEP_BUDGET_SECONDS", 4)
# GET MESSAGE reads and writes a long reply this many messages (or about this many bytes of
# data) at a time.
SMQP_GET_PAGE = env_int("SMQP_GET_PAGE", 100)
SMQP_GET_PAGE_BYTES = env_int("SMQP_GET_PAGE_BYTES", 16 * 1024 * 1024)
# Seconds between NOTIFY SERVER BYE and the close on shutdown.
SMQP_SHUTDOWN_GRACE = env_int("SMQP_SHUTDOWN_GRACE", 5)
SMQP_LOGIN_FAILURES_BEFORE_DELAY = env_int("SMQP_LOGIN_FAILURES_BEFORE_DELAY", 3)
SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT = env_int("SMQP_LOGIN_FAILURES_BEFORE_LOCKOUT", 10)
SMQP_LOGIN_LOCKOUT_SECONDS = env_int("SMQP_LOGIN_LOCKOUT_SECONDS", 300)
# Failed logins for one account from all addresses together before it is refused for a while
# (guessing spread over many addresses); per address the lockout threshold above applies.
SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_LOCKOUT = env_int(
    "SMQP_LOGIN_ACCOUNT_FAILURES_BEFORE_LOCKOUT", 100)

# Queue parameter defaults at the root of the topic tree (None: unlimited).
SMQP_QUEUE_DEFAULTS = {
    "expiry_timeout": SMQP_DEFAULT_TIMEOUT,
    "retry_timeout": env_int("SMQP_DEFAULT_RETRY_TIMEOUT", 30),
    "max_retries": env_int("SMQP_DEFAULT_MAX_RETRIES", 5),
    "max_message_count": None,
    "max_message_size": SMQP_MAX_MESSAGE_BYTES,
    "max_queue_bytes": None,
}

REST_FRAMEWORK = {
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("SMQP_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
SMQP_MAX_CHILD_TOPICS = env_int("SMQP_MAX_CHILD_TOPICS", 10_000)
SMQP_MAX_SUBSCRIPTIONS_PER_ACCOUNT = env_int("SMQP_MAX_SUBSCRIPTIONS_PER_ACCOUNT", 1000)
SMQP_MAX_TOPICS_PER_SUBSCRIBE = env_int("SMQP_MAX_TOPICS_PER_SUBSCRIBE", 1000)
# SET NOTIFY WINDOW (profile §9.7): NOTIFY MESSAGEs a session may have unacknowledged at once,
# at most (the login reply's Max-Window). Each costs its payload in memory and a timer.
SMQP_MAX_NOTIFY_WINDOW = env_int("SMQP_MAX_NOTIFY_WINDOW", 256)
SMQP_TRASH_RETENTION = env_int("SMQP_TRASH_RETENTION", 7 * 86_400)
SMQP_NOTIFY_CONNECT_TIMEOUT = env_int("SMQP_NOTIFY_CONNECT_TIMEOUT", 5)
# --- operators' console and /metrics -------------------------------------------------------
# Who may read /metrics: "off" (404), "open" (anyone), or "staff": a logged-in staff user,
# a request with "Authorization: Bearer <SMQP_METRICS_TOKEN>", or a client address in
# SMQP_METRICS_ALLOW (comma-separated addresses or networks; "loopback" for 127.0.0.0/8, ::1).
SMQP_METRICS = os.environ.get("SMQP_METRICS", "staff").strip().lower()
if SMQP_METRICS not in ("off", "staff", "open"):
    raise ImproperlyConfigured(
        f"SMQP_METRICS must be 'off', 'staff' or 'open', not {SMQP_METRICS!r}")
SMQP_METRICS_TOKEN = os.environ.get("SMQP_METRICS_TOKEN", "")
SMQP_METRICS_ALLOW = os.environ.get("SMQP_METRICS_ALLOW", "")

# --- Selectors and leases (profile §9.2, §9.3) --------------------------------------------
# A selector's text is at most this many characters, and its parse tree at most this deep
# (a chain of AND / OR / + is one level; each parenthesis, NOT or sign adds levels): 567
# beyond either, so that no selector can exhaust the server.
SMQP_SELECTOR_MAX_LENGTH = env_int("SMQP_SELECTOR_MAX_LENGTH", 1024)
SMQP_SELECTOR_MAX_DEPTH = env_int("SMQP_SELECTOR_MAX_DEPTH", 64)
# Selectors read at most this many characters of each header value (README: Selectors).
SMQP_SELECTOR_MAX_VALUE_CHARS = env_int("SMQP_SELECTOR_MAX_VALUE_CHARS", 4096)
# How often leases are ended and subscriptions whose subscribe right was revoked are
# cancelled (each listener's dispatcher, and the Celery beat): the NOTIFY SUBSCRIPTION of a
# lease end comes at most this late (delivery stops at the lease end itself).
SMQP_SUBSCRIPTION_SWEEP_SECONDS = env_int("SMQP_SUBSCRIPTION_SWEEP_SECONDS", 1)
CELERY_BEAT_SCHEDULE["end-subscriptions"] = {
    "task": "broker.end_subscriptions",
    "schedule": SMQP_SUBSCRIPTION_SWEEP_SECONDS,
}

# --- REST API (issue 24, docs: ../shared/design/REST-API.md) ----------------------------------
INSTALLED_APPS += ["drf_spectacular", "drf_spectacular_sidecar", "api"]
REST_FRAMEWORK.update({
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.BearerAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "api.problems.handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.ProblemAutoSchema",
    "UNAUTHENTICATED_USER": None,
})
SPECTACULAR_SETTINGS = {
    "TITLE": "SMQP broker REST API",
    "DESCRIPTION": "Topics, publish, pull/ack, subscriptions and access lists over HTTP; "
                   "the same rules as SMQP. Refusals are RFC 9457 problem details.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The schema and its docs page are public (they describe the API, and hold no data).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
}
# Days a new API token is valid unless its maker says otherwise.
SMQP_API_TOKEN_DAYS = env_int("SMQP_API_TOKEN_DAYS", 90)
# Seconds a process trusts a bearer token it checked (no query per request): a revocation,
# expiry or deactivated account takes effect at once in the process that made the change
# (the REST API's, the admin's), and within this many seconds in any other.
SMQP_API_TOKEN_CACHE_SECONDS = float(os.environ.get("SMQP_API_TOKEN_CACHE_SECONDS", "2"))
# Items per page of a list (by default; a client may ask for up to the maximum).
SMQP_API_PAGE_SIZE = env_int("SMQP_API_PAGE_SIZE", 50)
SMQP_API_PAGE_MAX = env_int("SMQP_API_PAGE_MAX", 1000)
# The most messages one batch publish (POST …/messages with a list) may hold.
SMQP_API_PUBLISH_BATCH_MAX = env_int("SMQP_API_PUBLISH_BATCH_MAX", 1000)
# A pull waits at most this long for a message, whatever its wait_seconds (at most 20).
SMQP_API_PULL_MAX_WAIT = float(os.environ.get("SMQP_API_PULL_MAX_WAIT", "20"))
# A waiting pull wakes when a message is committed for its account (the dispatcher's
# wake-ups); it also looks at the store this often, for what no commit announces (a lock
# that ran out, a lost wake-up).
SMQP_API_PULL_POLL_SECONDS = float(os.environ.get("SMQP_API_PULL_POLL_SECONDS", "2"))
# Daphne's worker threads for HTTP requests (REST, console, /metrics), and apart from them for
# REST pulls, which may long-poll (broker/http.py).
SMQP_API_THREADS = env_int("SMQP_API_THREADS", 8)
SMQP_API_PULL_THREADS = env_int("SMQP_API_PULL_THREADS", 16)
# Hours a publish's Idempotency-Key result is kept (then forgotten by a Celery sweep).
SMQP_API_IDEMPOTENCY_HOURS = env_int("SMQP_API_IDEMPOTENCY_HOURS", 24)
CELERY_BEAT_SCHEDULE["api-purge-idempotency-keys"] = {
    "task": "api.purge_idempotency_keys", "schedule": 3600}

# Federation links (profile §9.5): the longest wait between two attempts to reach a peer
# (the wait doubles from a quarter second), and how often the supervisor re-reads the links.
SMQP_LINK_BACKOFF_MAX = float(os.environ.get("SMQP_LINK_BACKOFF_MAX", "30"))
SMQP_LINK_RELOAD_SECONDS = float(os.environ.get("SMQP_LINK_RELOAD_SECONDS", "2"))
# Messages a federation link may have in flight from its peer (SET NOTIFY WINDOW, profile
# §9.7, up to the peer's Max-Window; a peer without the window sends one at a time). Each
# window's worth that has arrived is stored in one transaction, in order, then ACKed.
SMQP_LINK_WINDOW = max(1, int(os.environ.get("SMQP_LINK_WINDOW", "64")))
# A cluster's one-node jobs (Celery beat, each federation link) run where their lease is
# held (broker/store/leases.py): another node takes one over at most this long after its
# holder died (renewed every third of it).
SMQP_LEASE_SECONDS = float(os.environ.get("SMQP_LEASE_SECONDS", "15"))


# --- Usage reports (issue 25: spark_jobs) ------------------------------------------------------
# The nightly report's schedule is a django-celery-beat PeriodicTask, editable in the admin:
# beat reads its schedule from the database (SMQP_BEAT_SCHEDULER=celery.beat:PersistentScheduler
# keeps Celery's file one, without the nightly report).
INSTALLED_APPS += ["django_celery_beat"]
CELERY_BEAT_SCHEDULER = os.environ.get(
    "SMQP_BEAT_SCHEDULER", "django_celery_beat.schedulers:DatabaseScheduler")
# Where the report job runs: local[*] (this machine's cores) or a cluster, e.g.
# spark://host:7077; the driver's memory (e.g. "4g"; empty: Spark's default).
SPARK_MASTER = os.environ.get("SPARK_MASTER", "local[*]")
SPARK_DRIVER_MEMORY = os.environ.get("SPARK_DRIVER_MEMORY", "")
# Options for the job's JVMs (driver and executors), e.g. "-XX:TieredStopAtLevel=1": only the
# quick compiler, less CPU for a short job's JIT work (the tests' setting); empty: the JVM's.
SPARK_JAVA_OPTIONS = os.environ.get("SPARK_JAVA_OPTIONS", "").strip()
# A day's events are exported here (Parquet) while its report runs, then removed.
SMQP_REPORTS_DIR = os.environ.get("SMQP_REPORTS_DIR", str(VAR_DIR / "reports"))
# Raw usage events are deleted this many days after their day, once that day is reported.
SMQP_USAGE_RETENTION_DAYS = env_int("SMQP_USAGE_RETENTION_DAYS", 30)
# A running report tells the database it is alive every tenth of this; one silent for this
# long (its process was killed, its machine lost) is taken over by the next trigger.
SMQP_REPORT_STALE_SECONDS = env_int("SMQP_REPORT_STALE_SECONDS", 600)

# XMPP over WebSocket (XMPP-PROFILE.md): the server's domain (the pubsub service is
# pubsub.<domain>), the largest frame taken, and where SASL PLAIN is offered besides wss://
# ("loopback": from this machine only, as SMQP_CLEAR_ON_PLAIN; "yes"; "no").
SMQP_XMPP_DOMAIN = os.environ.get("SMQP_XMPP_DOMAIN", "localhost")
SMQP_XMPP_MAX_FRAME = env_int("SMQP_XMPP_MAX_FRAME", 256 * 1024)
SMQP_XMPP_PLAIN = os.environ.get("SMQP_XMPP_PLAIN", "loopback").strip().lower()
