"""Every write about tenants, members and quota: one use case per function, one transaction,
an audit event for each, domain errors out (the API turns them into problem+json)."""

from datetime import date, timedelta
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser, Permission
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from clusters.models import GpuModel, Scenario, ScenarioGpu, share_check
from clusters.shares import Share, ShareKind
from portal.core.errors import Conflict, Invalid, NotFound
from portal.core.services import audit_record
from tenants.errors import LastOwner, QuotaExhausted, TenantSuspended
from tenants.limits import tenant_limits_follow
from tenants.mail import mail_on_commit
from tenants.models import (
    Membership,
    QuotaGrant,
    QuotaRequest,
    RequestState,
    Role,
    Tenant,
    TenantState,
    TenantUserPermission,
    Tier,
)
from tenants.roles import ROLE_PERMISSIONS
from tenants.selectors import staff_emails, tenant_manager_emails, tenant_perms_forget

REMINDER_DAYS = (1, 7)  # nearest first: a grant found late gets one reminder, not two


# --- Tenants


@transaction.atomic
def tenant_create(
    *,
    actor: AbstractBaseUser | None,
    slug: str,
    name: str,
    tier: str = Tier.NORMAL,
    contact_email: str = "",
    owner: AbstractBaseUser | None = None,
) -> Tenant:
    """A new, active tenant, with its first owner when one is given."""
    if Tenant.objects.filter(slug=slug).exists():
        raise Invalid({"slug": "A tenant with this slug exists."})
    tenant = Tenant(slug=slug, name=name, tier=tier, contact_email=contact_email)
    tenant.full_clean()
    tenant.save()
    audit_record(actor=actor, action="tenant.create", target=tenant, tenant=tenant, data={"tier": tier})
    if owner is not None:
        membership_add(actor=actor, tenant=tenant, user=owner, role=Role.OWNER)
    return tenant


@transaction.atomic
def tenant_update(*, actor: AbstractBaseUser, tenant: Tenant, changes: dict) -> Tenant:
    """Change name, contact, tier or state; who may change which is the caller's check.
    Tier and state changes are audited on their own, since they change what a team may run."""
    before = {field: getattr(tenant, field) for field in changes}
    for field, value in changes.items():
        setattr(tenant, field, value)
    tenant.full_clean()
    tenant.save(update_fields=list(changes))
    changed = {f: [before[f], v] for f, v in changes.items() if before[f] != v}
    for field in ("tier", "state"):
        if field in changed:
            audit_record(
                actor=actor, action=f"tenant.{field}", target=tenant, tenant=tenant, data=changed[field]
            )
    if changed.keys() & {"tier", "state"}:
        tenant_limits_follow(tenant_id=tenant.pk)
    if changed.keys() - {"tier", "state"}:
        audit_record(actor=actor, action="tenant.update", target=tenant, tenant=tenant, data=changed)
    return tenant


def _require_active(tenant: Tenant) -> None:
    if tenant.state != TenantState.ACTIVE:
        raise TenantSuspended(f"Tenant {tenant.slug} is suspended: it can read but not request or submit.")


# --- Members and their guardian permissions


def _grant_role_perms(*, tenant: Tenant, user: AbstractBaseUser, role: Role) -> None:
    """Replace the user's object permissions on the tenant by those of the role."""
    TenantUserPermission.objects.filter(user=user, content_object=tenant).delete()
    perms = Permission.objects.filter(content_type__app_label="tenants", codename__in=ROLE_PERMISSIONS[role])
    TenantUserPermission.objects.bulk_create(
        TenantUserPermission(user=user, content_object=tenant, permission=perm) for perm in perms
    )
    tenant_perms_forget()


def _owners_for_update(tenant: Tenant) -> list[int]:
    # Locks the owner rows: two managers removing the last two owners at once would each
    # see another owner left without it.
    return list(
        Membership.objects.select_for_update()
        .filter(tenant=tenant, role=Role.OWNER)
        .order_by("id")
        .values_list("id", flat=True)
    )


@transaction.atomic
def membership_add(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant,
    user: AbstractBaseUser,
    role: Role,
    managed: bool = False,
    cause: str = "",
) -> Membership:
    """The user joins the tenant with a role and its permissions. `managed`: a directory group's
    mapping made it (and `cause` says which, for the audit)."""
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise Conflict(f"{user.get_username()} is already a member of {tenant.slug}.")
    membership = Membership.objects.create(tenant=tenant, user=user, role=role, managed=managed)
    _grant_role_perms(tenant=tenant, user=user, role=role)
    audit_record(
        actor=actor,
        action="membership.add",
        target=membership,
        tenant=tenant,
        data=_with_cause({"username": user.get_username(), "role": role}, cause),
    )
    return membership


def _with_cause(data: dict, cause: str) -> dict:
    return {**data, "cause": cause} if cause else data


def _member_for_update(membership: Membership) -> Membership:
    # After the owner locks: the row as it is now. A request that removed the member meanwhile
    # makes this one a 404, where saving the stale row would fail (no row updated) with a 500.
    current = Membership.objects.select_for_update().filter(pk=membership.pk).first()
    if current is None:
        raise NotFound(f"{membership.user.get_username()} is no longer a member of {membership.tenant.slug}.")
    membership.role = current.role
    return membership


@transaction.atomic
def membership_change_role(
    *, actor: AbstractBaseUser | None, membership: Membership, role: Role, cause: str = ""
) -> Membership:
    """A new role for a member; the tenant keeps at least one owner."""
    owners = _owners_for_update(membership.tenant)
    membership = _member_for_update(membership)
    if membership.role == Role.OWNER and role != Role.OWNER and owners == [membership.id]:
        raise LastOwner(f"{membership.user.get_username()} is the last owner of {membership.tenant.slug}.")
    old = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    _grant_role_perms(tenant=membership.tenant, user=membership.user, role=role)
    audit_record(
        actor=actor,
        action="membership.role",
        target=membership,
        tenant=membership.tenant,
        data=_with_cause({"username": membership.user.get_username(), "role": [old, role]}, cause),
    )
    return membership


@transaction.atomic
def membership_remove(*, actor: AbstractBaseUser | None, membership: Membership, cause: str = "") -> None:
    """The member leaves, with every permission on the tenant; never its last owner."""
    owners = _owners_for_update(membership.tenant)
    membership = _member_for_update(membership)
    if owners == [membership.id]:
        raise LastOwner(f"{membership.user.get_username()} is the last owner of {membership.tenant.slug}.")
    TenantUserPermission.objects.filter(user=membership.user, content_object=membership.tenant).delete()
    tenant_perms_forget()
    audit_record(
        actor=actor,
        action="membership.remove",
        target=membership,
        tenant=membership.tenant,
        data=_with_cause({"username": membership.user.get_username(), "role": membership.role}, cause),
    )
    membership.delete()


# --- Quota requests


@transaction.atomic
def quota_request_create(
    *,
    actor: AbstractBaseUser,
    tenant: Tenant,
    scenario: Scenario,
    gpu_model: GpuModel,
    gpus: int,
    gpu_hours: Decimal,
    starts_on: date,
    ends_on: date,
    justification: str,
    share: str = ShareKind.WHOLE,
    mig_profile: str = "",
) -> QuotaRequest:
    """A pending request, in the unit of its share (whole devices, MIG instances of a profile,
    slices, shards); platform admins hear of it by mail."""
    _require_active(tenant)
    errors = {}
    if not ScenarioGpu.objects.filter(scenario=scenario, gpu_model=gpu_model).exists():
        errors["gpu_model"] = f"{gpu_model.slug} is not one of the GPU models that {scenario.slug} lists."
    else:
        try:
            share_check(gpu_model, Share(share, mig_profile), unit_only=True)
        except ValidationError as exc:
            errors |= exc.message_dict
    if ends_on < starts_on:
        errors["ends_on"] = "Must not be before starts_on."
    elif ends_on < timezone.localdate():
        errors["ends_on"] = "Must not be in the past."
    if errors:
        raise Invalid(errors)
    request = QuotaRequest.objects.create(
        tenant=tenant,
        scenario=scenario,
        gpu_model=gpu_model,
        share=share,
        mig_profile=mig_profile,
        gpus=gpus,
        gpu_hours=gpu_hours,
        starts_on=starts_on,
        ends_on=ends_on,
        justification=justification,
        requested_by=actor,
    )
    audit_record(
        actor=actor,
        action="quota_request.create",
        target=request,
        tenant=tenant,
        data={
            "gpu_model": gpu_model.slug,
            "share": Share(share, mig_profile).label,
            "gpus": gpus,
            "gpu_hours": str(gpu_hours),
        },
    )
    mail_on_commit(template="request_new", to=staff_emails(), context={"request": request})
    return request


def _pending_for_update(request: QuotaRequest) -> QuotaRequest:
    # The row lock makes "decide twice" and "approve while withdrawing" answer 409, not
    # create two grants.
    locked = QuotaRequest.objects.select_for_update().get(pk=request.pk)
    if locked.state != RequestState.PENDING:
        raise Conflict(f"Quota request #{locked.pk} is {locked.state}, no longer pending.")
    return locked


@transaction.atomic
def quota_request_withdraw(*, actor: AbstractBaseUser, request: QuotaRequest) -> QuotaRequest:
    """pending → withdrawn; it stays listed."""
    request = _pending_for_update(request)
    request.state = RequestState.WITHDRAWN
    request.save(update_fields=["state"])
    audit_record(actor=actor, action="quota_request.withdraw", target=request, tenant=request.tenant)
    return request


@transaction.atomic
def quota_request_approve(
    *,
    actor: AbstractBaseUser,
    request: QuotaRequest,
    note: str,
    gpus: int | None = None,
    gpu_hours: Decimal | None = None,
    ends_on: date | None = None,
) -> QuotaRequest:
    """pending → approved, or partially_approved when any figure is lowered; the grant is
    created in the same transaction. Figures may be lowered, never raised."""
    request = _pending_for_update(request)
    granted = {
        "gpus": request.gpus if gpus is None else gpus,
        "gpu_hours": request.gpu_hours if gpu_hours is None else gpu_hours,
        "ends_on": request.ends_on if ends_on is None else ends_on,
    }
    errors = {
        field: f"May lower the requested {getattr(request, field)}, not raise it."
        for field, value in granted.items()
        if value > getattr(request, field)
    }
    if granted["ends_on"] < request.starts_on:
        errors["ends_on"] = "Must not be before the request's starts_on."
    if errors:
        raise Invalid(errors)
    grant = QuotaGrant.objects.create(
        tenant=request.tenant,
        scenario=request.scenario,
        gpu_model=request.gpu_model,
        share=request.share,
        mig_profile=request.mig_profile,
        starts_on=request.starts_on,
        **granted,
    )
    tenant_limits_follow(tenant_id=request.tenant_id)
    partial = any(value != getattr(request, field) for field, value in granted.items())
    request.state = RequestState.PARTIALLY_APPROVED if partial else RequestState.APPROVED
    _decide(actor=actor, request=request, note=note, grant=grant)
    return request


@transaction.atomic
def quota_request_reject(*, actor: AbstractBaseUser, request: QuotaRequest, note: str) -> QuotaRequest:
    """pending → rejected, with the note that says why."""
    request = _pending_for_update(request)
    request.state = RequestState.REJECTED
    _decide(actor=actor, request=request, note=note, grant=None)
    return request


def _decide(*, actor: AbstractBaseUser, request: QuotaRequest, note: str, grant: QuotaGrant | None) -> None:
    if not note.strip():
        raise Invalid({"note": "A decision needs a note for the team."})
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_note = note
    request.grant = grant
    request.save(update_fields=["state", "decided_by", "decided_at", "decision_note", "grant"])
    data = {"note": note}
    if grant is not None:
        data |= {
            "grant": grant.pk,
            "gpus": grant.gpus,
            "gpu_hours": str(grant.gpu_hours),
            "ends_on": str(grant.ends_on),
        }
    audit_record(
        actor=actor, action=f"quota_request.{request.state}", target=request, tenant=request.tenant, data=data
    )
    mail_on_commit(
        template="request_decided",
        to=tenant_manager_emails(tenant=request.tenant),
        context={"request": request, "grant": grant},
    )


@transaction.atomic
def quota_requests_expire(*, today: date | None = None) -> int:
    """Pending requests whose window has passed become expired; returns how many."""
    today = today or timezone.localdate()
    expired = list(
        QuotaRequest.objects.select_for_update().filter(state=RequestState.PENDING, ends_on__lt=today)
    )
    for request in expired:
        request.state = RequestState.EXPIRED
        request.save(update_fields=["state"])
        audit_record(actor=None, action="quota_request.expired", target=request, tenant=request.tenant)
    return len(expired)


# --- Grants: the ledger


def grant_for_update(*, grant_id: int) -> QuotaGrant:
    """The grant row, locked until the transaction ends: every ledger change goes through it."""
    return QuotaGrant.objects.select_for_update(no_key=True).get(pk=grant_id)


def grant_reserve(*, grant_id: int, gpu_hours: Decimal) -> None:
    """Reserve GPU-hours for a job on an active grant of an active tenant, or raise
    TenantSuspended or QuotaExhausted with the figures.

    One conditional UPDATE: PostgreSQL locks the row and checks the condition again on the row
    as the transaction before it left it, so fifty submissions at once each see the hours the
    others took and together never overshoot (the CHECK constraint would refuse it anyway)."""
    today = timezone.localdate()
    reserved = (
        QuotaGrant.objects.active_on(today)
        .filter(
            pk=grant_id,
            gpu_hours__gte=F("gpu_hours_used") + F("gpu_hours_reserved") + gpu_hours,
            tenant_id__in=Tenant.objects.filter(state=TenantState.ACTIVE).values("id"),
        )
        .update(gpu_hours_reserved=F("gpu_hours_reserved") + gpu_hours)
    )
    if reserved:
        return
    grant = QuotaGrant.objects.select_related("tenant").get(pk=grant_id)
    _require_active(grant.tenant)
    if not grant.is_active_on(today):
        raise QuotaExhausted(
            f"The grant runs from {grant.starts_on} to {grant.ends_on}.", extra={"grant": str(grant.pk)}
        )
    raise QuotaExhausted(
        f"{gpu_hours} GPU-hours asked, {grant.gpu_hours_remaining} left on the grant.",
        extra={
            "grant": str(grant.pk),
            "gpu_hours_requested": str(gpu_hours),
            "gpu_hours_remaining": str(grant.gpu_hours_remaining),
            "gpu_hours": str(grant.gpu_hours),
            "gpu_hours_used": str(grant.gpu_hours_used),
            "gpu_hours_reserved": str(grant.gpu_hours_reserved),
        },
    )


@transaction.atomic
def grant_take_gpus(*, grant_id: int, gpus: int) -> bool:
    """Take GPUs of the grant's concurrent limit for a job that starts; False when they are
    all in use (the job waits with reason quota_wait)."""
    grant = grant_for_update(grant_id=grant_id)
    if not grant.has_room_for(gpus):
        return False
    grant.gpus_in_use += gpus
    grant.save(update_fields=["gpus_in_use"])
    return True


@transaction.atomic
def grant_settle(
    *, grant_id: int, reserved_gpu_hours: Decimal, used_gpu_hours: Decimal, gpus: int
) -> QuotaGrant:
    """A job ended: release its reservation and its GPUs, charge what it really used (never
    more than it reserved)."""
    grant = grant_for_update(grant_id=grant_id)
    # No clamping at zero: a double settle must hit the check constraints, not vanish.
    grant.gpu_hours_reserved -= reserved_gpu_hours
    grant.gpu_hours_used += min(used_gpu_hours, reserved_gpu_hours)
    grant.gpus_in_use -= gpus
    grant.save(update_fields=["gpu_hours_reserved", "gpu_hours_used", "gpus_in_use"])
    return grant


def grants_remind_ending(*, today: date | None = None) -> int:
    """Mail owners and managers 7 days and 1 day before a grant ends, once each; returns how
    many reminders went out. A window, not an exact day, so that a missed run catches up."""
    today = today or timezone.localdate()
    sent = 0
    for days in REMINDER_DAYS:
        with transaction.atomic():
            due = (
                QuotaGrant.objects.select_for_update(skip_locked=True)
                .select_related("tenant", "gpu_model", "scenario")
                .filter(ends_on__gte=today, ends_on__lte=today + timedelta(days=days))
                .exclude(reminded_days_before__lte=days)
            )
            for grant in due:
                grant.reminded_days_before = days
                grant.save(update_fields=["reminded_days_before"])
                mail_on_commit(
                    template="grant_ending",
                    to=tenant_manager_emails(tenant=grant.tenant),
                    context={"grant": grant, "days": (grant.ends_on - today).days},
                )
                # Recorded too, so that the tenant's webhooks hear of it (webhooks/services.py).
                audit_record(
                    actor=None, action="grant.ending", target=grant, tenant=grant.tenant,
                    data={"ends_on": grant.ends_on.isoformat(), "days_left": (grant.ends_on - today).days,
                          "scenario": grant.scenario.slug, "gpu_model": grant.gpu_model.slug},
                )  # fmt: skip
                sent += 1
    return sent
