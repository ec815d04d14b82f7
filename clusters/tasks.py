from celery import shared_task

from clusters.backends.base import BackendUnavailable
from clusters.models import Cluster
from clusters.selectors import cluster_ids_enabled
from clusters.services import cluster_sync

# How a task that talks to a scheduler retries: a cluster that does not answer now may in a
# minute (backoff 2 s … 120 s, 8 tries). jobs' and tenants' tasks take it.
BACKEND_RETRY = {
    "autoretry_for": (BackendUnavailable,),
    "retry_backoff": 2,
    "retry_backoff_max": 120,
    "max_retries": 8,
}


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90)
def sync_cluster(*, cluster_id: int) -> bool:
    """Health and free GPUs of one cluster."""
    return cluster_sync(cluster=Cluster.objects.get(pk=cluster_id))


@shared_task(acks_late=True, soft_time_limit=20, time_limit=30)
def sync_clusters() -> int:
    """Beat: one sync task per enabled cluster."""
    ids = cluster_ids_enabled()
    for cluster_id in ids:
        sync_cluster.apply_async(kwargs={"cluster_id": cluster_id}, expires=55)
    return len(ids)
