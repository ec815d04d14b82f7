"""Graceful overload: a request that waited too long for a worker is refused at once, before it
costs anything (docs/architecture.md, production topology; docs/performance.md, overload).

In production a reverse proxy (nginx: deploy/nginx/portal.conf) stamps each request with the
time it arrived, `X-Request-Start: t=<seconds since the epoch>`, before the request waits for a
free gunicorn worker. When a worker takes it up, this middleware, the first of all, reads how
long it waited. Past SHED_QUEUED_AFTER_MS the request is answered 503 `unavailable` with
`Retry-After` (problem+json for the API, a short page for the rest), without a session, a
token lookup or a query: so that under twice the load the portal can answer, the requests it
does answer keep their latency, the queue drains at the speed of these refusals (a fraction of a
millisecond each) instead of growing without bound, and a client knows to come back. A refused
request did nothing, so nothing it sent is lost: a submission is retried with the same
Idempotency-Key.

Only a proxy sets the header (it overwrites any that a client sent). A request that reaches
gunicorn directly without one is never refused; a client that sends one itself can at most
have its own request refused, or served as it would be without the header.
"""

import logging
import time

from django.conf import settings
from django.http import HttpResponse

from portal.core.errors import problem_response

# Answered whatever the load: the probes that tell an orchestrator the process is alive.
NEVER_SHED = ("/healthz",)
RETRY_AFTER_S = 1
LOG_EVERY_S = 1.0  # one warning a second at most, with the count: overload means thousands

log = logging.getLogger(__name__)
_refused = {"since_log": 0, "logged_at": 0.0}  # per process; a sync worker has one thread


def queued_s(meta: dict, now: float) -> float | None:
    """How long the request waited since the proxy stamped it; None without a usable stamp.
    `t=1733140800.123` (nginx's $msec, seconds) or a bare number of seconds."""
    raw = meta.get("HTTP_X_REQUEST_START", "")
    if not raw:
        return None
    try:
        started = float(raw.removeprefix("t="))
    except ValueError:
        return None
    if started != started or started <= 0:  # NaN, or no time at all
        return None
    return max(0.0, now - started)


def shed_when_queued_too_long(get_response):
    """Refuse (503, Retry-After) a request that waited longer than SHED_QUEUED_AFTER_MS."""

    def middleware(request):
        bound_ms = settings.SHED_QUEUED_AFTER_MS
        if bound_ms and request.path not in NEVER_SHED:
            waited = queued_s(request.META, time.time())
            if waited is not None and waited * 1000 > bound_ms:
                return _refusal(request, waited)
        return get_response(request)

    return middleware


def _refusal(request, waited_s: float) -> HttpResponse:
    detail = (
        f"The portal is overloaded: this request waited {waited_s * 1000:.0f} ms for a worker. "
        f"Nothing was done; retry after {RETRY_AFTER_S} s."
    )
    if request.path.startswith("/api/"):
        response = problem_response(503, "unavailable", detail, retry_after_s=RETRY_AFTER_S)
    else:
        response = HttpResponse(detail, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    response._has_been_logged = True  # Django would log each 5xx as an error: counted below instead
    _count_refusal(waited_s)
    return response


def _count_refusal(waited_s: float) -> None:
    _refused["since_log"] += 1
    now = time.monotonic()
    if now - _refused["logged_at"] >= LOG_EVERY_S:
        log.warning(
            "overloaded: refused %d requests that waited past %d ms (the last %.0f ms)",
            _refused["since_log"],
            settings.SHED_QUEUED_AFTER_MS,
            waited_s * 1000,
        )
        _refused["since_log"], _refused["logged_at"] = 0, now
