"""Reads, each scoped to what the caller may see. Every query about tenant data filters
through tenant_ids_visible_to() in SQL: one subquery, never a permission check per row."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

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


def tenant_id_list(*, user: AbstractBaseUser, perm: str = VIEW) -> list[int] | QuerySet:
    """tenant_ids_with, read now into a list: a query that filters on it is simpler to plan
    than one with the permission subquery. Platform admins keep the subquery (every tenant)."""
    ids = tenant_ids_with(user=user, perm=perm)
    if user.is_authenticated and user.is_active and user.is_staff:
        return ids
    return [tenant_id for row in ids for tenant_id in row.values()]  # rows of one column


def tenants_visible_to(*, user: AbstractBaseUser) -> QuerySet[Tenant]:
    return Tenant.objects.filter(id__in=tenant_ids_visible_to(user=user))


def tenant_perms(*, user: AbstractBaseUser, tenant: Tenant) -> frozenset[str]:
    """What the user may do in this tenant, in one query."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if user.is_staff:
        return ALL_PERMISSIONS
    codenames = TenantUserPermission.objects.filter(user=user, content_object=tenant).values_list(
        "permission__codename", flat=True
    )
    return frozenset(codenames)


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
