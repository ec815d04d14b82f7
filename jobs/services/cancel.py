"""Cancel a job: at once while it waits in the portal, through its scheduler once it is there."""

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from clusters.backends.base import JobStatus
from clusters.services import backend_of, cluster_check_available
from jobs.models import Job, JobState
from jobs.selectors import job_may_cancel
from jobs.services.common import COUNTDOWN_MAX_S, job_move, send_after_commit, send_now
from jobs.services.finish import job_finish
from jobs.states import ACTIVE_IN_SCHEDULER, END_STATES
from portal.core.errors import Conflict, Forbidden
from portal.core.services import audit_record


def job_cancel(*, actor: AbstractBaseUser | None, job: Job, reason: str = "") -> Job:
    """QUEUED → CANCELLED at once; SUBMITTING, PENDING or RUNNING → CANCELLING, and the
    scheduler is told (the poll confirms CANCELLED). Members cancel their own jobs, owners and
    managers any of their tenant's, staff with `jobs.change_job` any (jobs.selectors.
    job_may_cancel): anyone else who can see the job is Forbidden. An ended job is a conflict.
    The portal's own cleanup cancels with no actor and its reason (walltime_cap, idle_gpus,
    grant_ended…)."""
    if actor is not None and not job_may_cancel(user=actor, job=job):
        raise Forbidden("Your role allows cancelling only your own jobs.")
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
            job_move(locked, JobState.CANCELLING, reason=reason)
            locked.save(update_fields=["state", "reason", "raw_state"])
            if locked.backend_id:
                send_after_commit("jobs.tasks.cancel_job", job_id=locked.pk)
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
        cluster_check_available(cluster=job.cluster)  # an open breaker: retried without a wait on SSH
        backend_of(job.cluster).cancel(backend_id or job.backend_id, user=job.cluster_user)


def job_warn(*, job_id: int, attempt: int | None = None) -> None:
    """A job reclaimed by its lender (jobs/services/lending.py, stop_at set): warn it, so that
    it saves its checkpoint (Backend.warn: Slurm USR1, Kubernetes and local SIGTERM), and stop
    it once its grace is out (job_stop, sent for then; a grace longer than a task may wait is
    the sweep's, jobs_stop_overdue). One that has not started yet is stopped at once: it has
    nothing to save. `attempt`: the attempt reclaimed; a later one is not this message's.
    BackendUnavailable is retried by the task."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    if job.stop_at is None or job.state not in (JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING):
        return
    if attempt is not None and attempt != job.attempt:
        return
    if not job.backend_id:
        return  # still being submitted: the sweep stops it once it has an id (jobs_stop_overdue)
    cluster_check_available(cluster=job.cluster)
    left = max(0, int((job.stop_at - timezone.now()).total_seconds()))
    if job.state == JobState.RUNNING and left:
        backend_of(job.cluster).warn(job.backend_id, user=job.cluster_user, grace_s=left)
        if left <= COUNTDOWN_MAX_S:
            send_now("jobs.tasks.stop_job", job_id=job.pk, attempt=job.attempt, countdown=left)
    else:
        job_stop(job_id=job.pk)


def job_stop(*, job_id: int, attempt: int | None = None) -> None:
    """A warned job whose grace is out: cancelled in its scheduler; the poll sees it end and
    finish.py queues its next attempt (or ends it PREEMPTED when none is left)."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    if job.stop_at is None or job.state in END_STATES or not job.backend_id:
        return
    early = timezone.now() < job.stop_at - timedelta(seconds=1)  # a message delivered again
    if (attempt is not None and attempt != job.attempt) or early:
        return  # a later attempt's, or early: its own stop or the sweep's comes
    cluster_check_available(cluster=job.cluster)
    backend_of(job.cluster).cancel(job.backend_id, user=job.cluster_user)


def jobs_stop_overdue() -> int:
    """The sweep's part: warned jobs still in their scheduler a minute past their stop (a stop
    message lost, or an id that came after the warning): stopped now. Returns how many."""
    overdue = Job.objects.filter(
        stop_at__lt=timezone.now() - timedelta(seconds=60), state__in=ACTIVE_IN_SCHEDULER
    ).exclude(backend_id="")
    rows = list(overdue.values_list("pk", "attempt"))
    for job_id, attempt in rows:
        send_now("jobs.tasks.stop_job", job_id=job_id, attempt=attempt)
    return len(rows)
