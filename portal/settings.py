"""Settings, every one from the environment with a safe default (README: the table of settings)."""

import contextlib
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from portal.envvars import email_config, env_bool, env_choice, env_int, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _generated_once(path: Path, make) -> str:
    """The text of `path`, which the first process to get here writes whole. Processes that start
    together (web workers, celery, beat) race here: each writes its own text to a private
    temporary file and links it into place; os.link fails when the name exists, so exactly one
    text wins, whole, and every process reads that one."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(make())
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # another process won: its text is the one
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text().strip()


def _secret_key() -> str:
    """SECRET_KEY from the environment, or one generated once into var/ and kept there."""
    key = env_secret("SECRET_KEY")
    if key:
        if len(key) < 32:
            raise ImproperlyConfigured("SECRET_KEY is shorter than 32 characters")
        return key
    return _generated_once(VAR_DIR / "secret_key", lambda: secrets.token_urlsafe(50))


SECRET_KEY = _secret_key()


def _field_encryption_keys() -> list[str]:
    """FIELD_ENCRYPTION_KEY (or _FILE): Fernet keys separated by commas or spaces, the first
    encrypts and all decrypt (portal/core/fields.py); else one generated once into var/."""
    text = env_secret("FIELD_ENCRYPTION_KEY")
    if text is None:
        text = _generated_once(VAR_DIR / "field_encryption_key", lambda: Fernet.generate_key().decode())
    keys = text.replace(",", " ").split()
    for number, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except ValueError:
            raise ImproperlyConfigured(
                f"FIELD_ENCRYPTION_KEY: key {number} is not a Fernet key (32 bytes in urlsafe base64; "
                "make one with `python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`)"
            ) from None
    if not keys:
        raise ImproperlyConfigured("FIELD_ENCRYPTION_KEY names no key")
    return keys


# Encrypts cluster secrets at rest; kept out of the database (docs: staff roles and secrets).
FIELD_ENCRYPTION_KEY = _field_encryption_keys()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000")
SECURE_COOKIES = env_bool("SECURE_COOKIES", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY", False) else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "guardian",
    "axes",
    "portal.core",
    "clusters",
    "tenants",
    "jobs",
    "monitoring",
    "identity",
    "webhooks",
]

MIDDLEWARE = [
    # First of all: every request is counted, those refused by the middleware below included.
    "monitoring.middleware.count_requests",
    # Then: a request that waited too long for a worker is refused before it costs anything.
    "portal.core.overload.shed_when_queued_too_long",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "portal.core.middleware.refuse_impossible_input",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A provider's sign-in older than OIDC_RENEW_SECONDS is checked with the provider again.
    "identity.oidc.SessionRefresh",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "tenants.middleware.tenant_perms_per_request",
    # Last: it turns a login that axes refused into the lockout answer (portal.core.lockout).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

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

# --- Database: SQLite under var/ unless DATABASE_URL names another.
DATABASE_URL = env_secret("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'portal.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60))}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is malformed: {exc}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web server read while the worker writes; busy timeout waits out a writer.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Server-side binding lets psycopg prepare a statement PostgreSQL has seen
    # DB_PREPARE_THRESHOLD times and skip its planning from then on (docs/performance.md).
    # Behind PgBouncer in transaction mode (before 1.21's max_prepared_statements), set
    # DB_PREPARE_THRESHOLD=0: no prepared statements. A migration that changes a column's type
    # fails the statements prepared before it ("cached plan must not change result type") until
    # the connection is closed: restart web and workers after it (README, Upgrading on PostgreSQL).
    _prepare_threshold = env_int("DB_PREPARE_THRESHOLD", 2, minimum=0)
    if _prepare_threshold > 0:  # beside the URL's own options (?sslmode=…, ?connect_timeout=…)
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=True, prepare_threshold=_prepare_threshold
        )
    # A pool of at most DB_POOL_MAX connections per process (psycopg_pool, through Django), in
    # place of one persistent connection per thread: the ASGI server's (portal/asgi.py turns it
    # on), where every request runs in a thread of its own, so that a burst of clients waits for
    # a connection instead of exhausting PostgreSQL's max_connections. 0: no pool.
    _pool_max = env_int("DB_POOL_MAX", 0, minimum=0)
    if _pool_max:
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": _pool_max,
            "timeout": 30,
        }
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool wants no persistent connections
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "portal.core.lockout.LockoutBackend",  # first: a locked username or address tries no password
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row; anonymous callers get nothing
# --- Login lockout (portal/core/lockout.py; docs/architecture/web-hardening.md): failures
# within the cool-off, per username and address, per username, per address.
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_ACCOUNT_FAILURE_LIMIT = env_int("LOGIN_ACCOUNT_FAILURE_LIMIT", 50, minimum=1)
LOGIN_ADDRESS_FAILURE_LIMIT = env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 100, minimum=1)
LOGIN_COOLOFF_MINUTES = env_int("LOGIN_COOLOFF_MINUTES", 15, minimum=1)
AXES_HANDLER = "portal.core.lockout.LockoutHandler"
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_COOLOFF_TIME = timedelta(minutes=LOGIN_COOLOFF_MINUTES)
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # a lock ends when its cool-off does
AXES_CLIENT_IP_CALLABLE = "portal.core.throttles.client_ip"  # the throttles' address (NUM_PROXIES)
AXES_LOCKOUT_CALLABLE = "portal.core.lockout.lockout_response"
AXES_DISABLE_ACCESS_LOG = True  # no row per successful login: the table would only grow
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False  # no "AXES: BEGIN" line at every start of every process
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# The login page's username and password form (the portal's own accounts, and LDAP's). Off, the
# page offers only the identity provider; the console's login and POST /auth/token/ refuse too.
LOCAL_LOGIN = env_bool("LOCAL_LOGIN", True)

# --- Institutional identity (identity/; README: "Sign-in with the institution's identity")
# OpenID Connect, on when OIDC_ISSUER is set: mozilla-django-oidc as the relying party, endpoints
# from the issuer's discovery document (read once per process, identity/oidc.py).
OIDC_ISSUER = env_str("OIDC_ISSUER", "").rstrip("/")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_secret("OIDC_CLIENT_SECRET") or ""
# offline_access: a refresh token that outlives the provider's session, for the sync (identity/oidc.py).
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile groups offline_access")
# `consent` for providers that issue offline_access only when asked with prompt=consent (the
# spec's rule, e.g. node's oidc-provider); Keycloak and Entra ID do not need it.
OIDC_PROMPT = env_choice("OIDC_PROMPT", "", {"", "consent", "login", "select_account"})
OIDC_RP_SIGN_ALGO = env_choice("OIDC_SIGN_ALGO", "RS256", {"RS256", "RS384", "RS512", "ES256", "ES384"})
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_CLUSTER_USERNAME_CLAIM = env_str("OIDC_CLUSTER_USERNAME_CLAIM", "uid")
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of RP-initiated logout
OIDC_TIMEOUT = env_int("OIDC_TIMEOUT_S", 10, minimum=1, maximum=60)
# How long a sign-in stands before the provider is asked again (prompt=none): a user the provider
# has signed out or disabled loses the portal's session then (mozilla-django-oidc's SessionRefresh).
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("OIDC_RENEW_SECONDS", 900, minimum=30)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
# How often every user who signed in through LDAP or the provider is asked about again (groups
# followed; a user gone from the directory loses sessions and tokens): identity/tasks.py.
DIRECTORY_SYNC_INTERVAL_S = env_int("DIRECTORY_SYNC_INTERVAL_S", 900, minimum=60)
# Lazy: read from the discovery document when first used, never while OIDC is off.
from identity.discovery import endpoint  # noqa: E402  (imports only requests and Django's utils)

OIDC_OP_AUTHORIZATION_ENDPOINT = endpoint("authorization_endpoint")
OIDC_OP_TOKEN_ENDPOINT = endpoint("token_endpoint")
OIDC_OP_USER_ENDPOINT = endpoint("userinfo_endpoint")
OIDC_OP_JWKS_ENDPOINT = endpoint("jwks_uri")
if OIDC_ISSUER and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ImproperlyConfigured(
        "OIDC_ISSUER is set: OIDC_CLIENT_ID and OIDC_CLIENT_SECRET (or _FILE) are needed"
    )
# LDAP, on when LDAP_SERVER_URI is set: django-auth-ldap (the `ldap` extra), over StartTLS or
# ldaps:// with the site's CA (identity/ldap.py reads the rest of LDAP_*).
LDAP_SERVER_URI = env_str("LDAP_SERVER_URI", "")
if LDAP_SERVER_URI:
    from identity.ldap_settings import ldap_settings

    globals().update(ldap_settings())
# After the portal's own accounts: a directory's user never takes over a local account of the
# same name (identity/ldap.py and identity/oidc.py refuse it).
if not LOCAL_LOGIN:  # the portal's passwords refused; permissions still read by ModelBackend's rules
    AUTHENTICATION_BACKENDS[1] = "identity.backends.PermissionsOnlyBackend"
AUTHENTICATION_BACKENDS[2:2] = [
    *(["identity.ldap.LdapBackend"] if LDAP_SERVER_URI else []),
    *(["identity.oidc.OidcBackend"] if OIDC_ISSUER else []),
]

# The pages follow each browser's choice; mail goes out in this one (MAIL_LANGUAGE: en or zh-hans).
LANGUAGE_CODE = "en"
MAIL_LANGUAGE = env_choice("MAIL_LANGUAGE", "en", {"en", "zh-hans"})
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Jobs
JOB_MAX_WALLTIME_MINUTES = env_int("JOB_MAX_WALLTIME_MINUTES", 72 * 60, minimum=1)
JOB_POLL_INTERVAL_S = env_int("JOB_POLL_INTERVAL_S", 10, minimum=2, maximum=300)
JOB_DISPATCH_TIME_LIMIT_S = 150  # jobs.tasks.dispatch_job's hard limit
# A lease that ends before its dispatcher can is a second sbatch: the lease must outlast it.
JOB_DISPATCH_LEASE_S = env_int("JOB_DISPATCH_LEASE_S", 180, minimum=JOB_DISPATCH_TIME_LIMIT_S + 1)
JOB_LOST_GRACE_S = env_int("JOB_LOST_GRACE_S", 300, minimum=30)
FAIR_SHARE_HALF_LIFE_DAYS = env_int("FAIR_SHARE_HALF_LIFE_DAYS", 7, minimum=1)
LOCAL_CLUSTER_GPUS = env_int("LOCAL_CLUSTER_GPUS", 4, minimum=0, maximum=64)
# The local cluster reads its GPUs' utilization (idle GPUs) with this nvidia-smi.
LOCAL_NVIDIA_SMI = env_str("LOCAL_NVIDIA_SMI", "nvidia-smi")
# The local cluster's job sandbox (docs/architecture/local-sandbox.md): bubblewrap, the
# host's network or none, the uids of tenants when the portal runs as root, more read-only
# paths. Where no sandbox can be made the cluster serves one tenant only: LOCAL_CLUSTER_TENANT
# names it (it also restricts a sandboxed cluster to that tenant).
LOCAL_SANDBOX_BWRAP = env_str("LOCAL_SANDBOX_BWRAP", "/usr/bin/bwrap")
LOCAL_SANDBOX_NETWORK = env_bool("LOCAL_SANDBOX_NETWORK", False)
LOCAL_SANDBOX_UID_BASE = env_int("LOCAL_SANDBOX_UID_BASE", 1_900_000_000, minimum=1000, maximum=4_000_000_000)
LOCAL_SANDBOX_UID_COUNT = env_int("LOCAL_SANDBOX_UID_COUNT", 100_000, minimum=1, maximum=10_000_000)
LOCAL_SANDBOX_RO_PATHS = env_list("LOCAL_SANDBOX_RO_PATHS", [])
LOCAL_CLUSTER_TENANT = env_str("LOCAL_CLUSTER_TENANT", "")
JOB_LOG_MAX_BYTES = env_int("JOB_LOG_MAX_BYTES", 1_000_000, minimum=1000)
# Webhooks (webhooks/; docs/architecture.md, Webhooks): how often new events are scanned into
# deliveries, how long a failing delivery is retried, and how long an endpoint may fail before it
# is disabled. EVENTS_GAP_WAIT_S: how long a reader of new rows by id (the scan, the event
# stream) waits for an id it passed over because its row was not committed yet.
WEBHOOK_SCAN_INTERVAL_S = env_int("WEBHOOK_SCAN_INTERVAL_S", 5, minimum=1)
WEBHOOK_RETRY_FOR_S = env_int("WEBHOOK_RETRY_FOR_S", 86_400, minimum=60)
WEBHOOK_DISABLE_AFTER_S = env_int("WEBHOOK_DISABLE_AFTER_S", 86_400, minimum=60)
EVENTS_GAP_WAIT_S = env_int("EVENTS_GAP_WAIT_S", 30, minimum=1)
# Networks that deliveries may reach beside public addresses (CIDRs), with the console's
# "allowed webhook networks"; none by default (webhooks/outbound.py).
WEBHOOK_ALLOWED_RANGES = env_list("WEBHOOK_ALLOWED_RANGES", [])
# The event streams (jobs/stream.py; docs/architecture.md, Live events): how often new job events
# and a followed log are read, a keep-alive after this much silence, how long one stream lasts
# before the client reconnects (and its scope is checked again), how many missed events a
# reconnect replays, and how many streams one user may hold per ASGI process.
EVENTS_POLL_S = env_int("EVENTS_POLL_MS", 500, minimum=50) / 1000
EVENTS_LOG_POLL_S = env_int("EVENTS_LOG_POLL_MS", 2000, minimum=200) / 1000
EVENTS_HEARTBEAT_S = env_int("EVENTS_HEARTBEAT_S", 15, minimum=1)
EVENTS_STREAM_MAX_S = env_int("EVENTS_STREAM_MAX_S", 300, minimum=5)
EVENTS_BACKLOG = env_int("EVENTS_BACKLOG", 1000, minimum=10)
EVENTS_MAX_STREAMS_PER_USER = env_int("EVENTS_MAX_STREAMS_PER_USER", 20, minimum=1)

# --- One slow cluster stalls no other (clusters/breaker.py, docs/architecture/cluster-stall.md):
# after this many consecutive failures to reach a cluster, dispatch and poll skip it for a
# cool-off that doubles with each failed probe up to the cap; and at most this many dispatches
# and polls of one cluster hold a worker at once.
CLUSTER_BREAKER_FAILURES = env_int("CLUSTER_BREAKER_FAILURES", 3, minimum=1)
CLUSTER_BREAKER_COOLOFF_S = env_int("CLUSTER_BREAKER_COOLOFF_S", 30, minimum=1)
CLUSTER_BREAKER_COOLOFF_MAX_S = env_int(
    "CLUSTER_BREAKER_COOLOFF_MAX_S", 300, minimum=CLUSTER_BREAKER_COOLOFF_S
)
CLUSTER_WORKER_SLOTS = env_int("CLUSTER_WORKER_SLOTS", 2, minimum=1)

# --- Cleanup (docs/periodic-tasks.md): each is a service with a beat task that audits what it
# does; with CLEANUP_DRY_RUN every one of them reports what it would do and changes nothing.
CLEANUP_DRY_RUN = env_bool("CLEANUP_DRY_RUN", False)
# A job RUNNING longer than this is cancelled (reason walltime_cap), whatever it asked for.
JOB_WALLTIME_CAP_HOURS = env_int("JOB_WALLTIME_CAP_HOURS", 72, minimum=1)
# When a grant ends its waiting jobs are refused; its running jobs finish unless this is set.
GRANT_END_CANCEL_RUNNING = env_bool("GRANT_END_CANCEL_RUNNING", False)
# A suspended tenant gets no new work; its running jobs finish unless this is set.
SUSPENDED_CANCEL_RUNNING = env_bool("SUSPENDED_CANCEL_RUNNING", False)
# Files under a tenant's scratch directory older than this are deleted.
SCRATCH_PURGE_DAYS = env_int("SCRATCH_PURGE_DAYS", 30, minimum=1)
# Scheduler jobs carrying a portal token the portal does not know: reported, and cancelled if set.
ORPHAN_CANCEL = env_bool("ORPHAN_CANCEL", False)
# Finished jobs' events (all but the first and last) and the files the portal keeps of them.
JOB_EVENT_RETENTION_DAYS = env_int("JOB_EVENT_RETENTION_DAYS", 365, minimum=1)
JOB_LOG_RETENTION_DAYS = env_int("JOB_LOG_RETENTION_DAYS", 90, minimum=1)
# A job whose GPUs all stayed below the threshold for the window is flagged to its owner by mail,
# and cancelled (reason idle_gpus) after a second window when IDLE_GPU_CANCEL is set.
IDLE_GPU_THRESHOLD_PCT = env_int("IDLE_GPU_THRESHOLD_PCT", 5, minimum=0, maximum=100)
IDLE_GPU_WINDOW_MINUTES = env_int("IDLE_GPU_WINDOW_MINUTES", 120, minimum=1)
IDLE_GPU_CANCEL = env_bool("IDLE_GPU_CANCEL", False)
# GPU telemetry per job (jobs/services/telemetry.py): RUNNING jobs' GPUs read this often, and the
# readings kept this many days for the job page's charts and the API.
GPU_SAMPLE_INTERVAL_S = env_int("GPU_SAMPLE_INTERVAL_S", 60, minimum=10)
GPU_SAMPLE_KEEP_DAYS = env_int("GPU_SAMPLE_KEEP_DAYS", 30, minimum=1)

# --- Monitoring (monitoring/; README, Monitoring). /metrics answers only with
# `Authorization: Bearer <METRICS_TOKEN>`, and 404 while none is set. The processes share their
# counts through PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads from the environment.
METRICS_TOKEN = env_secret("METRICS_TOKEN")
# Read here so that it is checked and listed; prometheus_client reads the environment itself.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
# POST /hooks/alertmanager answers only with `Authorization: Bearer <ALERTMANAGER_TOKEN>` (404
# while none is set). A notification is tried ALERT_DELIVERY_ATTEMPTS times, waiting 30 s,
# then twice as long each time, up to ALERT_DELIVERY_RETRY_MAX_S. A tenant's robots and webhooks
# post to public https addresses only; ALERT_WEBHOOK_ALLOW_LOOPBACK lets them post to this
# machine over http (development and tests, never production).
ALERTMANAGER_TOKEN = env_secret("ALERTMANAGER_TOKEN")
ALERT_DELIVERY_ATTEMPTS = env_int("ALERT_DELIVERY_ATTEMPTS", 5, minimum=1, maximum=20)
ALERT_DELIVERY_RETRY_MAX_S = env_int("ALERT_DELIVERY_RETRY_MAX_S", 3600, minimum=1)
ALERT_WEBHOOK_ALLOW_LOOPBACK = env_bool("ALERT_WEBHOOK_ALLOW_LOOPBACK", False)

# --- Redis, or the embedded mode: with REDIS_URL unset the broker is kombu's filesystem
# transport under var/, so a real, separate Celery worker runs with no server to install.
REDIS_URL = env_secret("REDIS_URL")
EMBEDDED_BROKER_DIR = VAR_DIR / "celery"

if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# --- Celery (portal/celery.py reads every CELERY_* name below).
BROKER_VISIBILITY_TIMEOUT_S = env_int("BROKER_VISIBILITY_TIMEOUT_S", 3600, minimum=60)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT_S", 300, minimum=2)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT_S", 240, minimum=1)
if not CELERY_TASK_SOFT_TIME_LIMIT < CELERY_TASK_TIME_LIMIT < BROKER_VISIBILITY_TIMEOUT_S:
    # A task still running when the broker's visibility timeout ends is handed to a second
    # worker while the first goes on: the soft limit must fire first, then the hard one.
    raise ImproperlyConfigured(
        "CELERY_TASK_SOFT_TIME_LIMIT_S < CELERY_TASK_TIME_LIMIT_S < BROKER_VISIBILITY_TIMEOUT_S must hold; "
        f"got {CELERY_TASK_SOFT_TIME_LIMIT}, {CELERY_TASK_TIME_LIMIT}, {BROKER_VISIBILITY_TIMEOUT_S}"
    )
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": BROKER_VISIBILITY_TIMEOUT_S}
else:
    CELERY_BROKER_URL = "filesystem://"
    CELERY_RESULT_BACKEND = f"file://{EMBEDDED_BROKER_DIR / 'results'}"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": BROKER_VISIBILITY_TIMEOUT_S,
        "data_folder_in": str(EMBEDDED_BROKER_DIR / "queue"),
        "data_folder_out": str(EMBEDDED_BROKER_DIR / "queue"),
        "processed_folder": str(EMBEDDED_BROKER_DIR / "processed"),
        "store_processed": False,
    }
    for sub in ("queue", "processed", "results"):
        (EMBEDDED_BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
CELERY_RESULT_EXPIRES = timedelta(hours=1)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup closes the database connection before and after every task unless this
# is set: a new PostgreSQL connection per task cost more than a dispatch (bench/dispatch.py).
# portal/celery.py closes stale and broken connections around tasks instead, by CONN_MAX_AGE.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "heartbeat": {"task": "portal.core.tasks.heartbeat", "schedule": 30.0, "options": {"expires": 25}},
    "expire-quota-requests": {
        "task": "tenants.tasks.expire_quota_requests",
        "schedule": 3600.0,
        "options": {"expires": 3000},
    },
    "poll-clusters": {
        "task": "jobs.tasks.poll_clusters",
        "schedule": float(JOB_POLL_INTERVAL_S),
        "options": {"expires": JOB_POLL_INTERVAL_S - 1},
    },
    "sync-clusters": {"task": "clusters.tasks.sync_clusters", "schedule": 60.0, "options": {"expires": 55}},
    "sweep-jobs": {"task": "jobs.tasks.sweep_jobs", "schedule": 60.0, "options": {"expires": 55}},
    "apply-tenants": {
        "task": "tenants.tasks.apply_tenants",
        "schedule": 3600.0,
        "options": {"expires": 3000},
    },
    "remind-grants-ending": {
        "task": "tenants.tasks.remind_grants_ending",
        "schedule": 3600.0,
        "options": {"expires": 3000},
    },
    # Cleanup (docs/periodic-tasks.md).
    "cap-walltime": {"task": "jobs.tasks.cap_walltime", "schedule": 300.0, "options": {"expires": 280}},
    "end-grants": {"task": "jobs.tasks.end_grants", "schedule": 600.0, "options": {"expires": 580}},
    "hold-suspended-tenants": {
        "task": "jobs.tasks.hold_suspended_tenants",
        "schedule": 600.0,
        "options": {"expires": 580},
    },
    "purge-scratch": {"task": "jobs.tasks.purge_scratch", "schedule": 86400.0, "options": {"expires": 80000}},
    "find-orphans": {"task": "jobs.tasks.find_orphans", "schedule": 900.0, "options": {"expires": 880}},
    "apply-retention": {
        "task": "jobs.tasks.apply_retention",
        "schedule": 86400.0,
        "options": {"expires": 80000},
    },
    "watch-idle-gpus": {"task": "jobs.tasks.watch_idle_gpus", "schedule": 600.0, "options": {"expires": 580}},
    "sync-directory": {
        "task": "identity.tasks.sync_directory",
        "schedule": float(DIRECTORY_SYNC_INTERVAL_S),
        "options": {"expires": DIRECTORY_SYNC_INTERVAL_S - 5},
    },
    "sample-gpus": {
        "task": "jobs.tasks.sample_gpus",
        "schedule": float(GPU_SAMPLE_INTERVAL_S),
        "options": {"expires": GPU_SAMPLE_INTERVAL_S - 5},
    },
    "scan-events": {
        "task": "webhooks.tasks.scan_events",
        "schedule": float(WEBHOOK_SCAN_INTERVAL_S),
        "options": {"expires": max(1, WEBHOOK_SCAN_INTERVAL_S - 1)},
    },
}

# --- Mail
EMAIL_URL = env_secret("EMAIL_URL") or "console://"
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10, minimum=1)
DEFAULT_FROM_EMAIL = "GPU portal <portal@localhost>"
globals().update(email_config(EMAIL_URL))  # ?from= in the URL replaces the sender above
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# --- REST API (docs/api.md, conventions)
API_PAGE_SIZE = env_int("API_PAGE_SIZE", 50, minimum=1, maximum=200)
# Personal API tokens (docs/api.md, Tokens): the expiry a new one gets unless it asks for another,
# and the longest any may have; tokens made before expiries existed end after the maximum.
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365, minimum=1, maximum=3650)
API_TOKEN_DAYS = env_int("API_TOKEN_DAYS", min(90, API_TOKEN_MAX_DAYS), minimum=1, maximum=API_TOKEN_MAX_DAYS)
API_THROTTLE_RATES = {
    "user": env_str("API_THROTTLE_USER", "1200/min"),
    "anon": env_str("API_THROTTLE_ANON", "60/min"),
    "token": env_str("API_THROTTLE_TOKEN", "20/min"),
    "conditional": env_str("API_THROTTLE_CONDITIONAL", "6000/min"),
    # Usernames a tenant's manager may try that name no user, per hour (API and team page): adding
    # a member tells whether a username exists, so guessing them is bounded (docs: web-hardening).
    "member_lookup": env_str("API_THROTTLE_MEMBER_LOOKUP", "20/hour"),
    # Password reset mails asked for, per client address and per address typed (the page's answer
    # is the same for an address with an account and one without; so is its count).
    "reset_address": env_str("PASSWORD_RESET_THROTTLE_ADDRESS", "10/hour"),
    "reset_account": env_str("PASSWORD_RESET_THROTTLE_ACCOUNT", "3/hour"),
}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.core.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.core.pagination.CursorPage",
    "PAGE_SIZE": API_PAGE_SIZE,
    "DEFAULT_THROTTLE_CLASSES": ["portal.core.throttles.UserThrottle", "portal.core.throttles.AnonThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["portal.core.renderers.JSONRenderer"],  # orjson, DRF's bytes
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "portal.core.renderers.JsonNegotiation",
    "DEFAULT_SCHEMA_CLASS": "portal.core.schema.ProblemAutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "portal.core.errors.problem_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    # How many proxies in front of the portal set X-Forwarded-For. 0 trusts none: the throttles
    # key on the connection's own address, so a client cannot pick a fresh one per request.
    "NUM_PROXIES": env_int("NUM_PROXIES", 0, minimum=0, maximum=5),
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append("rest_framework.renderers.BrowsableAPIRenderer")
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU self-service portal API",
    "DESCRIPTION": "Quota by workload scenario, jobs on Slurm and Kubernetes. Contract: docs/api.md.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # docs/api.md: no auth → 401, the schema and its docs page included (a token or a session reads them).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The PATCH bodies are their own serializers, parsed whole, so what they require is required:
    # no separate all-optional "Patched" component.
    "COMPONENT_SPLIT_PATCH": False,
    "ENUM_NAME_OVERRIDES": {
        "ProblemCodeEnum": "portal.core.errors.PROBLEM_CODES",
        "TenantStateEnum": "tenants.models.TenantState",
        "QuotaRequestStateEnum": "tenants.models.RequestState",
        "JobStateEnum": "jobs.models.JobState",
        "AlertSeverityEnum": "monitoring.models.Severity",
        "AlertStatusEnum": "monitoring.models.AlertStatus",
        "DeliveryStatusEnum": "monitoring.models.DeliveryStatus",
        "ChannelKindEnum": "monitoring.models.ChannelKind",
        "DeliveryKindEnum": "monitoring.models.DeliveryKind",
        "AlertScopeEnum": "monitoring.models.AlertScope",
        "TokenScopeEnum": "portal.core.models.TokenScope",
        "DirectorySourceEnum": "identity.models.Source",
    },
}

# --- Overload (portal.core.overload): a request that waited longer than this for a worker,
# by the reverse proxy's X-Request-Start stamp, is answered 503 with Retry-After. 0: never.
SHED_QUEUED_AFTER_MS = env_int("SHED_QUEUED_AFTER_MS", 500, minimum=0, maximum=60_000)

# --- Health
READYZ_TIMEOUT_S = env_int("READYZ_TIMEOUT_S", 2, minimum=1, maximum=30)

# --- Logging: JSON lines to stderr, and to LOG_FILE when set.
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
LOG_FILE = env_str("LOG_FILE", "")
_handlers = ["stderr"] + (["file"] if LOG_FILE else [])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            "timestamp": False,
        }
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "json"},
        **(
            {
                "file": {
                    "class": "logging.handlers.WatchedFileHandler",
                    "filename": LOG_FILE,
                    "formatter": "json",
                }
            }
            if LOG_FILE
            else {}
        ),
    },
    "root": {"handlers": _handlers, "level": LOG_LEVEL},
    "loggers": {
        # Paramiko logs key exchange details at DEBUG; keep it quiet unless asked.
        "paramiko": {"level": "WARNING"},
        "django.db.backends": {"level": "INFO"},
    },
}
