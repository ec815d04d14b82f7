from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from portal.core.services import audit_record
from tenants.models import Membership, Role, Tenant, Tier


@transaction.atomic
def tenant_create(
    *, actor: AbstractBaseUser | None, slug: str, name: str, tier: Tier = Tier.NORMAL, contact_email: str = ""
) -> Tenant:
    """A new, active tenant."""
    tenant = Tenant(slug=slug, name=name, tier=tier, contact_email=contact_email)
    tenant.full_clean()
    tenant.save()
    audit_record(actor=actor, action="tenant.create", target=tenant, tenant=tenant, data={"tier": tier})
    return tenant


@transaction.atomic
def membership_add(
    *, actor: AbstractBaseUser | None, tenant: Tenant, user: AbstractBaseUser, role: Role
) -> Membership:
    """User joins the tenant with a role."""
    membership = Membership.objects.create(tenant=tenant, user=user, role=role)
    audit_record(
        actor=actor,
        action="membership.add",
        target=membership,
        tenant=tenant,
        data={"username": user.get_username(), "role": role},
    )
    return membership
