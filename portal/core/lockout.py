"""Login lockout (django-axes): the HTML login page, the admin console's login and the API's
token endpoint all authenticate through django.contrib.auth.authenticate(request=…), which axes
watches. Three counts of failures within AXES_COOLOFF_TIME, from axes' AccessAttempt rows:

- a username from one address (axes' own lockout parameter): LOGIN_FAILURE_LIMIT, low;
- a username from every address: LOGIN_ACCOUNT_FAILURE_LIMIT, much higher, so that guessing
  spread over many addresses stops too, while a lock earned from one address (a shared NAT, a
  proxy that NUM_PROXIES does not name) does not lock the account for everyone else;
- an address over every username: LOGIN_ADDRESS_FAILURE_LIMIT, for one address trying many
  accounts; it locks that address only.

Usernames are counted whether or not they exist, so a lock says nothing about an account.
A success resets its username and address pair (AXES_RESET_ON_SUCCESS); attempts while locked
are not counted (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT off), so a lock ends when its
cool-off does, and Retry-After says when."""

import math
from datetime import timedelta

from axes.attempts import get_cool_off_threshold
from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from portal.core.errors import problem_response


class LockoutBackend(AxesStandaloneBackend):
    """axes' check before any password is tried. authenticate() without a request comes from
    no web entry point (a shell, the test client's login()): it is not watched."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def _failures(request, **match) -> int:
    rows = AccessAttempt.objects.filter(attempt_time__gte=get_cool_off_threshold(request), **match)
    return rows.aggregate(n=Sum("failures_since_start"))["n"] or 0


class LockoutHandler(AxesDatabaseHandler):
    """axes' database handler (a username and address pair, AXES_FAILURE_LIMIT), and the
    username's and the address's own counts at their higher limits."""

    def _wide_lock(self, request, credentials) -> bool:
        username = get_client_username(request, credentials)
        if username and _failures(request, username=username) >= settings.LOGIN_ACCOUNT_FAILURE_LIMIT:
            return True
        address = request.axes_ip_address
        limit = settings.LOGIN_ADDRESS_FAILURE_LIMIT
        return bool(address) and _failures(request, ip_address=address) >= limit

    def is_locked(self, request, credentials=None) -> bool:
        return super().is_locked(request, credentials) or self._wide_lock(request, credentials)

    def user_login_failed(self, sender, credentials: dict, request=None, **kwargs):
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or request.axes_locked_out or not self._wide_lock(request, credentials):
            return
        request.axes_locked_out = True
        request.axes_credentials = credentials
        user_locked_out.send(
            "axes",
            request=request,
            username=get_client_username(request, credentials),
            ip_address=request.axes_ip_address,
        )


def _retry_after_s(request, credentials) -> int:
    """Seconds until the newest failure that counts against this username or address leaves
    the cool-off window: when the lock ends at the latest."""
    cool_off = get_cool_off(request) or timedelta(0)
    username = get_client_username(request, credentials)
    rows = AccessAttempt.objects.filter(attempt_time__gte=get_cool_off_threshold(request))
    times = [
        rows.filter(**{field: value}).aggregate(t=Max("attempt_time"))["t"]
        for field, value in (("username", username), ("ip_address", request.axes_ip_address))
        if value
    ]
    newest = max((t for t in times if t is not None), default=None)
    if newest is None:
        return max(1, int(cool_off.total_seconds()))
    return max(1, math.ceil((newest + cool_off - timezone.now()).total_seconds()))


def lockout_response(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: 429 with Retry-After; problem+json `throttled` on the API (docs/api.md),
    a page that says what happened and what to do on the login pages."""
    wait_s = _retry_after_s(request, credentials)
    if request.path.startswith("/api/"):
        response = problem_response(
            429,
            "throttled",
            f"Too many failed logins for this username or from this address. Try again in {wait_s} s.",
            retry_after_s=wait_s,
        )
    else:
        minutes = max(1, math.ceil(wait_s / 60))
        response = render(request, "registration/locked_out.html", {"minutes": minutes}, status=429)
    response["Retry-After"] = str(wait_s)
    return response
