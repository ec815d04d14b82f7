"""Role checks for views and the API: 404 came first (the object is outside the caller's
tenants); these answer 403 for a caller who sees the tenant but whose role lacks the action."""

from django.contrib.auth.models import AbstractBaseUser

from portal.core.errors import Forbidden
from portal.core.staff import can_decide_quota, is_platform_admin
from tenants.models import Tenant
from tenants.selectors import tenant_perms


def require(user: AbstractBaseUser, tenant: Tenant, perm: str) -> None:
    if perm not in tenant_perms(user=user, tenant=tenant):
        raise Forbidden(f"Your role in {tenant.slug} does not allow this.")


def require_platform_admin(user: AbstractBaseUser) -> None:
    if not is_platform_admin(user):
        raise Forbidden("Only platform admins may do this.")


def require_quota_decider(user: AbstractBaseUser) -> None:
    if not can_decide_quota(user):
        raise Forbidden("Only platform admins and quota approvers may decide quota requests.")
