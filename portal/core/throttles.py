"""Per-user and per-address throttles: one counter per caller and fixed window, counted in the
cache, with rates read from settings at request time (API_THROTTLE_RATES), not frozen at import
as DRF's defaults are, so a site can tune them and a test can lower them.

Why not DRF's SimpleRateThrottle: it keeps every request's time in a list per caller and reads
and writes the whole pickled list on every request (up to 1,200 floats at the default user
rate). Under load that was 8 % of a request's time. A counter is one INCR on Redis. The price is
the fixed window's: a caller may spend a window's allowance at its end and the next at the start
of the following one."""

import ipaddress
import logging
import math
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

log = logging.getLogger(__name__)


def client_ip(request) -> str:
    """The client's address, the one every counter of this portal keys on (these throttles,
    django-axes' login lockout through AXES_CLIENT_IP_CALLABLE, the password reset's).

    With NUM_PROXIES = 0 the connection's own address. With n > 0 the n-th address from the
    right of X-Forwarded-For: the one the outermost of the n trusted proxies saw (each proxy
    appends the address it got the request from; what a client writes itself stays further
    left). A header with fewer addresses than n, or one that is not an address, means that
    NUM_PROXIES is wrong for this request: then the connection's address, never an empty or made-up
    one that every client would share, nor a client-chosen one from the header's left."""
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = api_settings.NUM_PROXIES
    if not proxies:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    if len(hops) >= proxies:
        try:
            return str(ipaddress.ip_address(hops[-proxies]))
        except ValueError:
            pass
    log.warning(
        "NUM_PROXIES=%d but X-Forwarded-For holds %d usable addresses: keyed on the connection's address",
        proxies,
        len(hops),
    )
    return remote


def window_count(key: str, window_s: int) -> int:
    """Add one to the caller's counter of this window and return it. On Redis one round trip
    (INCR and EXPIRE in a pipeline); on any other cache an add and an incr."""
    backend = getattr(cache, "_cache", None)
    if hasattr(backend, "get_client"):  # django.core.cache.backends.redis.RedisCache
        full_key = cache.make_and_validate_key(key)
        pipe = _redis_client(backend).pipeline(transaction=False)
        pipe.incr(full_key)
        pipe.expire(full_key, window_s + 1)
        return int(pipe.execute()[0])
    cache.add(key, 0, window_s + 1)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, window_s + 1)
        return 1


def _redis_client(backend):
    """The cache's Redis client for writes, made once per connection pool. Django's
    RedisCacheClient.get_client() builds a new redis.Redis on every call, 0.15 ms a request
    (a fifth of what the floor's whole answer costs, docs/performance.md); the pool, and so the
    connection, is the same either way. The cache backend is per thread, and so is its pool."""
    pool = backend._get_connection_pool(write=True)
    client = getattr(pool, "portal_client", None)
    if client is None:
        client = pool.portal_client = backend._client(connection_pool=pool)
    return client


class _CounterThrottle(BaseThrottle):
    scope: str
    fail_open = True  # the counters share Redis with the broker; see allow_request

    def get_ident(self, request) -> str:
        return client_ip(request)

    def ident(self, request) -> str | None:
        """Who is counted; None: this throttle does not apply to the request."""
        raise NotImplementedError

    def allow_request(self, request, view) -> bool:
        ident = self.ident(request)
        if ident is None:
            return True
        allowed, window_s = SimpleRateThrottle.parse_rate(None, settings.API_THROTTLE_RATES[self.scope])
        now = time.time()
        window = int(now // window_s)
        self._wait = (window + 1) * window_s - now
        try:
            count = window_count(f"throttle:{self.scope}:{ident}:{window_s}:{window}", window_s)
        except Exception as exc:  # the cache backend's own errors (redis, file system) differ
            if not self.fail_open:
                raise
            # With Redis down the API must keep answering (submissions are stored and the sweep
            # dispatches them later), so an unreadable counter lets the request through.
            log.warning("throttle %s skipped, cache unavailable: %s", self.scope, exc.__class__.__name__)
            return True
        return count <= allowed

    def wait(self) -> float:
        return max(1, math.ceil(self._wait))


class UserThrottle(_CounterThrottle):
    scope = "user"

    def ident(self, request) -> str | None:
        return str(request.user.pk) if request.user and request.user.is_authenticated else None


class ConditionalThrottle(UserThrottle):
    """Requests that carry If-None-Match (portal/core/conditional.py), 304s included, per user:
    a larger allowance than the user throttle's, which counts only those that get a full answer,
    so that replaying a current tag is not an unlimited way to make the portal run queries."""

    scope = "conditional"


class AnonThrottle(_CounterThrottle):
    scope = "anon"

    def ident(self, request) -> str | None:
        return None if request.user and request.user.is_authenticated else self.get_ident(request)


class TokenCreateThrottle(_CounterThrottle):
    """Password guesses through POST /auth/token/, counted per client address. It fails closed:
    with its counter unreadable, guessing would be unlimited."""

    scope = "token"
    fail_open = False

    def ident(self, request) -> str:
        return self.get_ident(request)


class Allowance:
    """A caller's allowance of events of one kind (API_THROTTLE_RATES[scope]) in a fixed window:
    failed look-ups of usernames, password reset mails. `check` refuses a caller who has spent
    it, before the attempt, whatever its outcome would be: a refusal that came only after a miss
    would itself tell a miss from a hit. `spend` counts one. Fails closed, as a guard against
    guessing must."""

    def __init__(self, *, scope: str, ident: str):
        self.scope, self.ident = scope, ident
        self.allowed, self.window_s = SimpleRateThrottle.parse_rate(None, settings.API_THROTTLE_RATES[scope])

    def _key(self) -> tuple[str, float]:
        now = time.time()
        window = int(now // self.window_s)
        key = f"allowance:{self.scope}:{self.ident}:{self.window_s}:{window}"
        return key, (window + 1) * self.window_s - now

    def check(self) -> None:
        """Raises Throttled (429, Retry-After) once the allowance is spent."""
        key, wait_s = self._key()
        try:
            spent = cache.get(key) or 0
        except Exception as exc:  # the cache backend's own errors (redis, file system) differ
            raise _unavailable("read") from exc
        if spent >= self.allowed:
            raise Throttled(wait=max(1, math.ceil(wait_s)))

    def spend(self) -> None:
        key, _wait = self._key()
        try:
            window_count(key, self.window_s)
        except Exception as exc:
            raise _unavailable("written") from exc


def _unavailable(what: str) -> Exception:
    # Imported here: portal.core.errors imports DRF's views, whose settings import this module.
    from portal.core.errors import Unavailable

    return Unavailable(f"The request counters cannot be {what} now; try again shortly.")
