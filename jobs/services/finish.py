"""The end of a job (docs/architecture.md, the flow of a job, step 5): charge the GPU-hours it
used, release its reservation and GPUs, and let admission give them to the next waiting job."""

from collections import defaultdict
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters.backends.base import JobStatus
from clusters.models import Partition
from clusters.selectors import catalog_names
from jobs.models import Job, JobAttempt, JobEvent, JobState, new_token
from jobs.services.admission import jobs_admit_soon
from jobs.services.common import (
    COUNTDOWN_MAX_S,
    last_event_times,
    moved_event,
    reported_at,
    send_after_commit,
    unseen_start_event,
)
from jobs.services.lending import loans_end
from jobs.states import END_STATES
from portal.core.metrics import jobs_ended
from tenants.services import grant_settle


def job_finish(*, job_id: int, status: JobStatus | None, reject_reason: str = "") -> bool:
    """Any → an end state: charge the real GPU-hours (elapsed × GPUs × each one's device
    fraction) to the grant, release the
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
    """The ends of jobs of one partition. Lock order: partition → jobs (by id) → grants (by id).
    A job whose attempt ended in a way it restarts from (restart_due) is not ended: it is
    QUEUED again as its next attempt (_requeue)."""
    with transaction.atomic():
        Partition.objects.select_for_update(no_key=True).get(pk=partition_id)
        jobs = list(Job.objects.select_for_update().filter(pk__in=ends).order_by("pk"))
        now = timezone.now()
        last_at = last_event_times([job.pk for job in jobs])
        events, ended, requeued, attempts = [], [], [], []
        settle: dict[int, list] = defaultdict(lambda: [Decimal(0), Decimal(0), 0])  # reserved, used, GPUs
        # an end already recorded, or an earlier attempt's, read before the job was queued again
        jobs = [job for job in jobs if job.state not in END_STATES and not _stale(job, ends[job.pk][0])]
        # the loans of the jobs that end or wait again go back to their lenders' grants
        for grant_id, gpus in loans_end([job.pk for job in jobs], now=now).items():
            settle[grant_id][2] += gpus
        for job in jobs:
            status, reject_reason = ends[job.pk]
            if (
                status is not None
                and job.stop_at is not None
                and job.state != JobState.CANCELLING  # a cancel asked for during the grace is one
                and status.state != JobState.COMPLETED
            ):
                # warned and stopped for its lender (lending.py): however the scheduler ended it
                status = replace(status, state=JobState.PREEMPTED, reason="reclaimed by its lender")
            ended_at = None
            if status is None:
                events.append(moved_event(job, JobState.REJECTED, reason=reject_reason))
            else:
                after = max(filter(None, (job.submitted_at, last_at.get(job.pk))), default=None)
                started = reported_at(status.started_at, after=after)
                job.started_at = job.started_at or started
                unseen = (
                    unseen_start_event(job, started, after=after)
                    if status.state != JobState.REJECTED
                    else None
                )
                if unseen is not None:
                    events.append(unseen)
                    after = unseen.at
                ended_at = reported_at(status.finished_at, after=after)
                job.exit_code = status.exit_code
                job.node_list = status.node_list or job.node_list
            finished_at = (ended_at if status else None) or now  # as its end event says
            elapsed_s = (finished_at - job.started_at).total_seconds() if job.started_at else 0.0
            # device-equivalent: units × what each counts of a device (clusters/shares.py)
            hours = (Decimal(str(max(0.0, elapsed_s))) / 3600 * job.gpus * job.device_fraction).quantize(
                Decimal("0.0001")
            )
            charge = min(hours, job.reserved_gpu_hours)  # as grant_settle charges each job
            grant = settle[job.grant_id]
            grant[2] += job.gpus - job.gpus_borrowed if job.holds_gpus else 0
            if status is not None and restart_due(job, status, charge=charge):
                attempts.append(_attempt(job, status, ended_at=finished_at, gpu_hours=charge))
                grant[0] += charge  # the rest stays reserved for the next attempt
                grant[1] += charge
                events.append(_requeue(job, status, charge=charge, at=finished_at, now=now))
                requeued.append(job)
                continue
            if job.attempt > 1 or job.max_restarts:
                attempts.append(_attempt(job, status, ended_at=finished_at, gpu_hours=charge))
            if status is not None:  # a refusal's event is recorded above
                events.append(
                    moved_event(
                        job, status.state, reason=status.reason, raw_state=status.raw_state, at=ended_at
                    )
                )
            job.finished_at = finished_at
            job.gpu_hours = (job.gpu_hours or 0) + hours
            grant[0] += job.reserved_gpu_hours
            grant[1] += charge
            job.holds_gpus, job.dispatch_lease_until, job.gpus_borrowed = False, None, 0
            ended.append(job)
        for grant_id in sorted(settle):
            reserved, used, gpus = settle[grant_id]
            grant_settle(grant_id=grant_id, reserved_gpu_hours=reserved, used_gpu_hours=used, gpus=gpus)
        JobEvent.objects.bulk_create(events)
        JobAttempt.objects.bulk_create(attempts)
        # batches of 100: each field's CASE names every job of its batch, and PostgreSQL tries
        # them in turn for every row
        Job.objects.bulk_update(ended, _FINISHED_FIELDS, batch_size=100)
        Job.objects.bulk_update(requeued, _REQUEUED_FIELDS, batch_size=100)
        if ended or requeued:
            transaction.on_commit(lambda: jobs_admit_soon(partition_id=partition_id))
        if ended:
            transaction.on_commit(lambda: _count_ends(ended))
        for attempt in attempts:
            if attempt.end_state != JobState.COMPLETED:
                send_after_commit("jobs.tasks.review_attempt", attempt_id=attempt.pk)
        if requeued:
            _admit_after_backoff(partition_id, min(job.restart_after for job in requeued) - now)
    return len(ended)


def _stale(job: Job, status: JobStatus | None) -> bool:
    """A status of another scheduler job than the job's current attempt's (the portal's own,
    for a job not yet submitted, name none)."""
    return status is not None and bool(status.backend_id) and status.backend_id != job.backend_id


# The scheduler's ends that a job comes back from, up to its max_restarts: its node failed, or
# it was preempted; FAILED too where its submitter named the exit code.
RESTART_STATES = frozenset({JobState.PREEMPTED, JobState.NODE_FAIL})


def restart_due(job: Job, status: JobStatus, *, charge: Decimal) -> bool:
    """Whether the attempt that ended so comes back as the next: restarts left, not a cancel
    someone asked for, a state to restart from, and GPU-hours reserved for a minute more."""
    if job.restarts_left <= 0 or job.state == JobState.CANCELLING:
        return False
    if status.state not in RESTART_STATES and not (
        status.state == JobState.FAILED and status.exit_code in job.exit_codes_to_restart
    ):
        return False
    return job.reserved_gpu_hours - charge >= job.gpus * job.device_fraction / 60


def _attempt(job: Job, status: JobStatus | None, *, ended_at, gpu_hours: Decimal) -> JobAttempt:
    return JobAttempt(
        job=job, number=job.attempt, backend_id=job.backend_id, token=job.token, node_list=job.node_list,
        started_at=job.started_at, ended_at=ended_at, stop_at=job.stop_at,
        end_state=status.state if status is not None else JobState.REJECTED,
        reason=(status.reason if status is not None else "")[:200],
        exit_code=status.exit_code if status is not None else None, gpu_hours=gpu_hours,
    )  # fmt: skip


def _requeue(job: Job, status: JobStatus, *, charge: Decimal, at, now) -> JobEvent:
    """The job back to QUEUED as its next attempt: charged what this one used, its reservation
    kept for the rest (the next attempt's walltime is what it covers: dispatch.spec_of), a new
    token for the scheduler, and a backoff before admission takes it (restart_after)."""
    backoff = min(settings.JOB_RESTART_BACKOFF_S * 2 ** (job.attempt - 1), settings.JOB_RESTART_BACKOFF_MAX_S)
    reason = f"{status.state.lower()}: attempt {job.attempt + 1} of {job.max_restarts + 1} queued"
    event = moved_event(
        job, JobState.QUEUED, reason=reason, raw_state=status.raw_state or status.state, at=at
    )
    job.reserved_gpu_hours -= charge
    job.gpu_hours = (job.gpu_hours or 0) + charge
    job.attempt += 1
    # a reclaimed attempt's pods may run to the end of their grace (Kubernetes forgets the Job at
    # once): the next attempt, which shares their checkpoint directory, starts after them
    job.restart_after = max(now + timedelta(seconds=backoff), job.stop_at or now)
    job.token, job.backend_id, job.submitted_at, job.started_at, job.stop_at = (
        new_token(),
        "",
        None,
        None,
        None,
    )
    job.holds_gpus, job.gpus_borrowed, job.dispatch_attempts, job.dispatch_lease_until = False, 0, 0, None
    return event


def _admit_after_backoff(partition_id: int, wait: timedelta) -> None:
    """An admission pass once the first backoff is over (the sweep's pass each minute takes a
    job whose longer backoff is over)."""
    countdown = min(COUNTDOWN_MAX_S, max(1, int(wait.total_seconds()) + 1))
    send_after_commit("jobs.tasks.admit_partition", countdown=countdown, partition_id=partition_id)


_REQUEUED_FIELDS = [
    *("state", "reason", "raw_state", "exit_code", "node_list", "attempt", "token", "backend_id"),
    *("submitted_at", "started_at", "stop_at", "holds_gpus", "gpus_borrowed", "dispatch_attempts"),
    *("dispatch_lease_until", "restart_after", "reserved_gpu_hours", "gpu_hours"),
]


def _count_ends(jobs: list[Job]) -> None:
    """portal_jobs_ended_total, once the ends are committed."""
    clusters = catalog_names(jobs).cluster  # the process's copy: no query once it is read
    for job in jobs:
        jobs_ended.labels(clusters[job.cluster_id], job.state).inc()
