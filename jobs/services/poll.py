"""Follow jobs in their scheduler (docs/architecture.md, the flow of a job, step 4): one poll
of a cluster reads every active job's state and writes only what changed; the ends go to
finish.py."""

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters.backends.base import BackendUnavailable, JobStatus
from clusters.breaker import cluster_slot
from clusters.models import Cluster
from clusters.services import backend_of, cluster_answered, cluster_available, cluster_mark_health
from jobs.models import Job, JobEvent, JobState
from jobs.services.common import last_event_times, moved_event, reported_at
from jobs.services.finish import jobs_finish
from jobs.states import ACTIVE_IN_SCHEDULER, END_STATES
from portal.core.metrics import poll_seconds, timed

POLL_TIME_LIMIT_S = 90  # jobs.tasks.poll_cluster's hard limit: the longest a poll holds a slot


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
            with timed(poll_seconds, cluster=cluster.slug):
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
        elif job.stop_at is not None:  # warned for its lender, and stopped (Kubernetes forgets it)
            gone = JobStatus(
                backend_id=backend_id, state=JobState.PREEMPTED, raw_state="", reason="reclaimed"
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
_FOLLOWED = ["pk", "backend_id", "submitted_at", "attempt", "stop_at", *_FOLLOWED_FIELDS]


def _values(job: Job) -> tuple:
    return tuple(getattr(job, name) for name in _FOLLOWED_FIELDS)


def _followed(job: Job, status: JobStatus, last_at: datetime | None = None) -> tuple:
    """The row's followed values once the (non-end) status is applied, without changing the job.
    A reported start is kept after the job's submission and its last event (`last_at`)."""
    if job.state in END_STATES:
        return _values(job)
    state, reason, raw_state = job.state, job.reason, job.raw_state
    if status.state != job.state and job.state != JobState.CANCELLING:
        state, reason, raw_state = status.state, status.reason, status.raw_state or job.raw_state
    elif job.state != JobState.CANCELLING:
        reason, raw_state = status.reason, status.raw_state  # e.g. Priority → Resources
    # A job being cancelled stays CANCELLING until the scheduler says it ended.
    after = max(filter(None, (job.submitted_at, last_at)), default=None)
    started_at = job.started_at or reported_at(status.started_at, after=after)
    return state, reason, raw_state, started_at, status.node_list or job.node_list


def jobs_apply_statuses(statuses: dict[int, JobStatus]) -> int:
    """Non-end statuses of many jobs, job id → status, in one transaction: the rows locked in id
    order, compared again under the lock, and only those that differ written, one UPDATE per
    set of new values (jobs that changed alike, e.g. a reason, share one). Returns how many
    moved to another state."""
    events, changed = [], defaultdict(list)
    starting = [
        pk for pk, status in statuses.items() if status.state == JobState.RUNNING and status.started_at
    ]
    with transaction.atomic():
        last_at = last_event_times(starting) if starting else {}
        for job in Job.objects.select_for_update().filter(pk__in=statuses).only(*_FOLLOWED).order_by("pk"):
            status = statuses[job.pk]
            if status.backend_id != job.backend_id:
                continue  # read before the job was queued again as its next attempt: not this one's
            values = _followed(job, status, last_at.get(job.pk))
            if values == _values(job):
                continue
            if values[0] != job.state:
                # a start at the scheduler's time (a restart after a requeue: its own), after the last event
                after = max(filter(None, (job.submitted_at, last_at.get(job.pk))), default=None)
                at = reported_at(status.started_at, after=after) if values[0] == JobState.RUNNING else None
                events.append(
                    moved_event(job, values[0], reason=status.reason, raw_state=status.raw_state, at=at)
                )
            changed[values].append(job.pk)
        JobEvent.objects.bulk_create(events)
        for values, pks in changed.items():
            Job.objects.filter(pk__in=pks).update(**dict(zip(_FOLLOWED_FIELDS, values, strict=True)))
    return len(events)
