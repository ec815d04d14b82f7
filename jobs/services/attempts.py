"""What a job's stopped attempt kept (docs/architecture/lending.md): the last checkpoint it
reported in its log, and the GPU-hours it ran past it, which are lost work and not charged.

A job script prints `PORTAL_CHECKPOINT <unix seconds>` once a checkpoint is saved (the checkpoint
contract, README). After an attempt ends in a way it restarts from, its log is read once here;
the lost GPU-hours go back to the grant (and, while the job lives on, to its reservation, since
the next attempt runs that work again), so that the work is charged once."""

import re
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from clusters.backends.base import BackendError, BackendUnavailable, JobRef
from clusters.models import Partition
from clusters.services import backend_of
from jobs.models import Job, JobAttempt, JobState
from jobs.services.common import log
from jobs.states import END_STATES
from tenants.services import grant_for_update

CHECKPOINT_LINE = re.compile(r"^PORTAL_CHECKPOINT (\d{9,11})(?:\s|$)")
# The log's last lines read for markers: a job prints one per checkpoint, every few minutes.
REVIEW_LINES = 2000
# Attempts that end so lose work of the portal's or the cluster's doing: a preemption (a reclaim)
# and a failed node. A job's own failure is charged in full, whatever exit code restarts it: else
# a job could end each attempt with a chosen code and run free.
LOSING_STATES = frozenset({JobState.PREEMPTED, JobState.NODE_FAIL})


def last_checkpoint(lines: list[str], *, started_at: datetime, ended_at: datetime) -> datetime | None:
    """The latest checkpoint marker within the attempt's run, or None."""
    latest = None
    for line in lines:
        if match := CHECKPOINT_LINE.match(line.strip()):
            at = datetime.fromtimestamp(int(match[1]), tz=UTC)
            if started_at <= at <= ended_at and (latest is None or at > latest):
                latest = at
    return latest


def attempt_review(*, attempt_id: int) -> JobAttempt:
    """Read the attempt's log for its last checkpoint and give back what it lost: GPU-hours of
    its run after the checkpoint (all of it without one). Once per attempt; a log that cannot
    be read now is BackendUnavailable, which the task retries. An attempt that did not run, or
    ended otherwise (completed, cancelled, out of memory), lost nothing of the portal's doing."""
    attempt = JobAttempt.objects.select_related("job__tenant", "job__cluster").get(pk=attempt_id)
    if attempt.reviewed:
        return attempt
    job = attempt.job
    checkpoint = None
    if attempt.started_at and attempt.backend_id and attempt.end_state in LOSING_STATES:
        ref = JobRef(
            backend_id=attempt.backend_id, token=attempt.token, account=job.tenant.slug, user=job.cluster_user
        )
        try:
            tail = backend_of(job.cluster).log_tail(
                ref, lines=REVIEW_LINES, max_bytes=settings.JOB_LOG_MAX_BYTES
            )
        except BackendUnavailable:
            raise  # the task tries again
        except BackendError as exc:  # the log is gone: no checkpoint to be known
            log.info("attempt %s of job %s: its log cannot be read (%s)", attempt.number, job.pk, exc)
            tail = None
        if tail is not None:
            # a reclaimed attempt's pods may save until the end of their grace (Kubernetes)
            until = max(attempt.ended_at, attempt.stop_at or attempt.ended_at)
            checkpoint = last_checkpoint(tail.lines, started_at=attempt.started_at, ended_at=until)
    lost = Decimal(0)
    if attempt.started_at and attempt.end_state in LOSING_STATES:
        since = checkpoint or attempt.started_at
        seconds = Decimal(str(max(0.0, (attempt.ended_at - since).total_seconds())))
        lost = min(
            attempt.gpu_hours, (seconds / 3600 * job.gpus * job.device_fraction).quantize(Decimal("0.0001"))
        )
    _give_back(attempt, checkpoint=checkpoint, lost=lost)
    attempt.refresh_from_db()
    return attempt


def _give_back(attempt: JobAttempt, *, checkpoint: datetime | None, lost: Decimal) -> None:
    """Record the review and move the lost hours from the grant's used to the job's reservation
    (or, once the job has ended, off the grant's used). Lock order: partition → job → grant."""
    with transaction.atomic():
        partition_id = Job.objects.values_list("partition_id", flat=True).get(pk=attempt.job_id)
        Partition.objects.select_for_update(no_key=True).get(pk=partition_id)
        job = Job.objects.select_for_update().get(pk=attempt.job_id)
        locked = JobAttempt.objects.select_for_update().get(pk=attempt.pk)
        if locked.reviewed:
            return
        locked.reviewed, locked.checkpoint_at, locked.gpu_hours_lost = True, checkpoint, lost
        locked.save(update_fields=["reviewed", "checkpoint_at", "gpu_hours_lost"])
        if not lost:
            return
        grant = grant_for_update(grant_id=job.grant_id)
        lost = min(lost, grant.gpu_hours_used)
        grant.gpu_hours_used -= lost
        job.gpu_hours_lost += lost
        job.gpu_hours = max(Decimal(0), (job.gpu_hours or Decimal(0)) - lost)
        if job.state not in END_STATES:
            grant.gpu_hours_reserved += lost
            job.reserved_gpu_hours += lost
        grant.save(update_fields=["gpu_hours_used", "gpu_hours_reserved"])
        job.save(update_fields=["gpu_hours_lost", "gpu_hours", "reserved_gpu_hours"])
