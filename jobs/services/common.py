"""What the job services share: recording a state move, enqueueing after commit."""

import logging

from celery import current_app
from django.db import transaction

from jobs.models import Job, JobEvent
from jobs.states import check_move

log = logging.getLogger("jobs.services")


def _send(task: str, **kwargs) -> None:
    """Enqueue after commit. By name: tasks import services, so services must not import tasks."""
    transaction.on_commit(lambda: _send_now(task, **kwargs))


def _send_now(task: str, **kwargs) -> None:
    current_app.send_task(task, kwargs=kwargs)


def _move(job: Job, to_state: str, *, reason: str = "", raw_state: str = "") -> None:
    """Change the job's state in memory and record the event; the caller saves the job."""
    check_move(job.state, to_state)
    JobEvent.objects.create(
        job=job, from_state=job.state, to_state=to_state, reason=reason, raw_state=raw_state
    )
    job.state, job.reason, job.raw_state = to_state, reason, raw_state or job.raw_state
