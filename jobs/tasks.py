"""Thin Celery tasks: ids in, one service each. Each is safe to run twice."""

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError

from clusters.backends.base import PURGE_TIMEOUT_S
from clusters.tasks import BACKEND_RETRY
from jobs import services
from jobs.budgets import budgets_notify
from jobs.selectors import cluster_ids_to_poll
from jobs.services.admission import jobs_admit_marked
from jobs.services.dispatch import jobs_dispatch
from jobs.services.poll import POLL_TIME_LIMIT_S
from tenants.tasks import apply_tenant


@shared_task(
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.JOB_DISPATCH_TIME_LIMIT_S - 30,
    time_limit=settings.JOB_DISPATCH_TIME_LIMIT_S,
    **BACKEND_RETRY,
)
def dispatch_job(*, job_id: int) -> int:
    """QUEUED → SUBMITTING → PENDING, for the job and, in the same batch, others of its cluster
    that wait (services.jobs_dispatch); the leases and find(token) make a second run harmless.
    A cluster whose breaker is open leaves the job QUEUED (cluster_unavailable); one whose
    worker slots are taken retries the message (ClusterBusy, a BackendUnavailable)."""
    return jobs_dispatch(job_id=job_id, retry=dispatch_job.request.retries > 0)


@shared_task(
    acks_late=True,
    soft_time_limit=50,
    time_limit=60,
    autoretry_for=(DatabaseError,),
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=5,
)
def admit_partition(*, partition_id: int) -> int:
    """Admission on a partition after submissions (services.jobs_admit_later), or after an end
    that found it busy."""
    return len(jobs_admit_marked(partition_id=partition_id))


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90, **BACKEND_RETRY)
def cancel_job(*, job_id: int, backend_id: str = "") -> None:
    """CANCELLING: tell the scheduler; the next poll sees CANCELLED."""
    services.job_cancel_in_scheduler(job_id=job_id, backend_id=backend_id)


@shared_task(acks_late=True, soft_time_limit=POLL_TIME_LIMIT_S - 30, time_limit=POLL_TIME_LIMIT_S)
def poll_cluster(*, cluster_id: int) -> int:
    """One poll of one cluster; an unreachable cluster is marked unhealthy and its jobs wait."""
    return services.jobs_poll(cluster_id=cluster_id)


@shared_task(acks_late=True, soft_time_limit=20, time_limit=30)
def poll_clusters() -> int:
    """Beat: one poll task per cluster to poll, so that a slow cluster delays no other."""
    ids = cluster_ids_to_poll()
    for cluster_id in ids:
        # A poll that waited past the next one is stale: let it expire rather than pile up.
        poll_cluster.apply_async(kwargs={"cluster_id": cluster_id}, expires=settings.JOB_POLL_INTERVAL_S)
    return len(ids)


@shared_task(acks_late=True, soft_time_limit=50, time_limit=60)
def sweep_jobs() -> int:
    """Beat: re-send dispatches whose message was lost, and admit what now fits."""
    return services.jobs_sweep()


@shared_task(acks_late=True, soft_time_limit=240, time_limit=300)
def watch_idle_gpus() -> dict:
    """Beat: idle stretches of RUNNING jobs' GPUs; a flag mailed after one window, and with
    IDLE_GPU_CANCEL RUNNING → CANCELLING after a second. No retry: the next beat samples anew."""
    return services.jobs_watch_idle().as_dict()


# --- Cleanup (jobs/services/cleanup.py, docs/periodic-tasks.md): beat runs each; none retries, since
# the next beat does the work anew. Each returns its report as a dict. The run lock of the cleanup
# services outlives the longest hard limit below (cleanup.RUN_LOCK_S).


@shared_task(acks_late=True, soft_time_limit=240, time_limit=300)
def cap_walltime() -> dict:
    """Beat: RUNNING → CANCELLING (walltime_cap) past JOB_WALLTIME_CAP_HOURS."""
    return services.jobs_cap_walltime().as_dict()


@shared_task(acks_late=True, soft_time_limit=240, time_limit=300)
def end_grants() -> dict:
    """Beat: jobs waiting on ended grants → CANCELLED/CANCELLING (grant_ended); limits lowered."""
    return services.grants_end().as_dict()


@shared_task(acks_late=True, soft_time_limit=240, time_limit=300)
def hold_suspended_tenants() -> dict:
    """Beat: suspended tenants' jobs in a scheduler → CANCELLING (tenant_suspended); QUEUED held."""
    return services.tenants_hold_suspended().as_dict()


@shared_task(acks_late=True, soft_time_limit=50, time_limit=60)
def purge_scratch() -> int:
    """Beat, daily: one purge_tenant_scratch per enabled cluster and tenant, so that a slow tree
    holds up no other and each purge has its own time limit. Kubernetes clusters keep no scratch."""
    pairs = services.scratch_purge_targets()
    for cluster_id, tenant_id in pairs:
        purge_tenant_scratch.apply_async(
            kwargs={"cluster_id": cluster_id, "tenant_id": tenant_id}, expires=80_000
        )
    return len(pairs)


@shared_task(acks_late=True, soft_time_limit=PURGE_TIMEOUT_S + 60, time_limit=PURGE_TIMEOUT_S + 90)
def purge_tenant_scratch(*, cluster_id: int, tenant_id: int) -> dict:
    """Old files under one tenant's scratch directory on one cluster."""
    return services.scratch_purge(cluster_id=cluster_id, tenant_id=tenant_id).as_dict()


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def find_orphans() -> dict:
    """Beat: scheduler jobs with a portal token and no live portal job, reported (and cancelled)."""
    return services.orphans_find().as_dict()


@shared_task(acks_late=True, soft_time_limit=1700, time_limit=1800)
def apply_retention() -> dict:
    """Beat, daily: old scheduler objects and the middle of old finished jobs' timelines."""
    return services.retention_apply().as_dict()


# --- Old names


@shared_task(
    name="jobs.tasks.apply_tenant", acks_late=True, soft_time_limit=120, time_limit=150, **BACKEND_RETRY
)
def apply_tenant_old_name(*, tenant_id: int, cluster_id: int | None = None) -> None:
    """tenants.tasks.apply_tenant under the name it had before it moved to tenants: a message
    queued (or waiting on a retry) under that name when a new release starts is still applied,
    not dropped as unregistered. Remove one release after the move."""
    apply_tenant(tenant_id=tenant_id, cluster_id=cluster_id)


@shared_task(acks_late=True, soft_time_limit=45, time_limit=55)
def sample_gpus() -> dict:
    """Beat, every GPU_SAMPLE_INTERVAL_S: one reading of each RUNNING job's GPUs, kept for its
    charts (jobs/services/telemetry.py). No retry: the next beat reads anew."""
    return services.jobs_sample_gpus().as_dict()


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90, **BACKEND_RETRY)
def warn_job(*, job_id: int, attempt: int | None = None) -> None:
    """A job reclaimed by its lender: warned now, stopped after its grace (services.job_warn)."""
    services.job_warn(job_id=job_id, attempt=attempt)


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90, **BACKEND_RETRY)
def stop_job(*, job_id: int, attempt: int | None = None) -> None:
    """A warned job whose grace is out: cancelled in its scheduler (services.job_stop)."""
    services.job_stop(job_id=job_id, attempt=attempt)


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90, **BACKEND_RETRY)
def review_attempt(*, attempt_id: int) -> None:
    """What a stopped attempt kept: its last checkpoint, its lost GPU-hours given back."""
    services.attempt_review(attempt_id=attempt_id)


@shared_task(acks_late=True, soft_time_limit=240, time_limit=300)
def check_budgets(*, tenant_id: int | None = None) -> int:
    """Beat (every tenant), and after a submission (its tenant): the 50/80/100 % notices of
    budgets, each once per period (jobs.budgets.budgets_notify)."""
    return budgets_notify(tenant_id=tenant_id)
