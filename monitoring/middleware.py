"""The request metrics (portal.core.metrics): first of all middleware, so that what the overload
guard sheds and what a later middleware refuses is counted too."""

import time

from django.conf import settings

from portal.core import metrics

UNMATCHED = "unmatched"  # no URL pattern matched (a 404, or a request shed before resolving)
STATIC = "static"


def route_of(request) -> str:
    """The URL pattern that answered the request, never its path (whose ids are unbounded)."""
    match = getattr(request, "resolver_match", None)
    if match is not None and match.route:
        return match.route
    if request.path.startswith(settings.STATIC_URL):
        return STATIC
    return UNMATCHED


def count_requests(get_response):
    """Observe each request's latency per route, method and status; count the throttled (429)
    and shed (503) ones and the server errors."""

    def middleware(request):
        started = time.perf_counter()
        response = get_response(request)
        elapsed = time.perf_counter() - started
        route, status = route_of(request), response.status_code
        method = request.method if request.method in metrics.METHODS else "other"
        metrics.http_request_seconds.labels(route, method, str(status)).observe(elapsed)
        if status in (429, 503):
            metrics.http_throttled.labels(route, str(status)).inc()
        elif status >= 500:
            metrics.http_failed.labels(route).inc()
        return response

    return middleware
