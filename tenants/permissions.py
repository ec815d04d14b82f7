"""Role checks for views and the API: 404 came first (the object is outside the caller's
tenants); these answer 403 for a caller who sees the tenant but whose role lacks the action."""

from django.contrib.auth.models import AbstractBaseUser

from portal.core.errors import Forbidden
from tenants.models import Tenant
from tenants.selectors import tenant_perms


def require(user: AbstractBaseUser, tenant: Tenant, perm: str) -> None:
    if perm not in tenant_perms(user=user, tenant=tenant):
        raise Forbidden(f"Your role in {tenant.slug} does not allow this.")


def require_staff(user: AbstractBaseUser) -> None:
    if not user.is_staff:
        raise Forbidden("Only platform admins may do this.")
