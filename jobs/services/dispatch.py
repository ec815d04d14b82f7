"""Dispatch and the sweep (steps 3 and 6): the database is the source of truth, not the queue."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from clusters.backends.base import (
    BackendError,
    BackendUnavailable,
    JobSpec,
    JobStatus,
)
from clusters.services import backend_of, cluster_mark_health
from jobs.models import Job, JobState
from jobs.services.common import _move, _send_now
from jobs.services.follow import job_finish
from jobs.services.submit import job_unadmit_if_held, jobs_admit

# --- Dispatch


def _claim(job_id: int) -> Job | None:
    """Take the dispatch lease of an admitted QUEUED job (→ SUBMITTING) or of a SUBMITTING job
    whose last dispatcher is gone. One conditional UPDATE: of two dispatchers, one wins."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.JOB_DISPATCH_LEASE_S)
    claimable = Q(state=JobState.QUEUED, holds_gpus=True) | Q(state=JobState.SUBMITTING)
    expired = Q(dispatch_lease_until__isnull=True) | Q(dispatch_lease_until__lt=now)
    if not Job.objects.filter(claimable & expired, pk=job_id).update(
        dispatch_lease_until=lease, dispatch_attempts=F("dispatch_attempts") + 1
    ):
        return None
    with transaction.atomic():
        # of=self: the job row alone. A plain FOR UPDATE with select_related also locks its
        # cluster, partition, GPU model and tenant rows, in whatever order the join yields them,
        # and deadlocked with job_submit, which locks partition and cluster first.
        job = (
            Job.objects.select_for_update(of=("self",))
            .select_related("cluster", "partition", "gpu_model", "tenant")
            .get(pk=job_id)
        )
        if job.state == JobState.QUEUED:
            if job_unadmit_if_held(job):  # suspended or grant ended since admission: not submitted
                return None
            _move(job, JobState.SUBMITTING)
            job.save(update_fields=["state", "reason", "raw_state"])
        elif job.state != JobState.SUBMITTING:
            return None  # cancelled or ended between the lease and the lock: nothing to submit
    return job


def _spec(job: Job) -> JobSpec:
    return JobSpec(
        token=job.token,
        name=job.name,
        account=job.tenant.slug,
        qos=f"portal-{job.tenant.tier}",
        priority=job.priority,
        partition=job.partition.name,
        gpu_type=job.gpu_model.slurm_gres,
        k8s_resource=job.gpu_model.k8s_resource,
        k8s_product=job.gpu_model.k8s_product,
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        walltime_minutes=job.walltime_minutes,
        script=job.script,
        env=dict(job.env),
        cpus_per_gpu=job.cpus_per_gpu,
        mem_per_gpu_mb=job.mem_per_gpu_mb,
        labels={"tenant": job.tenant.slug, "job": str(job.pk), "scenario": job.scenario.slug},
    )


def job_dispatch(*, job_id: int) -> None:
    """QUEUED (admitted) → SUBMITTING → PENDING. Safe to run twice and after a crash anywhere:
    the lease lets one dispatcher work at a time, and any attempt after the first asks the
    scheduler for the job's token before it submits again."""
    job = _claim(job_id)
    if job is None:
        return
    backend = backend_of(job.cluster)
    try:
        backend_id = (backend.find(job.token) if job.dispatch_attempts > 1 else None) or backend.submit(
            _spec(job)
        )
    except BackendUnavailable as exc:
        cluster_mark_health(cluster=job.cluster, healthy=False, detail=str(exc))
        Job.objects.filter(pk=job_id).update(dispatch_lease_until=None)  # the retry may go at once
        raise
    except BackendError as exc:
        job_finish(job_id=job_id, status=None, reject_reason=str(exc)[:200])
        return
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        job.backend_id, job.submitted_at, job.dispatch_lease_until = backend_id, timezone.now(), None
        if job.state == JobState.SUBMITTING:
            _move(job, JobState.PENDING, reason="submitted")
            job.save()
            return
        job.save()
    # Cancelled (or ended) while sbatch ran: the scheduler's copy must not live on.
    try:
        backend.cancel(backend_id)
    except BackendUnavailable:
        _send_now("jobs.tasks.cancel_job", job_id=job_id, backend_id=backend_id)


# --- Sweep


def jobs_sweep() -> int:
    """Re-send what a lost message left behind (broker down, worker killed): admitted QUEUED
    jobs and SUBMITTING jobs whose lease ran out, and admission on partitions with waiting jobs.
    The database is the source of truth, not the queue. Returns how many were re-sent."""
    now = timezone.now()
    stale = Q(dispatch_lease_until__isnull=True) | Q(dispatch_lease_until__lt=now)
    resend = list(
        Job.objects.filter(stale)
        .filter(Q(state=JobState.QUEUED, holds_gpus=True) | Q(state=JobState.SUBMITTING))
        .values_list("pk", flat=True)
    )
    for job_id in resend:
        _send_now("jobs.tasks.dispatch_job", job_id=job_id)
    waiting = Job.objects.filter(state=JobState.QUEUED, holds_gpus=False).values_list(
        "partition_id", flat=True
    )
    for partition_id in set(waiting):
        jobs_admit(partition_id=partition_id)
    for job in Job.objects.filter(stale, state=JobState.CANCELLING, backend_id="").select_related("cluster"):
        _cancel_unsubmitted(job)
    # A cancel whose message was lost: ask again (scancel of an ended job is a no-op).
    for job_id in (
        Job.objects.filter(state=JobState.CANCELLING).exclude(backend_id="").values_list("pk", flat=True)
    ):
        _send_now("jobs.tasks.cancel_job", job_id=job_id)
    return len(resend)


def _cancel_unsubmitted(job: Job) -> None:
    """A job cancelled while being submitted, whose dispatcher died: it may or may not have
    reached the scheduler. Ask by token, and cancel it there or end it here."""
    backend = backend_of(job.cluster)
    try:
        found = backend.find(job.token)
        if found:
            Job.objects.filter(pk=job.pk).update(backend_id=found)
            backend.cancel(found)
            return
    except BackendUnavailable:
        return  # the next sweep asks again
    reason = "cancelled before it reached the scheduler"
    job_finish(
        job_id=job.pk, status=JobStatus(backend_id="", state=JobState.CANCELLED, raw_state="", reason=reason)
    )
