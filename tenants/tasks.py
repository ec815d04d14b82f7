from celery import shared_task

from clusters.selectors import cluster_ids_enabled
from clusters.tasks import BACKEND_RETRY
from tenants.limits import tenant_apply
from tenants.selectors import tenant_ids_all
from tenants.services import grants_remind_ending, quota_requests_expire


@shared_task(acks_late=True, soft_time_limit=120, time_limit=150)
def expire_quota_requests() -> int:
    """pending → expired for requests whose end date passed."""
    return quota_requests_expire()


@shared_task(acks_late=True, soft_time_limit=120, time_limit=150)
def remind_grants_ending() -> int:
    """Mail the 7-day and 1-day reminders before grants end."""
    return grants_remind_ending()


@shared_task(acks_late=True, soft_time_limit=120, time_limit=150, **BACKEND_RETRY)
def apply_tenant(*, tenant_id: int, cluster_id: int | None = None) -> None:
    """The tenant's account, QOS and limits on one cluster, or on every enabled one."""
    if cluster_id is not None:
        tenant_apply(tenant_id=tenant_id, cluster_id=cluster_id)
        return
    for pk in cluster_ids_enabled():
        apply_tenant.delay(tenant_id=tenant_id, cluster_id=pk)


@shared_task(acks_late=True, soft_time_limit=50, time_limit=60)
def apply_tenants() -> int:
    """Beat, hourly: every tenant's limits on every cluster, whatever changed in between."""
    ids = tenant_ids_all()
    for tenant_id in ids:
        apply_tenant.delay(tenant_id=tenant_id)
    return len(ids)
