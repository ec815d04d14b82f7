"""The Django core: paths, secrets, hosts and cookies, apps and middleware, templates, the
database, passwords and the login lockout, languages and static files."""

import contextlib
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from portal.envvars import env_bool, env_choice, env_int, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent
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
    "billing",
    "jobs",
    "reports",
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
