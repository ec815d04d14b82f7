"""Cancel a job: at once while it waits in the portal, through its scheduler once it is there."""

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from clusters.backends.base import JobStatus
from clusters.services import backend_of, cluster_check_available
from jobs.models import Job, JobState
from jobs.selectors import job_may_cancel
from jobs.services.common import job_move, send_after_commit
from jobs.services.finish import job_finish
from jobs.states import END_STATES
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
