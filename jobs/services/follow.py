"""Follow jobs in the scheduler, end them (step 5: charge, release, admit the next), cancel."""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from clusters.backends.base import (
    BackendError,
    BackendUnavailable,
    JobRef,
    JobStatus,
    LogTail,
)
from clusters.models import Cluster, Partition
from clusters.services import backend_of, cluster_mark_health
from jobs.models import Job, JobState
from jobs.services.common import _move, _send, log
from jobs.services.submit import jobs_admit
from jobs.states import ACTIVE_IN_SCHEDULER, END_STATES
from portal.core.errors import Conflict, Unavailable
from portal.core.services import audit_record
from tenants.services import grant_settle

# --- Follow


def jobs_poll(*, cluster_id: int) -> int:
    """One poll of one cluster for all its active jobs; returns how many changed state."""
    cluster = Cluster.objects.get(pk=cluster_id)
    active = Job.objects.filter(cluster=cluster, state__in=ACTIVE_IN_SCHEDULER).exclude(backend_id="")
    jobs = {row[0]: row[1:] for row in active.values_list("backend_id", "pk", "submitted_at", "state")}
    if not jobs:
        return 0
    try:
        statuses = backend_of(cluster).poll(sorted(jobs))
    except BackendUnavailable as exc:
        cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
        return 0
    if not cluster.healthy:
        cluster_mark_health(cluster=cluster, healthy=True, detail="answers")
    moved = sum(job_apply_status(job_id=jobs[bid][0], status=status) for bid, status in statuses.items())
    # Gone from the scheduler: a job we were cancelling is cancelled (Kubernetes forgets a
    # deleted Job); any other, past a grace period for the scheduler's bookkeeping to catch up,
    # is LOST. Either way its reservation and GPUs go back to the grant.
    grace = timezone.now() - timedelta(seconds=settings.JOB_LOST_GRACE_S)
    for backend_id, (pk, submitted_at, state) in jobs.items():
        if backend_id in statuses:
            continue
        if state == JobState.CANCELLING:
            gone = JobStatus(
                backend_id=backend_id, state=JobState.CANCELLED, raw_state="", reason="cancelled"
            )
        elif submitted_at and submitted_at < grace:
            gone = JobStatus(
                backend_id=backend_id, state=JobState.LOST, raw_state="", reason="unknown to the scheduler"
            )
        else:
            continue
        moved += job_finish(job_id=pk, status=gone)
    return moved


def job_apply_status(*, job_id: int, status: JobStatus) -> bool:
    """Follow what the scheduler says; an end state settles the job. True if the state moved."""
    if status.state in END_STATES:
        return job_finish(job_id=job_id, status=status)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in END_STATES:
            return False
        # A job being cancelled stays CANCELLING until the scheduler says it ended.
        moved = status.state != job.state and job.state != JobState.CANCELLING
        if moved:
            _move(job, status.state, reason=status.reason, raw_state=status.raw_state)
        elif job.state != JobState.CANCELLING:
            job.reason, job.raw_state = status.reason, status.raw_state  # e.g. Priority → Resources
        job.started_at = job.started_at or status.started_at
        job.node_list = status.node_list or job.node_list
        job.save()
    return moved


def job_finish(*, job_id: int, status: JobStatus | None, reject_reason: str = "") -> bool:
    """Any → an end state: charge the real GPU-hours (elapsed × GPUs) to the grant, release the
    reservation and the GPUs, record exit code and times, and admit the next waiting job."""
    with transaction.atomic():
        partition_id = Job.objects.values_list("partition_id", flat=True).get(pk=job_id)
        Partition.objects.select_for_update().get(pk=partition_id)  # lock order: partition → job → grant
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in END_STATES:
            return False
        now = timezone.now()
        if status is None:
            _move(job, JobState.REJECTED, reason=reject_reason)
        else:
            _move(job, status.state, reason=status.reason, raw_state=status.raw_state)
            job.exit_code = status.exit_code
            job.started_at = job.started_at or status.started_at
            job.node_list = status.node_list or job.node_list
        job.finished_at = (status.finished_at if status else None) or now
        elapsed_h = (
            Decimal(max(0.0, (job.finished_at - job.started_at).total_seconds()) / 3600)
            if job.started_at
            else 0
        )
        job.gpu_hours = (Decimal(elapsed_h) * job.gpus).quantize(Decimal("0.0001"))
        grant_settle(
            grant_id=job.grant_id,
            reserved_gpu_hours=job.reserved_gpu_hours,
            used_gpu_hours=job.gpu_hours,
            gpus=job.gpus if job.holds_gpus else 0,
        )
        job.holds_gpus, job.dispatch_lease_until = False, None
        job.save()
        transaction.on_commit(lambda: jobs_admit(partition_id=partition_id))
    return True


# --- Cancel


def job_cancel(*, actor: AbstractBaseUser | None, job: Job, reason: str = "") -> Job:
    """QUEUED → CANCELLED at once; SUBMITTING, PENDING or RUNNING → CANCELLING, and the
    scheduler is told (the poll confirms CANCELLED). An ended job is a conflict. The portal's
    own cleanup cancels with no actor and its reason (walltime_cap, idle_gpus, grant_ended…)."""
    reason = reason or f"cancelled by {actor.get_username()}"
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state in END_STATES:
            raise Conflict(f"Job {locked.pk} has already ended ({locked.state}).")
        audit_record(
            actor=actor,
            action="job.cancel",
            target=locked,
            tenant=job.tenant,
            data={"state": locked.state, "reason": reason},
        )
        if locked.state in (JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING):
            _move(locked, JobState.CANCELLING, reason=reason)
            locked.save(update_fields=["state", "reason", "raw_state"])
            if locked.backend_id:
                _send("jobs.tasks.cancel_job", job_id=locked.pk)
    if locked.state == JobState.QUEUED:
        job_finish(
            job_id=job.pk,
            status=JobStatus(
                backend_id="",
                state=JobState.CANCELLED,
                raw_state="",
                reason=reason,
            ),
        )
    return Job.objects.get(pk=job.pk)


def job_cancel_in_scheduler(*, job_id: int, backend_id: str = "") -> None:
    """Tell the scheduler to cancel a CANCELLING job, or the given scheduler job of a job that
    ended while it was being submitted; BackendUnavailable is retried by the task."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    if backend_id or (job.state == JobState.CANCELLING and job.backend_id):
        backend_of(job.cluster).cancel(backend_id or job.backend_id)


def job_log_tail(*, job: Job, lines: int) -> LogTail:
    """The last lines of the job's output; a scheduler that cannot be read answers Unavailable."""
    if not job.backend_id:
        return LogTail(lines=[], truncated=False)
    ref = JobRef(backend_id=job.backend_id, token=job.token, account=job.tenant.slug)
    try:
        return backend_of(job.cluster).log_tail(ref, lines=lines, max_bytes=settings.JOB_LOG_MAX_BYTES)
    except BackendError as exc:  # BackendUnavailable included
        log.warning("log of job %s unavailable: %s", job.pk, exc.__class__.__name__)
        raise Unavailable(f"The log of job {job.pk} cannot be read from {job.cluster.slug} now.") from None
