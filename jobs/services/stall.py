"""Jobs of a cluster that does not answer (clusters/breaker.py, docs/architecture/cluster-stall.md):
they wait in the database with a reason while its breaker is open, and go again when it closes."""

from django.db.models import Q
from django.utils import timezone

from clusters.breaker import REASON_UNAVAILABLE
from jobs.models import Job
from jobs.selectors import awaiting_dispatch
from jobs.services.common import send_after_commit


def _waiting(cluster_id: int) -> Q:
    return awaiting_dispatch(timezone.now()) & Q(cluster_id=cluster_id)


def jobs_hold_for_cluster(*, cluster_id: int) -> int:
    """Admitted jobs of the cluster that wait for dispatch (QUEUED, or SUBMITTING with no live
    lease) keep their state and say why: cluster_unavailable. Nothing is sent to the cluster,
    nothing is lost: the sweep and jobs_dispatch_resume send them once it answers. One UPDATE;
    returns how many rows took the reason."""
    return (
        Job.objects.filter(_waiting(cluster_id))
        .exclude(reason=REASON_UNAVAILABLE)
        .update(reason=REASON_UNAVAILABLE)
    )


def jobs_dispatch_resume(*, cluster_id: int) -> int:
    """The cluster answers again (its breaker closed): a dispatch message for every job that
    waits for it, so that they go now rather than at the next sweep. A message whose job another
    dispatcher's batch took along ends after one query. Returns how many were sent."""
    ids = list(Job.objects.filter(_waiting(cluster_id)).order_by("pk").values_list("pk", flat=True))
    for job_id in ids:
        send_after_commit("jobs.tasks.dispatch_job", job_id=job_id)
    return len(ids)
