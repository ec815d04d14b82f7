"""Redis (or the embedded broker), Celery, and beat's schedule of periodic tasks
(docs/periodic-tasks.md)."""

from datetime import timedelta

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from portal.envvars import env_int, env_secret
from portal.settings.base import TIME_ZONE, VAR_DIR
from portal.settings.billing import BUDGET_CHECK_INTERVAL_S, STATEMENT_HOUR
from portal.settings.identity import DIRECTORY_SYNC_INTERVAL_S
from portal.settings.jobs import GPU_SAMPLE_INTERVAL_S, JOB_POLL_INTERVAL_S, WEBHOOK_SCAN_INTERVAL_S

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
# Beat's crontab entries (make-statements) keep the site's clock (TIME_ZONE), not UTC.
CELERY_TIMEZONE = TIME_ZONE
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
    "check-budgets": {
        "task": "jobs.tasks.check_budgets",
        "schedule": float(BUDGET_CHECK_INTERVAL_S),
        "options": {"expires": BUDGET_CHECK_INTERVAL_S - 5},
    },
    "scan-events": {
        "task": "webhooks.tasks.scan_events",
        "schedule": float(WEBHOOK_SCAN_INTERVAL_S),
        "options": {"expires": max(1, WEBHOOK_SCAN_INTERVAL_S - 1)},
    },
    # Last month's statements: made on the 1st (site time). It runs every day, so that a 1st
    # on which beat or the workers were down, or a tenant's statement failed, is made up the
    # next day; a run that finds them made (and mailed) does nothing.
    "make-statements": {
        "task": "reports.tasks.statements_make_due",
        "schedule": crontab(minute=0, hour=STATEMENT_HOUR),
        "options": {"expires": 3000},
    },
}
