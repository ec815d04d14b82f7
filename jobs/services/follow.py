"""Follow jobs in the scheduler, end them (step 5: charge, release, admit the next), cancel."""

from collections import defaultdict
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
from clusters.breaker import breaker_state, cluster_slot
from clusters.models import Cluster, Partition
from clusters.services import (
    backend_of,
    cluster_answered,
    cluster_available,
    cluster_check_available,
    cluster_mark_health,
)
from jobs.models import Job, JobEvent, JobState
from jobs.services.common import _move, _send, log
from jobs.services.submit import jobs_admit_soon
from jobs.states import ACTIVE_IN_SCHEDULER, END_STATES, check_move
from portal.core.errors import Conflict, Unavailable
from portal.core.services import audit_record
from tenants.services import grant_settle

# --- Follow

POLL_TIME_LIMIT_S = 90  # jobs.tasks.poll_cluster's hard limit: the longest a poll holds a slot


def moved_event(job: Job, to_state: str, *, reason: str = "", raw_state: str = "") -> JobEvent:
    """common._move for many jobs at once: the same check and change in memory, and the event
    returned unsaved for one bulk_create; the caller saves the jobs."""
    check_move(job.state, to_state)
    event = JobEvent(job=job, from_state=job.state, to_state=to_state, reason=reason, raw_state=raw_state)
    job.state, job.reason, job.raw_state = to_state, reason, raw_state or job.raw_state
    return event


def jobs_poll(*, cluster_id: int) -> int:
    """One poll of one cluster for all its active jobs (one backend.poll: for Slurm one squeue
    and one sacct); returns how many changed state. What the scheduler says is compared with
    what the jobs' rows hold, and only the jobs it changes are written: in one transaction, and
    the ends in one per partition (jobs_finish)."""
    cluster = Cluster.objects.get(pk=cluster_id)
    active = Job.objects.filter(cluster=cluster, state__in=ACTIVE_IN_SCHEDULER).exclude(backend_id="")
    jobs = {job.backend_id: job for job in active.only(*_FOLLOWED)}
    if not jobs:
        return 0
    # A cluster whose breaker is open, or whose worker slots are all taken, is not asked: its
    # jobs stay as they are until a later poll (clusters/breaker.py).
    if not cluster_available(cluster=cluster):
        return 0
    with cluster_slot(cluster_id=cluster.pk, hold_s=POLL_TIME_LIMIT_S) as slot:
        if not slot:
            return 0
        try:
            statuses = backend_of(cluster).poll(sorted(jobs))
        except BackendUnavailable as exc:
            cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
            return 0
    if not cluster.healthy:
        cluster_mark_health(cluster=cluster, healthy=True, detail="answers")
    else:
        cluster_answered(cluster=cluster)
    ended = {jobs[bid].pk: status for bid, status in statuses.items() if status.state in END_STATES}
    changed = {
        jobs[bid].pk: status
        for bid, status in statuses.items()
        if status.state not in END_STATES and _followed(jobs[bid], status) != _values(jobs[bid])
    }
    moved = jobs_apply_statuses(changed) if changed else 0
    # Gone from the scheduler: a job we were cancelling is cancelled (Kubernetes forgets a
    # deleted Job); any other, past a grace period for the scheduler's bookkeeping to catch up,
    # is LOST. Either way its reservation and GPUs go back to the grant.
    grace = timezone.now() - timedelta(seconds=settings.JOB_LOST_GRACE_S)
    for backend_id, job in jobs.items():
        if backend_id in statuses:
            continue
        if job.state == JobState.CANCELLING:
            gone = JobStatus(
                backend_id=backend_id, state=JobState.CANCELLED, raw_state="", reason="cancelled"
            )
        elif job.submitted_at and job.submitted_at < grace:
            gone = JobStatus(
                backend_id=backend_id, state=JobState.LOST, raw_state="", reason="unknown to the scheduler"
            )
        else:
            continue
        ended[job.pk] = gone
    return moved + (jobs_finish(ended) if ended else 0)


# What following a job may change in its row, besides the ends that jobs_finish records.
_FOLLOWED_FIELDS = ["state", "reason", "raw_state", "started_at", "node_list"]
_FOLLOWED = ["pk", "backend_id", "submitted_at", *_FOLLOWED_FIELDS]


def _values(job: Job) -> tuple:
    return tuple(getattr(job, name) for name in _FOLLOWED_FIELDS)


def _followed(job: Job, status: JobStatus) -> tuple:
    """The row's followed values once the (non-end) status is applied, without changing the job."""
    if job.state in END_STATES:
        return _values(job)
    state, reason, raw_state = job.state, job.reason, job.raw_state
    if status.state != job.state and job.state != JobState.CANCELLING:
        state, reason, raw_state = status.state, status.reason, status.raw_state or job.raw_state
    elif job.state != JobState.CANCELLING:
        reason, raw_state = status.reason, status.raw_state  # e.g. Priority → Resources
    # A job being cancelled stays CANCELLING until the scheduler says it ended.
    return state, reason, raw_state, job.started_at or status.started_at, status.node_list or job.node_list


def job_apply_status(*, job_id: int, status: JobStatus) -> bool:
    """Follow what the scheduler says; an end state settles the job. True if the state moved."""
    if status.state in END_STATES:
        return job_finish(job_id=job_id, status=status)
    return bool(jobs_apply_statuses({job_id: status}))


def jobs_apply_statuses(statuses: dict[int, JobStatus]) -> int:
    """Non-end statuses of many jobs, job id → status, in one transaction: the rows locked in id
    order, compared again under the lock, and only those that differ written, one UPDATE per
    set of new values (jobs that changed alike, e.g. a reason, share one). Returns how many
    moved to another state."""
    events, changed = [], defaultdict(list)
    with transaction.atomic():
        for job in Job.objects.select_for_update().filter(pk__in=statuses).only(*_FOLLOWED).order_by("pk"):
            status = statuses[job.pk]
            values = _followed(job, status)
            if values == _values(job):
                continue
            if values[0] != job.state:
                events.append(moved_event(job, values[0], reason=status.reason, raw_state=status.raw_state))
            changed[values].append(job.pk)
        JobEvent.objects.bulk_create(events)
        for values, pks in changed.items():
            Job.objects.filter(pk__in=pks).update(**dict(zip(_FOLLOWED_FIELDS, values, strict=True)))
    return len(events)


def job_finish(*, job_id: int, status: JobStatus | None, reject_reason: str = "") -> bool:
    """Any → an end state: charge the real GPU-hours (elapsed × GPUs) to the grant, release the
    reservation and the GPUs, record exit code and times, and admit the next waiting job.
    `status` None: the scheduler refused the job (REJECTED, reject_reason)."""
    partition_id = Job.objects.values_list("partition_id", flat=True).get(pk=job_id)
    return bool(_finish(partition_id, {job_id: (status, reject_reason)}))


def jobs_finish(statuses: dict[int, JobStatus]) -> int:
    """job_finish for many jobs (job id → end status): one transaction per partition, its grants
    settled once each, one admission pass after. Returns how many ended here (not before)."""
    ends: dict[int, dict[int, tuple[JobStatus | None, str]]] = defaultdict(dict)
    for pk, partition_id in Job.objects.filter(pk__in=statuses).values_list("pk", "partition_id"):
        ends[partition_id][pk] = (statuses[pk], "")
    return sum(_finish(partition_id, ends[partition_id]) for partition_id in sorted(ends))


# What an end changes in a job's row.
_FINISHED_FIELDS = [
    *("state", "reason", "raw_state", "exit_code", "started_at", "node_list", "finished_at"),
    *("gpu_hours", "holds_gpus", "dispatch_lease_until"),
]


def _finish(partition_id: int, ends: dict[int, tuple[JobStatus | None, str]]) -> int:
    """The ends of jobs of one partition. Lock order: partition → jobs (by id) → grants (by id)."""
    with transaction.atomic():
        Partition.objects.select_for_update(no_key=True).get(pk=partition_id)
        jobs = list(Job.objects.select_for_update().filter(pk__in=ends).order_by("pk"))
        now = timezone.now()
        events, ended = [], []
        settle: dict[int, list] = defaultdict(lambda: [Decimal(0), Decimal(0), 0])  # reserved, used, GPUs
        for job in jobs:
            if job.state in END_STATES:
                continue
            status, reject_reason = ends[job.pk]
            if status is None:
                events.append(moved_event(job, JobState.REJECTED, reason=reject_reason))
            else:
                events.append(
                    moved_event(job, status.state, reason=status.reason, raw_state=status.raw_state)
                )
                job.exit_code = status.exit_code
                job.started_at = job.started_at or status.started_at
                job.node_list = status.node_list or job.node_list
            job.finished_at = (status.finished_at if status else None) or now
            elapsed_s = (job.finished_at - job.started_at).total_seconds() if job.started_at else 0.0
            job.gpu_hours = (Decimal(max(0.0, elapsed_s) / 3600) * job.gpus).quantize(Decimal("0.0001"))
            grant = settle[job.grant_id]
            grant[0] += job.reserved_gpu_hours
            grant[1] += min(job.gpu_hours, job.reserved_gpu_hours)  # as grant_settle charges each job
            grant[2] += job.gpus if job.holds_gpus else 0
            job.holds_gpus, job.dispatch_lease_until = False, None
            ended.append(job)
        for grant_id in sorted(settle):
            reserved, used, gpus = settle[grant_id]
            grant_settle(grant_id=grant_id, reserved_gpu_hours=reserved, used_gpu_hours=used, gpus=gpus)
        JobEvent.objects.bulk_create(events)
        # batches of 100: each field's CASE names every job of its batch, and PostgreSQL tries
        # them in turn for every row
        Job.objects.bulk_update(ended, _FINISHED_FIELDS, batch_size=100)
        if ended:
            transaction.on_commit(lambda: jobs_admit_soon(partition_id=partition_id))
    return len(ended)


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
        cluster_check_available(cluster=job.cluster)  # an open breaker: retried without a wait on SSH
        backend_of(job.cluster).cancel(backend_id or job.backend_id, user=job.cluster_user)


def job_log_tail(*, job: Job, lines: int) -> LogTail:
    """The last lines of the job's output; a scheduler that cannot be read answers Unavailable."""
    if not job.backend_id:
        return LogTail(lines=[], truncated=False)
    ref = JobRef(backend_id=job.backend_id, token=job.token, account=job.tenant.slug, user=job.cluster_user)
    if breaker_state(cluster_id=job.cluster_id).cooling:  # a request must not wait on a cluster that hangs
        raise Unavailable(f"The log of job {job.pk} cannot be read from {job.cluster.slug} now.")
    try:
        return backend_of(job.cluster).log_tail(ref, lines=lines, max_bytes=settings.JOB_LOG_MAX_BYTES)
    except BackendError as exc:  # BackendUnavailable included
        log.warning("log of job %s unavailable: %s", job.pk, exc.__class__.__name__)
        raise Unavailable(f"The log of job {job.pk} cannot be read from {job.cluster.slug} now.") from None
