from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from tenants.models import Membership


def memberships_of(*, user: AbstractBaseUser) -> QuerySet[Membership]:
    """The caller's own memberships with their tenants, in one query."""
    return (
        Membership.objects.filter(user=user)
        .select_related("tenant")
        .only("role", "tenant__slug", "tenant__name")
        .order_by("tenant__slug")
    )
