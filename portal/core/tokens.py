"""Personal API tokens: made, revoked, touched, and what each scope lets a request do
(docs/api.md, Tokens). A token is a ceiling over its user's powers, never a grant of more."""

import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from rest_framework.permissions import SAFE_METHODS

from portal.core.models import ApiToken, TokenScope, token_digest
from portal.core.services import audit_record
from portal.core.staff import holds_staff_power

# last_used is refreshed at most this often, so that reads through a token don't all write.
TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)


def token_scopes_for(user: AbstractBaseUser) -> list[str]:
    """The scopes the user may give a new token, narrowest first: `admin` only to staff."""
    scopes = [TokenScope.READ, TokenScope.SUBMIT]
    if holds_staff_power(user):
        scopes.append(TokenScope.ADMIN)
    return [str(scope) for scope in scopes]


def token_default_scope(user: AbstractBaseUser) -> str:
    """The widest scope the user may hold: what `POST /auth/token/` gives when none is asked, so
    that a client written before scopes existed keeps its user's powers."""
    return token_scopes_for(user)[-1]


@transaction.atomic
def token_create(
    *, user: AbstractBaseUser, name: str = "", scope: str | None = None, days: int | None = None
) -> tuple[ApiToken, str]:
    """A new API token for the user. The key is returned once, here; only its digest is stored.
    Refusals are Django's ValidationError by field (the API answers 400 naming it): this module
    loads with DRF's settings, before portal.core.errors can."""
    allowed = token_scopes_for(user)
    scope = scope or token_default_scope(user)
    if scope not in allowed:
        raise ValidationError({"scope": f"Your account may hold tokens of scope {', '.join(allowed)}."})
    days = settings.API_TOKEN_DAYS if days is None else days
    if not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        raise ValidationError(
            {"expires_in_days": f"Between 1 and {settings.API_TOKEN_MAX_DAYS} days (the site's maximum)."}
        )
    key = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        scope=scope,
        expires=timezone.now() + timedelta(days=days),
        key_digest=token_digest(key),
    )
    audit_record(
        actor=user, action="token.create", target=token, data={"name": name, "scope": scope, "days": days}
    )
    return token, key


@transaction.atomic
def token_revoke(*, token: ApiToken, actor: AbstractBaseUser) -> None:
    audit_record(actor=actor, action="token.revoke", target=token, data={"name": token.name})
    token.delete()


def token_touch(*, token: ApiToken) -> None:
    now = timezone.now()
    if token.last_used and now - token.last_used < TOKEN_TOUCH_INTERVAL:
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    token.last_used = now


def token_expired(token: ApiToken) -> bool:
    return token.expires <= timezone.now()


def token_allows_method(token: ApiToken, method: str) -> bool:
    """A `read` token makes safe requests only; the others may write (within their user's
    powers, and staff powers only through `admin`: portal.core.staff)."""
    return token.scope != TokenScope.READ or method.upper() in SAFE_METHODS
