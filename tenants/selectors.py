"""Reads, each scoped to what the caller may see. Every query about tenant data filters
through tenant_ids_visible_to() in SQL: one subquery, never a permission check per row."""

from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import date

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Permission
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet

from clusters.models import Cluster, ClusterKind, IdentityCheck, JobIdentity
from portal.core.compiled import CompiledQuery
from portal.core.models import AuditEvent
from portal.core.staff import DECIDE_QUOTA, PLATFORM_ADMIN, is_platform_admin, sees_all_tenants
from portal.core.validators import cluster_username_validator
from tenants.models import (
    ClusterAccount,
    Membership,
    Profile,
    QuotaGrant,
    QuotaRequest,
    Tenant,
    TenantUserPermission,
)
from tenants.roles import ALL_PERMISSIONS, VIEW, VIEW_AUDIT

# What staff who see every tenant (portal.core.staff.sees_all_tenants) may do in each: read it
# and its audit log, as a viewer with the audit. Platform admins hold ALL_PERMISSIONS.
READ_ALL_PERMISSIONS = frozenset({VIEW, VIEW_AUDIT})


def _everywhere(user: AbstractBaseUser, perm: str) -> bool:
    """Does the user hold `perm` in every tenant, as staff?"""
    if not user.is_staff:  # the common caller: no permission query at all
        return False
    if perm in READ_ALL_PERMISSIONS:
        return sees_all_tenants(user)
    return is_platform_admin(user)


def tenant_ids_with(*, user: AbstractBaseUser, perm: str) -> QuerySet:
    """Ids of the tenants where the user holds `perm`, as a subquery (staff who hold it
    everywhere: all)."""
    if not user.is_authenticated or not user.is_active:
        return Tenant.objects.none().values("id")
    if _everywhere(user, perm):
        return Tenant.objects.values("id")
    return TenantUserPermission.objects.filter(
        user=user, permission__codename=perm, permission__content_type__app_label="tenants"
    ).values("content_object_id")


def tenant_ids_visible_to(*, user: AbstractBaseUser) -> QuerySet:
    return tenant_ids_with(user=user, perm=VIEW)


# Per request (tenants.middleware.tenant_perms_per_request): the caller's permissions by
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


def tenant_id_list_visible_to(*, user: AbstractBaseUser) -> list[int] | QuerySet:
    """The tenants of tenant_ids_visible_to as a list of ids, read from the request's permission
    map (tenant_perm_map) instead of a subquery: a query that filters on a list is simpler to
    plan. Staff who see every tenant keep the subquery (every tenant)."""
    if not user.is_authenticated or not user.is_active:
        return []
    if _everywhere(user, VIEW):
        return tenant_ids_visible_to(user=user)
    return sorted(tenant_id for tenant_id, perms in tenant_perm_map(user=user).items() if VIEW in perms)


def tenants_visible_to(*, user: AbstractBaseUser) -> QuerySet[Tenant]:
    return Tenant.objects.filter(id__in=tenant_ids_visible_to(user=user))


def tenant_perms(*, user: AbstractBaseUser, tenant: Tenant) -> frozenset[str]:
    """What the user may do in this tenant (one query per request: tenant_perm_map)."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if user.is_staff and is_platform_admin(user):
        return ALL_PERMISSIONS
    own = tenant_perm_map(user=user).get(tenant.pk, frozenset())
    if user.is_staff and sees_all_tenants(user):
        return own | READ_ALL_PERMISSIONS
    return own


def memberships_of(*, user: AbstractBaseUser) -> QuerySet[Membership]:
    """The caller's own memberships with their tenants, in one query."""
    return (
        Membership.objects.filter(user=user)
        .select_related("tenant")
        .only("role", "tenant__slug", "tenant__name")
        .order_by("tenant__slug")
    )


# GET /me/ reads the caller's memberships on every call: compiled once (portal.core.compiled).
_MEMBERSHIP_ROWS = CompiledQuery(
    lambda user_id: (
        Membership.objects.filter(user_id=user_id)
        .order_by("tenant__slug")
        .values_list("tenant__slug", "tenant__name", "role")
    ),
    -7_300_002,
)


def membership_rows_of(*, user: AbstractBaseUser) -> list[dict]:
    """memberships_of as rows {slug, name, role}, by tenant slug: one compiled query."""
    return [{"slug": slug, "name": name, "role": role} for slug, name, role in _MEMBERSHIP_ROWS.rows(user.pk)]


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


def grants_of(*, user: AbstractBaseUser, tenant: Tenant) -> QuerySet[QuotaGrant]:
    """The tenant's grants, latest ending first: the quota page's list."""
    return grants_visible_to(user=user).filter(tenant=tenant).order_by("-ends_on", "id")


def grants_not_ended_of(*, user: AbstractBaseUser, tenant: Tenant, day: date) -> QuerySet[QuotaGrant]:
    """The tenant's grants not ended by `day`, in force or yet to start, soonest ending first."""
    return grants_visible_to(user=user).filter(tenant=tenant, ends_on__gte=day).order_by("ends_on")


def grants_active_of(*, user: AbstractBaseUser, tenant: Tenant, day: date) -> QuerySet[QuotaGrant]:
    """The tenant's grants in force on `day`."""
    return grants_visible_to(user=user).active_on(day).filter(tenant=tenant)


def granted_gpu_model_ids_of(*, user: AbstractBaseUser, tenant: Tenant, day: date) -> set[int]:
    """The ids of the GPU models that the tenant's grants in force on `day` cover."""
    return set(grants_active_of(user=user, tenant=tenant, day=day).values_list("gpu_model_id", flat=True))


def audit_visible_to(*, user: AbstractBaseUser) -> QuerySet[AuditEvent]:
    """Owners and managers read their tenants' events; staff who see every tenant read all."""
    if user.is_staff and sees_all_tenants(user):
        return AuditEvent.objects.all()
    return AuditEvent.objects.filter(tenant_id__in=tenant_ids_with(user=user, perm=VIEW_AUDIT))


def quota_deciders() -> QuerySet:
    """The active staff who may decide quota requests: superusers, and those who hold the power
    directly or through a role's group (portal.core.staff.can_decide_quota, in SQL)."""
    codenames = [perm.split(".", 1)[1] for perm in (PLATFORM_ADMIN, DECIDE_QUOTA)]
    powers = Permission.objects.filter(content_type__app_label="tenants", codename__in=codenames).values("id")
    holds = Q(is_superuser=True) | Q(user_permissions__in=powers) | Q(groups__permissions__in=powers)
    User = get_user_model()
    return User.objects.filter(id__in=User.objects.filter(holds, is_staff=True, is_active=True).values("id"))


def platform_admin_emails() -> list[str]:
    """Where a platform alert goes: the active staff who hold the platform admin power
    (superusers, directly, or through the role's group)."""
    codename = PLATFORM_ADMIN.split(".", 1)[1]
    power = Permission.objects.filter(content_type__app_label="tenants", codename=codename).values("id")
    holds = Q(is_superuser=True) | Q(user_permissions__in=power) | Q(groups__permissions__in=power)
    User = get_user_model()
    admins = User.objects.filter(holds, is_staff=True, is_active=True).exclude(email="")
    return sorted(set(admins.values_list("email", flat=True)))


def staff_emails() -> list[str]:
    """Where news of a quota request goes: the staff who may decide it."""
    return list(quota_deciders().exclude(email="").values_list("email", flat=True))


def tenant_manager_emails(*, tenant: Tenant) -> list[str]:
    """Where a tenant's quota mail goes: its owners and managers."""
    return list(
        Membership.objects.filter(tenant=tenant, role__in=["owner", "manager"], user__is_active=True)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )


# --- Cluster identities: whom a tenant's jobs run as on a cluster (docs/architecture.md)


def job_identity_of(*, cluster: Cluster, tenant: Tenant, user: AbstractBaseUser | None) -> str | None:
    """The POSIX identity a job of `user` in `tenant` runs as on `cluster`: "" where the cluster
    kind has none (Kubernetes, local), the tenant's cluster account (tenants_identities), or the
    user's own cluster username; None when there is none to use."""
    if cluster.kind != ClusterKind.SLURM:
        return ""
    if cluster.job_identity == JobIdentity.USER:
        name = Profile.objects.filter(user=user).values_list("cluster_username", flat=True).first() or ""
        return name if _usable(cluster, name) else None
    return (_tenant_accounts(cluster=cluster, tenants=[tenant]).get(tenant.pk) or [None])[0]


def tenant_identities(*, cluster: Cluster, tenant: Tenant) -> list[str]:
    """Every identity the tenant's jobs may run as on the cluster: the one account of the
    tenant's, or its members' own cluster usernames. [] where the kind has none."""
    return tenants_identities(cluster=cluster, tenants=[tenant])[tenant.pk]


def tenants_identities(*, cluster: Cluster, tenants: list[Tenant]) -> dict[int, list[str]]:
    """tenant_identities for many tenants in two queries at most, whatever their number."""
    found: dict[int, set[str]] = {tenant.pk: set() for tenant in tenants}
    if cluster.kind != ClusterKind.SLURM:
        return {pk: [] for pk in found}
    if cluster.job_identity == JobIdentity.USER:
        rows = Membership.objects.filter(tenant__in=found, user__profile__isnull=False).exclude(
            user__profile__cluster_username=""
        )
        for tenant_id, name in rows.values_list("tenant_id", "user__profile__cluster_username"):
            found[tenant_id].add(name)
    else:
        for tenant_id, names in _tenant_accounts(cluster=cluster, tenants=tenants).items():
            found[tenant_id].update(names)
    return {pk: sorted(name for name in names if _usable(cluster, name)) for pk, names in found.items()}


def _tenant_accounts(*, cluster: Cluster, tenants: list[Tenant]) -> dict[int, list[str]]:
    """Per tenant its cluster account on a per-tenant cluster ([] when it has none): its own
    setting (unique per cluster), else the cluster's template, unless another tenant's own
    setting already names the template's result: two tenants never share one identity."""
    own = dict(
        ClusterAccount.objects.filter(cluster=cluster, tenant__in=tenants).values_list(
            "tenant_id", "username"
        )
    )
    templated = {tenant.pk: _from_template(cluster, tenant) for tenant in tenants if tenant.pk not in own}
    claimed = set(
        ClusterAccount.objects.filter(
            cluster=cluster, username__in=set(templated.values()) - {""}
        ).values_list("username", flat=True)
    )
    names = own | {pk: name for pk, name in templated.items() if name not in claimed}
    return {
        tenant.pk: [names[tenant.pk]] if _usable(cluster, names.get(tenant.pk, "")) else []
        for tenant in tenants
    }


def _usable(cluster: Cluster, name: str) -> bool:
    return bool(name) and name not in {"root", cluster.ssh_user}


def _from_template(cluster: Cluster, tenant: Tenant) -> str:
    try:
        name = cluster.tenant_identity_template.format(tenant=tenant.slug)
        cluster_username_validator(name)
    except (KeyError, IndexError, ValueError, ValidationError):
        return ""  # a slug too long for the template: the tenant needs a cluster account of its own
    return name


def tenant_identity_rows(*, tenant: Tenant) -> list[dict]:
    """Per enabled Slurm cluster and identity of the tenant's there: {cluster, username, ok},
    ok being what the last check found (None: not checked yet): the team page's report. A
    cluster where the tenant has no usable identity at all says so with username ""."""
    rows = []
    for cluster in Cluster.objects.filter(kind=ClusterKind.SLURM, enabled=True).order_by("name"):
        names = tenant_identities(cluster=cluster, tenant=tenant)
        found = IdentityCheck.objects.filter(cluster=cluster, username__in=names)
        checks = dict(found.values_list("username", "problem"))
        rows += [{"cluster": cluster, "username": name, "ok": _ok(checks.get(name))} for name in names]
        if not names:
            rows.append({"cluster": cluster, "username": "", "ok": False})
    return rows


def _ok(problem: str | None) -> bool | None:
    return None if problem is None else not problem


def active_user_named(*, username: str) -> AbstractBaseUser | None:
    """The active user of this username, or None. Whoever asks learns whether the name exists:
    callers guard it (portal.core.throttles.Allowance, scope member_lookup)."""
    return get_user_model().objects.filter(username=username, is_active=True).first()


def tenant_ids_all() -> list[int]:
    """Every tenant, for the beat's fan-outs (apply-tenants): not a caller's view, so no scope."""
    return list(Tenant.objects.values_list("pk", flat=True))
