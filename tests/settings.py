"""Settings for the test suite: the real ones, pointed at the test services.

PostgreSQL on 127.0.0.1:5432 and Redis (database 15) by default; TEST_DATABASE=sqlite runs the
suite on SQLite instead. Only speed knobs are overridden here, never what a test checks."""

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("VAR_DIR", str(_ROOT / "var" / "test"))
if os.environ.get("TEST_DATABASE", "postgresql") == "sqlite":
    os.environ["DATABASE_URL"] = f"sqlite:///{_ROOT / 'var' / 'test' / 'portal.sqlite3'}"
else:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("EMAIL_URL", "locmem://")

from portal.settings import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed: hashing is not under test
# The cache (throttle counters) on the Redis database below the broker's (14 beside the default
# 15), so that a test can clear it without touching the broker's keys, nor another run's cache.
_redis_base, _broker_db = REDIS_URL.rsplit("/", 1)  # noqa: F405
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": f"{_redis_base}/{int(_broker_db) - 1}",
    }
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # A file, not pytest-django's in-memory default, so that a Celery worker process can share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-portal.sqlite3")}  # noqa: F405
STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405  (whitenoise warns about a missing folder)
# The event streams of pages under the test's live server (WSGI: a thread a stream) end soon, so
# that none outlives its test for long; the browser reconnects by itself.
EVENTS_STREAM_MAX_S = 10
