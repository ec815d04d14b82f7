"""Per-user throttles whose rates are read from settings at request time (API_THROTTLE_RATES),
not frozen at import as DRF's defaults are, so a site can tune them and a test can lower them."""

import logging

from django.conf import settings
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

log = logging.getLogger(__name__)


class _RateFromSettings:
    scope: str

    def get_rate(self) -> str:
        return settings.API_THROTTLE_RATES[self.scope]


class _OpenWhenCacheDown:
    """The counters live in the cache, on the same Redis as the broker: with Redis down the API
    must keep answering (submissions are stored and the sweep dispatches them later), so an
    unreadable counter lets the request through rather than failing it."""

    def allow_request(self, request, view) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # the cache backend's own errors (redis, file system) differ
            log.warning("throttle %s skipped, cache unavailable: %s", self.scope, exc.__class__.__name__)
            return True


class UserThrottle(_OpenWhenCacheDown, _RateFromSettings, UserRateThrottle):
    scope = "user"


class AnonThrottle(_OpenWhenCacheDown, _RateFromSettings, AnonRateThrottle):
    scope = "anon"


class TokenCreateThrottle(_RateFromSettings, SimpleRateThrottle):
    """Password guesses through POST /auth/token/, counted per client address."""

    scope = "token"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
