"""The password reset pages: Django's forms and templates, with the mail sent by a Celery task,
the requests counted per address and per account, and a new password ending a login lock."""

import hashlib
import logging

from django.contrib.auth import views as auth_views
from django.http import HttpResponse, HttpResponseRedirect
from django.utils.translation import gettext as _
from rest_framework.exceptions import Throttled

from portal.core.services import login_failures_forget
from portal.core.tasks import send_password_reset
from portal.core.throttles import Allowance, client_ip

log = logging.getLogger(__name__)


def _account_key(email: str) -> str:
    # Counted by the address typed, whether or not an account has it: a count that only known
    # addresses had would tell which are known. Hashed, so that no cache key holds an address.
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()[:32]


class PasswordResetView(auth_views.PasswordResetView):
    """Answers a valid address by enqueueing the mail and going to the "mail on its way" page:
    the same answer, after the same work (no query of the users), for any address. The mail,
    the users' query and the SMTP round trip happen in a worker (send_password_reset).

    Counted per client address (API_THROTTLE_RATES["reset_address"]) and per address typed
    ("reset_account"): past either, 429 on the form with Retry-After, and no mail."""

    def form_valid(self, form) -> HttpResponse:
        email = form.cleaned_data["email"]
        allowances = [
            Allowance(scope="reset_address", ident=client_ip(self.request)),
            Allowance(scope="reset_account", ident=_account_key(email)),
        ]
        try:
            for allowance in allowances:
                allowance.check()
            for allowance in allowances:
                allowance.spend()
            send_password_reset.delay(
                email=email, domain=self.request.get_host(), use_https=self.request.is_secure()
            )
        except Throttled as exc:
            message = _("Too many requests for a new password. Try again in %(minutes)s minutes.")
            form.add_error(None, message % {"minutes": max(1, round(exc.wait / 60))})
            response = self.render_to_response(self.get_context_data(form=form), status=429)
            response["Retry-After"] = str(exc.wait)
            return response
        except Exception as exc:  # the broker's or the cache's errors (both Redis); the page must answer
            log.warning("password reset not enqueued: %s", exc.__class__.__name__)
            form.add_error(None, _("The mail cannot be sent right now. Please try again in a few minutes."))
            return self.render_to_response(self.get_context_data(form=form), status=503)
        return HttpResponseRedirect(self.get_success_url())


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """Django's view; a new password set through the mailed link also ends a login lock on the
    account (portal.core.lockout): the lock page sends a locked-out user here."""

    def form_valid(self, form) -> HttpResponse:
        response = super().form_valid(form)
        login_failures_forget(username=form.user.get_username())
        return response
