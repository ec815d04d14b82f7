"""Per-user throttles whose rates are read from settings at request time (API_THROTTLE_RATES),
not frozen at import as DRF's defaults are, so a site can tune them and a test can lower them."""

from django.conf import settings
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle


class _RateFromSettings:
    scope: str

    def get_rate(self) -> str:
        return settings.API_THROTTLE_RATES[self.scope]


class UserThrottle(_RateFromSettings, UserRateThrottle):
    scope = "user"


class AnonThrottle(_RateFromSettings, AnonRateThrottle):
    scope = "anon"


class TokenCreateThrottle(_RateFromSettings, SimpleRateThrottle):
    """Password guesses through POST /auth/token/, counted per client address."""

    scope = "token"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
