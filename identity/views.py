"""The sign-in pages: the login page with the provider's button beside the username form, the
OIDC callback that shows a refused sign-in as a message, and the logout that also signs out of
the provider (RP-initiated logout)."""

import logging

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.translation import gettext as _
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView
from requests import RequestException

from identity.oidc import OidcRefused, provider_logout_url

log = logging.getLogger(__name__)


def sign_in_options() -> dict:
    """What the login page offers: the provider's button, and the form where a password of the
    portal's or the directory's is taken."""
    return {
        "oidc_enabled": bool(settings.OIDC_ISSUER),
        "oidc_name": settings.OIDC_PROVIDER_NAME,
        "password_form": settings.LOCAL_LOGIN or bool(settings.LDAP_SERVER_URI),
        "directory_form": bool(settings.LDAP_SERVER_URI),
    }


class LoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **sign_in_options()}

    def post(self, request, *args, **kwargs):
        if not sign_in_options()["password_form"]:
            return self.refused(request, _("Sign in with %(name)s.") % {"name": settings.OIDC_PROVIDER_NAME})
        return super().post(request, *args, **kwargs)

    @staticmethod
    def refused(request: HttpRequest, message: str, status: int = 400) -> HttpResponse:
        context = {"sso_error": message, "next": "", **sign_in_options()}
        return render(request, "registration/login.html", context, status=status)


class OidcLoginView(OIDCAuthenticationRequestView):
    def get_extra_params(self, request):
        # OIDC_PROMPT=consent: spec-strict providers grant offline_access (the sync's refresh
        # token) only with it. Here, not in OIDC_AUTH_REQUEST_EXTRA_PARAMS: the session refresh
        # would send it too, in place of its prompt=none.
        return {"prompt": settings.OIDC_PROMPT} if settings.OIDC_PROMPT else {}

    def get(self, request):
        if not settings.OIDC_ISSUER:
            return LoginView.refused(request, _("Single sign-on is not set up on this portal."), status=404)
        try:
            return super().get(request)
        except Exception:  # the discovery document could not be read
            log.exception("OIDC sign-in could not start")
            return LoginView.refused(
                request, _("The identity provider cannot be reached right now. Please try again later."), 503
            )


class OidcCallbackView(OIDCAuthenticationCallbackView):
    """mozilla-django-oidc's callback; a refusal (a bad token, a replayed state, the provider's
    error) is the login page with a message saying why, never a bare 400 or 500."""

    def get(self, request):
        try:
            return super().get(request)
        except OidcRefused as exc:
            self.forget_sign_in()
            return LoginView.refused(request, _("Sign-in refused: %(why)s") % {"why": exc})
        except SuspiciousOperation:  # the state: unknown, already used, or from another browser
            self.forget_sign_in()
            return LoginView.refused(
                request, _("This sign-in was already used or has expired. Please sign in again.")
            )
        except (RequestException, KeyError, ValueError):  # unreachable, or an answer not understood
            self.forget_sign_in()
            log.warning("the provider's token or user information endpoint failed")
            return LoginView.refused(
                request, _("The identity provider did not complete the sign-in. Please try again."), 502
            )

    def forget_sign_in(self) -> None:
        """A refused sign-in leaves nothing: not the ID token mozilla-django-oidc kept before the
        refusal (a later logout would send it as another's hint), nor a session it was
        refreshing (the provider no longer vouches for it)."""
        self.request.session.pop("oidc_id_token", None)
        if self.request.user.is_authenticated:
            auth.logout(self.request)

    def login_failure(self):
        request = self.request
        self.forget_sign_in()
        refused = getattr(request, "oidc_refused", None)
        if refused:
            return LoginView.refused(request, _("Sign-in refused: %(why)s") % {"why": refused})
        error = request.GET.get("error", "")
        if error in {"login_required", "interaction_required", "consent_required"}:
            return LoginView.refused(
                request, _("Your single sign-on session has ended. Please sign in again."), 401
            )
        if error:
            return LoginView.refused(
                request, _("The identity provider refused the sign-in (%(error)s).") % {"error": error[:64]}
            )
        return LoginView.refused(request, _("Sign-in failed. Please try again."))


class LogoutView(auth_views.LogoutView):
    """Django's logout; a session that the provider signed in is then sent to the provider's
    end_session_endpoint, so that the next sign-in asks for the password again."""

    def post(self, request, *args, **kwargs):
        through_provider = bool(settings.OIDC_ISSUER) and "oidc_id_token" in request.session
        leave = provider_logout_url(request) if through_provider else None
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(leave) if leave else response
