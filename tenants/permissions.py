"""Role checks for views and the API: 404 came first (the object is outside the caller's
tenants); these answer 403 for a caller who sees the tenant but whose role lacks the action."""

from django.contrib.auth.models import AbstractBaseUser

from portal.core.errors import Forbidden, Invalid, OutsideTokenScope
from portal.core.staff import can_decide_quota, is_platform_admin, sees_all_tenants, staff_power_held_back
from portal.core.throttles import Allowance
from tenants.models import Tenant
from tenants.selectors import active_user_named, tenant_perms


def require(user: AbstractBaseUser, tenant: Tenant, perm: str) -> None:
    if perm not in tenant_perms(user=user, tenant=tenant):
        raise Forbidden(f"Your role in {tenant.slug} does not allow this.")


def _require_staff(user: AbstractBaseUser, allowed: bool, message: str) -> None:
    if allowed:
        return
    if staff_power_held_back(user):
        raise OutsideTokenScope("Staff powers need an API token of scope admin; this one is not.")
    raise Forbidden(message)


def require_platform_admin(user: AbstractBaseUser) -> None:
    _require_staff(user, is_platform_admin(user), "Only platform admins may do this.")


def require_quota_decider(user: AbstractBaseUser) -> None:
    message = "Only platform admins and quota approvers may decide quota requests."
    _require_staff(user, can_decide_quota(user), message)


def require_staff_reader(user: AbstractBaseUser) -> None:
    """Staff who see every tenant (platform admins, quota approvers, read-only support)."""
    _require_staff(user, sees_all_tenants(user), "Only platform staff may see this.")


def member_candidate(actor: AbstractBaseUser, username: str) -> AbstractBaseUser:
    """The active user a manager names to add to a tenant. Adding tells whether a username
    exists, which the manager may not otherwise see (they share no tenant): misses are counted
    per caller (API_THROTTLE_RATES["member_lookup"]) and, once spent, every look-up is refused
    with Throttled, hit or miss. Platform admins see every user and are not counted.
    Raises Invalid on a miss, with one message whatever the reason (no such user, inactive)."""
    if is_platform_admin(actor):
        user = active_user_named(username=username)
    else:
        allowance = Allowance(scope="member_lookup", ident=str(actor.pk))
        allowance.check()
        user = active_user_named(username=username)
        if user is None:
            allowance.spend()
    if user is None:
        raise Invalid({"username": "No active user has this username."})
    return user
