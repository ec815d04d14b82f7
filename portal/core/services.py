from axes.utils import reset as axes_reset
from django.contrib.auth.models import AbstractBaseUser
from django.db import models

from portal.core.models import AuditEvent


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
