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

Under sustained overload the bound tightens (CoDel's test for a standing queue, from network
queue management): when every request a worker took up over the last half second had waited
longer than two fifths of the bound (200 ms of 500: the SLA's P99), the queue is not a burst
that will drain but one that stays, and then the bound is those 200 ms until a half second
passes in which some request waited less. The requests that are served then wait at most that,
not the whole bound, while a burst at a rate the portal can carry (the queue drains, some
request waits little) is still served whole.

Only a proxy sets the header (it overwrites any that a client sent). A request that reaches
gunicorn directly without one is never refused; a client that sends one itself can at most
have its own request refused, or served as it would be without the header.
"""

import logging
import math
import time

from django.conf import settings
from django.http import HttpResponse

from portal.core.errors import problem_response

# Answered whatever the load: the probe that tells an orchestrator the process is alive, and
# Prometheus's scrape, which is how an overload is seen.
NEVER_SHED = ("/healthz", "/metrics")
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


class StandingQueue:
    """CoDel's test, per process: over each interval, the least wait of the requests taken up.
    The queue stands when, over the last interval that had requests, even the least wait was
    above the target."""

    INTERVAL_S = 0.5

    def __init__(self) -> None:
        self.ends_at, self.least, self.standing = 0.0, math.inf, False

    def observe(self, waited_s: float, now: float, target_s: float) -> bool:
        """Count one request's wait; whether the queue stands (as of the last interval)."""
        if now >= self.ends_at:
            # A whole interval since the last one ended without a request: nothing stood in it.
            idle = now >= self.ends_at + self.INTERVAL_S
            self.standing = not idle and self.least > target_s
            self.least, self.ends_at = math.inf, now + self.INTERVAL_S
        self.least = min(self.least, waited_s)
        return self.standing


# A queue stands when the least wait of an interval stays above this share of the bound, and
# then the bound is this share of itself: 200 ms of 500, the SLA's P99 (when even the least
# wait is past it, the SLA is lost anyway). A tenth, and then a fifth, refused requests at
# 150/s and even 50 submissions/s, rates the portal carries (docs/performance.md).
TARGET_SHARE = STANDING_SHARE = 0.4
QUEUE = StandingQueue()  # per process; a sync worker has one thread


def shed_when_queued_too_long(get_response):
    """Refuse (503, Retry-After) a request that waited longer than SHED_QUEUED_AFTER_MS, or two
    fifths of it while the queue stands."""

    def middleware(request):
        bound_s = settings.SHED_QUEUED_AFTER_MS / 1000
        if bound_s and request.path not in NEVER_SHED:
            now = time.time()
            waited = queued_s(request.META, now)
            if waited is not None:
                if QUEUE.observe(waited, now, bound_s * TARGET_SHARE):
                    bound_s *= STANDING_SHARE
                if waited > bound_s:
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
