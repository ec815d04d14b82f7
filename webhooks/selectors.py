"""Reads of webhooks: a tenant's endpoints and their delivery logs, and a user's job-end mail."""

from django.db.models import QuerySet

from tenants.models import Tenant
from webhooks.models import Delivery, Endpoint, JobEndMail


def endpoints_of(*, tenant: Tenant) -> QuerySet[Endpoint]:
    return Endpoint.objects.filter(tenant=tenant).select_related("tenant").order_by("id")


def deliveries_of(*, endpoint: Endpoint) -> QuerySet[Delivery]:
    """Newest first (the model's order)."""
    return Delivery.objects.filter(endpoint=endpoint)


def endpoints_with_log(*, tenant: Tenant, shown: int) -> list[Endpoint]:
    """The tenant's endpoints (a few), each with `log`: its latest `shown` deliveries."""
    endpoints = list(endpoints_of(tenant=tenant))
    for endpoint in endpoints:
        endpoint.log = list(deliveries_of(endpoint=endpoint)[:shown])
    return endpoints


def job_end_mail_of(user) -> bool:
    return JobEndMail.objects.filter(user=user, enabled=True).exists()
