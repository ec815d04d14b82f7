"""What jobs cost: each run's charged GPU-hours at the prices in force while it ran
(billing/pricing.py), and so far for a running job. docs/cost-model.md explains it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.db.models import Prefetch
from django.utils import timezone

from billing.pricing import ZERO, Charge, Piece, PriceBook
from clusters.backends.base import JobState
from jobs.models import Job, JobAttempt

HOURS = Decimal("0.0001")


def attempts_prefetch() -> Prefetch:
    """What `pieces_of` reads of a job's earlier attempts, for a queryset's prefetch_related."""
    return Prefetch(
        "attempts",
        queryset=JobAttempt.objects.only("job_id", "number", "started_at", "gpu_hours", "gpu_hours_lost"),
    )


def rate_of(job: Job) -> Decimal:
    """Device-GPUs the job holds while it runs (clusters/shares.py)."""
    return job.gpus * job.device_fraction


def so_far(job: Job, now: datetime) -> Decimal:
    """GPU-hours a running job's current run has used up to now, at most what it reserved."""
    if job.state != JobState.RUNNING or job.started_at is None:
        return ZERO
    seconds = Decimal(max(0.0, (now - job.started_at).total_seconds()))
    return min(job.reserved_gpu_hours, (seconds / 3600 * rate_of(job)).quantize(HOURS))


def pieces_of(job: Job, *, now: datetime | None = None) -> list[Piece]:
    """Every run of the job with the GPU-hours it was charged: earlier attempts (less the work
    lost after their last checkpoint, which is given back), then the last run, or the current
    one so far."""
    rate, pieces, earlier = rate_of(job), [], ZERO
    for attempt in job.attempts.all():
        if attempt.number >= job.attempt:  # the last run's own row, recorded when it ended
            continue
        charged = attempt.gpu_hours - (attempt.gpu_hours_lost or ZERO)
        earlier += charged
        if attempt.started_at is not None and charged > 0:
            pieces.append(Piece(attempt.started_at, rate, charged))
    if job.started_at is None:
        return pieces
    if job.state == JobState.RUNNING:
        pieces.append(Piece(job.started_at, rate, so_far(job, now or timezone.now())))
    elif job.gpu_hours is not None and job.gpu_hours > earlier:
        pieces.append(Piece(job.started_at, rate, job.gpu_hours - earlier))
    return pieces


def charges_of(
    job: Job, book: PriceBook, *, now: datetime | None = None, cuts: Iterable[datetime] = ()
) -> list[Charge]:
    return book.charges(
        pieces_of(job, now=now), gpu_model_id=job.gpu_model_id, share=job.share, tier=job.tier, cuts=cuts
    )


def cost_of(job: Job, book: PriceBook, *, now: datetime | None = None) -> Decimal:
    """What the job has cost: all of it once ended, so far while it runs; exact, unrounded."""
    return sum((charge.cost for charge in charges_of(job, book, now=now)), ZERO)


def reserved_cost(job: Job, book: PriceBook, *, now: datetime) -> Decimal:
    """What the GPU-hours the job still holds in reserve would cost at today's prices: all it
    reserved while it waits, what it has not used yet while it runs."""
    left = job.reserved_gpu_hours - so_far(job, now)
    rate = book.rate_at(gpu_model_id=job.gpu_model_id, share=job.share, tier=job.tier, moment=now)
    return max(ZERO, left) * rate
