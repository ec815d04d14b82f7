"""/metrics for Prometheus, behind a bearer token (METRICS_TOKEN); the Alertmanager receiver is
monitoring.receiver's."""

import hmac

from django.conf import settings
from django.http import Http404, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from monitoring.collectors import PortalCollector
from portal.core.metrics import process_registry


def bearer_matches(request, expected: str | None) -> bool:
    """Whether the request carries `Authorization: Bearer <expected>` (compared in constant time)."""
    if not expected:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


@require_GET
def metrics(request):
    """The exposition: what every process counted, and what the collectors read now. 404 while
    no METRICS_TOKEN is set (the endpoint is off), 401 without the token."""
    if not settings.METRICS_TOKEN:
        raise Http404
    if not bearer_matches(request, settings.METRICS_TOKEN):
        response = HttpResponse("metrics need the bearer token\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    scrape = CollectorRegistry()
    scrape.register(PortalCollector())
    body = generate_latest(process_registry()) + generate_latest(scrape)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
