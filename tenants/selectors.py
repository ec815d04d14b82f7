"""Reads, each scoped to what the caller may see. Every query about tenant data filters
through tenant_ids_visible_to() in SQL: one subquery, never a permission check per row."""

from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from portal.core.compiled import CompiledQuery
from portal.core.models import AuditEvent
from tenants.models import Membership, QuotaGrant, QuotaRequest, Tenant, TenantUserPermission
from tenants.roles import ALL_PERMISSIONS, VIEW, VIEW_AUDIT


def tenant_ids_with(*, user: AbstractBaseUser, perm: str) -> QuerySet:
    """Ids of the tenants where the user holds `perm`, as a subquery (platform admins: all)."""
    if not user.is_authenticated or not user.is_active:
        return Tenant.objects.none().values("id")
    if user.is_staff:
        return Tenant.objects.values("id")
    return TenantUserPermission.objects.filter(
        user=user, permission__codename=perm, permission__content_type__app_label="tenants"
    ).values("content_object_id")


def tenant_ids_visible_to(*, user: AbstractBaseUser) -> QuerySet:
    return tenant_ids_with(user=user, perm=VIEW)


# Per request (portal.core.middleware.tenant_perms_per_request): the caller's permissions by
# tenant, read once however many checks the request makes. None outside a request: every read
# queries. A service that changes permissions calls tenant_perms_forget(), which ends the memo.
_perms_memo: ContextVar[dict | None] = ContextVar("tenant_perms_memo", default=None)


# Every API request reads its caller's permissions: compiled once (portal.core.compiled).
_PERMS_OF_USER = CompiledQuery(
    lambda user_id: TenantUserPermission.objects.filter(
        user_id=user_id, permission__content_type__app_label="tenants"
    ).values_list("content_object_id", "permission__codename"),
    -7_300_001,
)


def tenant_perm_map(*, user: AbstractBaseUser) -> dict[int, frozenset[str]]:
    """The tenants where the (active, non-admin) user holds a permission, with those
    permissions, in one query; memoized for the request."""
    memo = _perms_memo.get()
    if memo is not None and user.pk in memo:
        return memo[user.pk]
    by_tenant = defaultdict(set)
    for tenant_id, codename in _PERMS_OF_USER.rows(user.pk):
        by_tenant[tenant_id].add(codename)
    perms = {tenant_id: frozenset(codenames) for tenant_id, codenames in by_tenant.items()}
    if memo is not None:
        memo[user.pk] = perms
    return perms


@contextmanager
def tenant_perms_memoized():
    """Within this block (a request), tenant_perm_map reads each user's permissions once."""
    token = _perms_memo.set({})
    try:
        yield
    finally:
        _perms_memo.reset(token)


def tenant_perms_forget() -> None:
    """Permissions changed: every later check of the request reads them again, memoized no
    more, since the change may yet roll back."""
    _perms_memo.set(None)


def tenant_id_list(*, user: AbstractBaseUser, perm: str = VIEW) -> list[int] | QuerySet:
    """The ids of the tenants where the user holds `perm`, as a list: a query that filters on it
    is simpler to plan than one with the permission subquery. Platform admins keep the subquery
    (every tenant)."""
    if not user.is_authenticated or not user.is_active:
        return []
    if user.is_staff:
        return tenant_ids_with(user=user, perm=perm)
    return sorted(tenant_id for tenant_id, perms in tenant_perm_map(user=user).items() if perm in perms)


def tenants_visible_to(*, user: AbstractBaseUser) -> QuerySet[Tenant]:
    return Tenant.objects.filter(id__in=tenant_ids_visible_to(user=user))


def tenant_perms(*, user: AbstractBaseUser, tenant: Tenant) -> frozenset[str]:
    """What the user may do in this tenant (one query per request: tenant_perm_map)."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if user.is_staff:
        return ALL_PERMISSIONS
    return tenant_perm_map(user=user).get(tenant.pk, frozenset())


def memberships_of(*, user: AbstractBaseUser) -> QuerySet[Membership]:
    """The caller's own memberships with their tenants, in one query."""
    return (
        Membership.objects.filter(user=user)
        .select_related("tenant")
        .only("role", "tenant__slug", "tenant__name")
        .order_by("tenant__slug")
    )


def members_of(*, tenant: Tenant) -> QuerySet[Membership]:
    return (
        Membership.objects.filter(tenant=tenant)
        .select_related("user")
        .only("id", "role", "joined", "tenant_id", "user__username")
    )


def quota_requests_visible_to(*, user: AbstractBaseUser) -> QuerySet[QuotaRequest]:
    return QuotaRequest.objects.filter(tenant_id__in=tenant_ids_visible_to(user=user)).select_related(
        "tenant", "scenario", "gpu_model", "requested_by", "decided_by"
    )


def grants_visible_to(*, user: AbstractBaseUser) -> QuerySet[QuotaGrant]:
    return QuotaGrant.objects.filter(tenant_id__in=tenant_ids_visible_to(user=user)).select_related(
        "tenant", "scenario", "gpu_model"
    )


def audit_visible_to(*, user: AbstractBaseUser) -> QuerySet[AuditEvent]:
    """Owners and managers read their tenants' events; platform admins read all."""
    if user.is_staff:
        return AuditEvent.objects.all()
    return AuditEvent.objects.filter(tenant_id__in=tenant_ids_with(user=user, perm=VIEW_AUDIT))


def staff_emails() -> list[str]:
    return list(
        get_user_model()
        .objects.filter(is_staff=True, is_active=True)
        .exclude(email="")
        .values_list("email", flat=True)
    )


def tenant_manager_emails(*, tenant: Tenant) -> list[str]:
    """Where a tenant's quota mail goes: its owners and managers."""
    return list(
        Membership.objects.filter(tenant=tenant, role__in=["owner", "manager"], user__is_active=True)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )


def active_user_named(*, username: str) -> AbstractBaseUser | None:
    """The active user of this username, or None. Whoever asks learns whether the name exists:
    callers guard it (portal.core.throttles.Allowance, scope member_lookup)."""
    return get_user_model().objects.filter(username=username, is_active=True).first()
