"""What the job services share: recording a state move, enqueueing after commit."""

import logging
from datetime import datetime

from celery import current_app
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from kombu.exceptions import OperationalError

from jobs.models import Job, JobEvent, JobState
from jobs.states import check_move

log = logging.getLogger("jobs.services")

# The longest countdown a task is sent with: well within the broker's visibility timeout
# (BROKER_VISIBILITY_TIMEOUT_S, an hour), past which Redis would deliver it again. A longer wait
# is the sweep's, each minute (a restart's backoff, a reclaimed job's stop).
COUNTDOWN_MAX_S = 600


def send_after_commit(task: str, *, countdown: int | None = None, **kwargs) -> None:
    """Enqueue after commit. By name: tasks import services, so services must not import tasks.
    A broker that is down costs the message, not the request: what was committed stays, and
    the sweep re-sends it from the database once the broker is back (docs/architecture.md,
    the flow of a job, step 6)."""

    def send() -> None:
        try:
            send_now(task, countdown=countdown, **kwargs)
        except OperationalError as exc:
            log.warning("broker unreachable, %s(%s) left to the sweep: %s", task, kwargs, exc)

    transaction.on_commit(send)


def send_now(task: str, *, countdown: int | None = None, **kwargs) -> None:
    """Enqueue now (`countdown`: to run that many seconds later).

    ignore_result: nobody waits for these. Outside a worker, Celery would otherwise subscribe
    to the result backend before publishing, which with Redis down blocks for ~20 s and then
    leaves the process's result consumer broken until it restarts."""
    current_app.send_task(task, kwargs=kwargs, countdown=countdown, ignore_result=True)


def job_move(job: Job, to_state: str, *, reason: str = "", raw_state: str = "") -> None:
    """Change the job's state in memory and record the event; the caller saves the job."""
    JobEvent.objects.create(job=job, **_moved(job, to_state, reason=reason, raw_state=raw_state))


def moved_event(
    job: Job, to_state: str, *, reason: str = "", raw_state: str = "", at: datetime | None = None
) -> JobEvent:
    """job_move for many jobs at once: the same check and change in memory, and the event
    returned unsaved for one bulk_create; the caller saves the jobs. `at`: when the scheduler
    says it happened (reported_at), else now."""
    event = JobEvent(job=job, **_moved(job, to_state, reason=reason, raw_state=raw_state))
    if at is not None:
        event.at = at
    return event


def reported_at(when: datetime | None, *, after: datetime | None) -> datetime | None:
    """A time the scheduler reported, kept within the job's timeline: not before the event it
    follows (`after`; a scheduler's clock may run behind the portal's, and the local cluster
    starts a job a moment before its submission is recorded), not in the future. A job's
    started_at is its start event's time, so the two never disagree."""
    if when is None:
        return None
    return max(after, min(when, timezone.now())) if after else min(when, timezone.now())


def unseen_start_event(job: Job, started_at: datetime | None, *, after: datetime | None) -> JobEvent | None:
    """The RUNNING event of a start that no poll saw (a job that started and ended between two
    polls; a requeued job's restart and end), at the start the scheduler reports, kept after
    the job's last event (`after`): so the timeline tells that it ran. None when the job is
    RUNNING here already, or no start is reported."""
    if started_at is None or job.state not in (JobState.SUBMITTING, JobState.PENDING):
        return None
    return moved_event(job, JobState.RUNNING, reason="started", at=reported_at(started_at, after=after))


def last_event_times(job_ids) -> dict[int, datetime]:
    """The time of each job's latest event: what a time the scheduler reports is kept after."""
    rows = JobEvent.objects.filter(job_id__in=job_ids).values("job_id").annotate(last=Max("at"))
    return dict(rows.values_list("job_id", "last"))


def _moved(job: Job, to_state: str, *, reason: str, raw_state: str) -> dict:
    check_move(job.state, to_state)
    event = {"from_state": job.state, "to_state": to_state, "reason": reason, "raw_state": raw_state}
    event["attempt"] = job.attempt
    job.state, job.reason, job.raw_state = to_state, reason, raw_state or job.raw_state
    return event
