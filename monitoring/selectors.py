"""Alerts and channels as the caller may see them."""

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from monitoring.models import Alert, AlertChannel, AlertStatus
from portal.core.staff import sees_all_tenants
from tenants.models import Tenant
from tenants.selectors import tenant_id_list_visible_to


def alerts_visible_to(*, user: AbstractBaseUser) -> QuerySet[Alert]:
    """A tenant's alerts to its members; every alert, the platform's included, to staff who read
    every tenant. A platform alert (no tenant) is no tenant member's."""
    alerts = Alert.objects.select_related("tenant", "cluster")
    if sees_all_tenants(user):
        return alerts
    return alerts.filter(tenant_id__in=tenant_id_list_visible_to(user=user))


def alerts_firing_of(*, user: AbstractBaseUser, tenant: Tenant) -> QuerySet[Alert]:
    return alerts_visible_to(user=user).filter(tenant=tenant, status=AlertStatus.FIRING)


def alerts_of_job(*, user: AbstractBaseUser, job_id: int) -> QuerySet[Alert]:
    return alerts_visible_to(user=user).filter(job_id=job_id)


def channels_of(*, tenant: Tenant) -> QuerySet[AlertChannel]:
    return AlertChannel.objects.filter(tenant=tenant)
