"""Liveness and readiness for load balancers and orchestrators (plain Django: no auth, no DRF)."""

import logging
import os
import time

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from kombu import Connection

from portal.core.errors import problem_response
from portal.core.readiness import readiness_warnings
from portal.core.tasks import HEARTBEAT_KEY

log = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_broker() -> None:
    timeout = settings.READYZ_TIMEOUT_S
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    with Connection(settings.CELERY_BROKER_URL, transport_options=options, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        if conn.transport_cls == "filesystem":
            folder = options["data_folder_in"]
            if not os.access(folder, os.W_OK):
                raise OSError(f"embedded broker folder {folder} is not writable")


def _heartbeat_age_s() -> float | None:
    """Seconds since a worker last ran the beat's heartbeat; None when unknown. Informational:
    a site may run the web tier before its workers."""
    try:
        beat = cache.get(HEARTBEAT_KEY)
    except Exception:  # the cache may live on the very Redis that is down
        return None
    return round(time.time() - beat, 1) if beat else None


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer; 503 naming each part that failed. `warnings`
    names parts that work but not as they should (a local cluster without a job sandbox)."""
    checks: dict[str, str] = {}
    for name, check in (("database", _check_database), ("broker", _check_broker)):
        try:
            check()
            checks[name] = "ok"
        except Exception as exc:  # any failure of a dependency means "not ready", whatever its type
            log.warning("readyz: %s failed: %s", name, exc.__class__.__name__)
            checks[name] = f"failed: {exc.__class__.__name__}"
    extra = {"checks": checks, "worker_heartbeat_age_s": _heartbeat_age_s()}
    if checks["database"] == "ok":  # the providers read the database
        extra["warnings"] = readiness_warnings()
    failed = [name for name, result in checks.items() if result != "ok"]
    if failed:
        return problem_response(503, "unavailable", f"Not ready: {', '.join(failed)} unreachable.", **extra)
    return JsonResponse({"status": "ok", **extra})
