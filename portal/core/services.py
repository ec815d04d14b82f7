import secrets
from datetime import timedelta

from axes.utils import reset as axes_reset
from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone

from portal.core.models import ApiToken, AuditEvent, token_digest

# last_used is refreshed at most this often, so that reads through a token don't all write.
TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)


@transaction.atomic
def token_create(*, user: AbstractBaseUser, name: str = "") -> tuple[ApiToken, str]:
    """A new API token for the user. The key is returned once, here; only its digest is stored."""
    key = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, key_digest=token_digest(key))
    audit_record(actor=user, action="token.create", target=token, data={"name": name})
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


def audit_record(
    *,
    actor: AbstractBaseUser | None,
    action: str,
    target: models.Model,
    tenant: models.Model | None = None,
    data: dict | None = None,
) -> AuditEvent:
    """Append one audit event. Call it inside the service's transaction, so that the record and
    the change it describes land together or not at all."""
    return AuditEvent.objects.create(
        actor=actor if actor is not None and actor.is_authenticated else None,
        actor_username=actor.get_username() if actor is not None and actor.is_authenticated else "",
        tenant_id=tenant.pk if tenant is not None else None,
        tenant_slug=getattr(tenant, "slug", ""),
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        data=data or {},
    )


def login_failures_forget(*, username: str) -> int:
    """Forget the failed logins of this username (every address): its owner has just proven
    who they are by setting a new password through the mailed link, so a lock that guessers
    put on the account ends for them. Returns how many records went."""
    return axes_reset(username=username)
