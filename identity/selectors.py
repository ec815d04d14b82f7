"""Reads of the identity app: group mappings, for the staff who may see every tenant."""

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from identity.models import DirectoryAccount, GroupMapping, Source
from portal.core.staff import sees_all_tenants


def group_mappings_visible_to(*, user: AbstractBaseUser) -> QuerySet[GroupMapping]:
    """Every mapping for staff who see every tenant; none for anyone else."""
    if not sees_all_tenants(user):
        return GroupMapping.objects.none()
    return GroupMapping.objects.select_related("tenant").order_by("id")


def ldap_accounts_to_sync() -> QuerySet[DirectoryAccount]:
    """The users the LDAP sync reads again: signed in through LDAP, not gone from it."""
    return DirectoryAccount.objects.filter(source=Source.LDAP, gone__isnull=True).select_related("user")


def oidc_accounts_to_sync() -> QuerySet[DirectoryAccount]:
    """The users the OIDC sync asks the provider about: signed in through it with a refresh
    token, active, not gone."""
    return (
        DirectoryAccount.objects.filter(source=Source.OIDC, gone__isnull=True, user__is_active=True)
        .exclude(refresh_token="")
        .select_related("user")
    )
