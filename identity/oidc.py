"""Sign-in through an OpenID Connect provider: mozilla-django-oidc's authorization code flow with
PKCE, state and nonce, made strict where it is lenient (the ID token's issuer and audience are
checked, a groups claim must be a list of strings) and tied to the portal's users through the
`sub` claim, never the e-mail address (identity.services)."""

import logging
import time
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.http import HttpResponse
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh as OidcSessionRefresh
from requests import RequestException

from identity.discovery import discovered
from identity.models import Source
from identity.selectors import oidc_accounts_to_sync
from identity.services import (
    DirectoryRefused,
    account_of,
    directory_signed_in,
    directory_user_gone,
    directory_user_new,
)

log = logging.getLogger(__name__)

LEEWAY_S = 30  # clock skew allowed between the provider and the portal


class OidcRefused(SuspiciousOperation):
    """A sign-in the provider's answer does not support; the message is for the person."""


def _claim_list(claims: dict, name: str) -> list[str]:
    value = claims.get(name, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise OidcRefused(f"The provider's “{name}” claim is not a list of group names.")
    return value


def _vouched_by_claims(user, claims: dict, *, cause: str, refresh_token: str) -> None:
    """The provider's claims about the user, now: the link, the groups, the cluster username."""
    directory_signed_in(
        user=user,
        source=Source.OIDC,
        subject=claims["sub"],
        groups=_claim_list(claims, settings.OIDC_GROUPS_CLAIM),
        cluster_username=str(claims.get(settings.OIDC_CLUSTER_USERNAME_CLAIM) or ""),
        cause=cause,
        refresh_token=refresh_token,
    )


class OidcBackend(OIDCAuthenticationBackend):
    refresh_token = ""  # the provider's, from this sign-in's code exchange (kept for the sync)

    def get_token(self, payload):
        token_info = super().get_token(payload)
        # Kept from a sign-in, not from a session refresh (prompt=none, on a signed-in session):
        # providers drop offline_access there, and that refresh token would die with the
        # provider's session, where the sign-in's outlives it.
        refreshing = getattr(self.request, "user", None) is not None and self.request.user.is_authenticated
        self.refresh_token = "" if refreshing else token_info.get("refresh_token") or ""
        return token_info

    def refreshed(self, *, refresh_token: str, subject: str) -> tuple[dict, str] | None:
        """The user's claims now and the next refresh token, through a refresh at the provider;
        None when the provider refuses the grant (the user is gone, disabled, or revoked the
        portal). A provider that cannot be reached raises."""
        data = {
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "client_id": self.OIDC_RP_CLIENT_ID,
        }
        auth = None
        if self.get_settings("OIDC_TOKEN_USE_BASIC_AUTH", False):
            auth = (self.OIDC_RP_CLIENT_ID, self.OIDC_RP_CLIENT_SECRET)
        else:
            data["client_secret"] = self.OIDC_RP_CLIENT_SECRET
        response = requests.post(
            self.OIDC_OP_TOKEN_ENDPOINT, data=data, auth=auth, timeout=self.get_settings("OIDC_TIMEOUT", 10)
        )
        if response.status_code in (400, 401) and _oauth_error(response) == "invalid_grant":
            return None
        response.raise_for_status()
        answer = response.json()
        claims = self.get_userinfo(answer["access_token"], None, {"sub": subject})
        return claims, answer.get("refresh_token") or refresh_token

    def _verify_jws(self, payload, key):
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise OidcRefused(
                f"The ID token is signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}."
            )
        try:
            return jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=discovered(settings.OIDC_ISSUER)["issuer"],  # as the provider writes it
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise OidcRefused("The ID token has expired.") from None
        except jwt.InvalidAudienceError:
            raise OidcRefused("The ID token was issued to another client (audience).") from None
        except jwt.InvalidIssuerError:
            raise OidcRefused("The ID token was issued by another provider (issuer).") from None
        except jwt.InvalidSignatureError:
            raise OidcRefused("The ID token's signature does not match the provider's keys.") from None
        except jwt.PyJWTError as exc:
            raise OidcRefused(f"The ID token is not valid: {exc}.") from None

    def retrieve_matching_jwk(self, token):
        try:
            return super().retrieve_matching_jwk(token)
        except (SuspiciousOperation, KeyError, jwt.PyJWTError):  # no such key, no `kid`, not a JWT
            raise OidcRefused("The ID token names a key the provider does not publish.") from None

    def verify_token(self, token, **kwargs):
        if not isinstance(token, str) or token.count(".") != 2:
            raise OidcRefused("The provider's answer holds no ID token.")
        try:
            alg = jwt.get_unverified_header(token).get("alg")
        except jwt.PyJWTError as exc:  # a header that is no JSON, a `kid` that is no string
            raise OidcRefused(f"The provider's answer is not a valid ID token: {exc}.") from None
        if alg != self.OIDC_RP_SIGN_ALGO:  # before any key is looked for: "none" never verifies
            raise OidcRefused(f"The ID token is signed with {alg!r}, not {self.OIDC_RP_SIGN_ALGO}.")
        return super().verify_token(token, **kwargs)

    def get_userinfo(self, access_token, id_token, payload):
        """The userinfo answer over the ID token's claims; its `sub` must be the token's."""
        info = super().get_userinfo(access_token, id_token, payload)
        if info.get("sub") != payload.get("sub"):
            raise OidcRefused("The provider's user information is about another subject.")
        return {**payload, **info}

    def verify_claims(self, claims):
        username = claims.get(settings.OIDC_USERNAME_CLAIM)
        if not isinstance(username, str) or not username.strip():
            raise OidcRefused(
                f"The provider sent no “{settings.OIDC_USERNAME_CLAIM}” claim to name the account."
            )
        _claim_list(claims, settings.OIDC_GROUPS_CLAIM)
        return True

    def filter_users_by_claims(self, claims):
        account = account_of(source=Source.OIDC, subject=claims["sub"])
        return [account.user] if account is not None else []

    def create_user(self, claims):
        try:
            user = directory_user_new(
                username=claims[settings.OIDC_USERNAME_CLAIM].strip(),
                email=claims.get("email") or "",
                first_name=claims.get("given_name") or "",
                last_name=claims.get("family_name") or "",
                source=Source.OIDC,
                subject=claims["sub"],
            )
        except DirectoryRefused as exc:
            raise OidcRefused(str(exc)) from None
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        account = account_of(source=Source.OIDC, subject=claims["sub"])
        if not user.is_active and (account is None or account.gone is None):
            raise OidcRefused("This account is disabled in the portal; ask a platform admin.")
        try:
            _vouched_by_claims(user, claims, cause="sign-in", refresh_token=self.refresh_token)
        except DirectoryRefused as exc:
            raise OidcRefused(str(exc)) from None
        return user

    def get_or_create_user(self, access_token, id_token, payload):
        # One transaction: a refused sign-in creates nothing. mozilla-django-oidc logs and
        # swallows a refusal raised here; the request keeps its message for the callback page.
        try:
            with transaction.atomic():
                return super().get_or_create_user(access_token, id_token, payload)
        except OidcRefused as exc:
            self.request.oidc_refused = str(exc)
            raise

    def authenticate(self, request, **kwargs):
        # Only the callback's own call (it passes the nonce it kept): Django tries every backend
        # on a failed password login too, and mozilla-django-oidc would then read `code` and
        # `state` from any query string and spend the client's secret on them.
        if not settings.OIDC_ISSUER or request is None or "nonce" not in kwargs:
            return None
        if request.path != reverse("oidc-callback"):
            return None
        return super().authenticate(request, **kwargs)

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


def _oauth_error(response) -> str:
    try:
        return str(response.json().get("error", ""))
    except ValueError:
        return ""


def sync_oidc_users() -> dict[str, int]:
    """Ask the provider about every user who signed in through it, with their refresh token:
    groups followed, and a user the provider refuses (gone, disabled) loses access. A provider
    that cannot be reached disables no one. Counts by outcome."""
    counts = {"synced": 0, "gone": 0, "failed": 0, "held": 0}
    if not settings.OIDC_ISSUER:
        return counts
    backend = OidcBackend()
    for account in oidc_accounts_to_sync().iterator(chunk_size=200):
        user = account.user
        try:
            answer = backend.refreshed(refresh_token=account.refresh_token, subject=account.subject)
            if answer is None:
                directory_user_gone(user=user, cause="sync: the provider refused the user's refresh token")
                counts["gone"] += 1
                continue
            claims, refresh_token = answer
            # Kept before anything else can fail: a provider that rotates refresh tokens has
            # just spent the old one.
            account.refresh_token = refresh_token
            account.save(update_fields=["refresh_token"])
            _vouched_by_claims(user, claims, cause="sync", refresh_token=refresh_token)
            counts["synced"] += 1
        except (RequestException, ValueError, KeyError, SuspiciousOperation, DirectoryRefused) as exc:
            log.warning("OIDC sync of %s failed: %s", user.get_username(), type(exc).__name__)
            counts["failed"] += 1
    return counts


class SessionRefresh(OidcSessionRefresh):
    """mozilla-django-oidc's: a session signed in through the provider more than
    OIDC_RENEW_SECONDS ago is sent to the provider with prompt=none; a provider that no longer
    knows the user (signed out there, disabled) ends the portal's session too. Always in the
    middleware, inert while OIDC is off: its settings are read per request, not at start."""

    def __init__(self, get_response):
        super(OidcSessionRefresh, self).__init__(get_response)  # MiddlewareMixin's, not the parent's

    def __getattr__(self, name):
        if name.startswith("OIDC_"):  # what the parent read once in its __init__
            defaults = {"OIDC_STATE_SIZE": 32, "OIDC_NONCE_SIZE": 32, "OIDC_EXEMPT_URLS": []}
            return getattr(settings, name, defaults.get(name))
        raise AttributeError(name)

    @property
    def exempt_urls(self):
        return {reverse(name) for name in ("logout", "oidc-login", "oidc-callback")}

    def process_request(self, request):
        if not settings.OIDC_ISSUER or not self.is_refreshable_url(request):
            return None
        if request.session.get("oidc_id_token_expiration", 0) > time.time():
            return None
        if request.headers.get("HX-Request"):
            # An htmx poll cannot follow a redirect to the provider: the whole page reloads
            # instead, and that top-level GET goes through the provider (htmx's HX-Refresh).
            response = HttpResponse(status=204)
            response["HX-Refresh"] = "true"
            return response
        try:
            return super().process_request(request)
        except ImproperlyConfigured:  # the provider's discovery document unreadable now
            log.warning("session refresh skipped: the provider cannot be reached")
            return None


def provider_logout_url(request) -> str | None:
    """Where RP-initiated logout sends the browser: the provider's end_session_endpoint with the
    ID token as hint and the login page to come back to; None when the provider has none."""
    try:
        end_session = discovered(settings.OIDC_ISSUER).get("end_session_endpoint")
    except Exception:  # the provider unreachable: the portal's own logout still happens
        log.warning("the provider's end_session_endpoint could not be read")
        return None
    if not end_session:
        return None
    params = {
        "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
        "client_id": settings.OIDC_RP_CLIENT_ID,
    }
    id_token = request.session.get("oidc_id_token")
    if id_token:
        params["id_token_hint"] = id_token
    return f"{end_session}?{urlencode(params)}"
