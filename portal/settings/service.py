"""What the portal answers with: mail, the REST API and its schema, overload, health, logging."""

from portal.envvars import email_config, env_choice, env_int, env_secret, env_str
from portal.settings.base import DEBUG

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
        "ShareKindEnum": "clusters.shares.ShareKind",
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
        # WeasyPrint logs each step of each PDF (reports/pdf.py) at INFO; its warnings matter.
        "weasyprint": {"level": "WARNING"},
        "fontTools": {"level": "WARNING"},
        "django.db.backends": {"level": "INFO"},
    },
}
