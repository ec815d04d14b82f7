from celery import shared_task

from clusters.models import Cluster
from clusters.selectors import cluster_ids_enabled
from clusters.services import cluster_sync


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
