"""What jobs cost: each run's charged GPU-hours at the prices in force while it ran
(billing/pricing.py), and so far for a running job. docs/cost-model.md explains it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Prefetch
from django.utils import timezone

from billing.pricing import ZERO, Charge, Piece, PriceBook
from clusters.backends.base import JobState
from jobs.models import Job, JobAttempt

HOURS = Decimal("0.0001")


@dataclass(frozen=True)
class Figures:
    """What a job's cost is computed from: a Job's fields, or the columns of its API answer row."""

    state: str
    started_at: datetime | None
    gpu_hours: Decimal | None
    reserved_gpu_hours: Decimal
    gpus: int
    device_fraction: Decimal
    attempt: int
    gpu_model_id: int
    share: str
    tier: str

    @classmethod
    def of(cls, job: Job | dict) -> Figures:
        if isinstance(job, dict):
            return cls(*(job[name] for name in FIGURE_COLUMNS))
        return cls(*(getattr(job, name) for name in FIGURE_COLUMNS))

    @property
    def rate(self) -> Decimal:
        """Device-GPUs the job holds while it runs (clusters/shares.py)."""
        return self.gpus * self.device_fraction


FIGURE_COLUMNS = (
    "state", "started_at", "gpu_hours", "reserved_gpu_hours", "gpus", "device_fraction", "attempt",
    "gpu_model_id", "share", "tier",
)  # fmt: skip


# A job that started and has not ended uses its GPUs: RUNNING, and CANCELLING until its
# scheduler confirms the end (which may take long while its cluster is unreachable).
USING_GPUS = (JobState.RUNNING, JobState.CANCELLING)


def so_far(job: Figures, now: datetime) -> Decimal:
    """GPU-hours a running job's current run has used up to now, at most what it reserved."""
    if job.state not in USING_GPUS or job.started_at is None:
        return ZERO
    seconds = Decimal(max(0.0, (now - job.started_at).total_seconds()))
    return min(job.reserved_gpu_hours, (seconds / 3600 * job.rate).quantize(HOURS))


def earlier_attempts(job_ids: Iterable[int]) -> dict[int, list[JobAttempt]]:
    """The recorded attempts of these jobs, in one query."""
    found = defaultdict(list)
    rows = JobAttempt.objects.filter(job_id__in=list(job_ids)).only(
        "job_id", "number", "started_at", "gpu_hours", "gpu_hours_lost"
    )
    for attempt in rows.order_by("number"):
        found[attempt.job_id].append(attempt)
    return found


def attempts_prefetch() -> Prefetch:
    """What `pieces_of` reads of a Job's earlier attempts, for a queryset's prefetch_related."""
    return Prefetch(
        "attempts",
        queryset=JobAttempt.objects.only("job_id", "number", "started_at", "gpu_hours", "gpu_hours_lost"),
    )


def pieces_of(
    job: Figures | Job, attempts: Iterable[JobAttempt] | None = None, *, now: datetime | None = None
) -> list[Piece]:
    """Every run of the job with the GPU-hours it was charged: earlier attempts (less the work
    lost after their last checkpoint, which is given back), then the last run, or the current
    one so far. A Job's attempts are its own (prefetch them: attempts_prefetch) unless given."""
    if isinstance(job, Job):
        attempts = job.attempts.all() if attempts is None else attempts
        job = Figures.of(job)
    attempts, now = attempts or (), now or timezone.now()
    rate, pieces, earlier = job.rate, [], ZERO
    for attempt in attempts:
        if attempt.number >= job.attempt:  # the last run's own row, recorded when it ended
            continue
        charged = attempt.gpu_hours - (attempt.gpu_hours_lost or ZERO)
        earlier += charged
        if attempt.started_at is not None and charged > 0:
            pieces.append(Piece(attempt.started_at, rate, charged))
    if job.started_at is None:
        return pieces
    if job.state in USING_GPUS:
        pieces.append(Piece(job.started_at, rate, so_far(job, now)))
    elif job.gpu_hours is not None and job.gpu_hours > earlier:
        pieces.append(Piece(job.started_at, rate, job.gpu_hours - earlier))
    return pieces


def charges_of(
    job: Figures | Job,
    book: PriceBook,
    *,
    attempts: Iterable[JobAttempt] | None = None,
    now: datetime | None = None,
    cuts: Iterable[datetime] = (),
) -> list[Charge]:
    """The job's pieces cut at each change of price and at `cuts` (billing/pricing.py)."""
    pieces = pieces_of(job, attempts, now=now)
    return book.charges(pieces, gpu_model_id=job.gpu_model_id, share=job.share, tier=job.tier, cuts=cuts)


def cost(charges: Iterable[Charge]) -> Decimal:
    return sum((charge.cost for charge in charges), ZERO)


def cost_of(job: Job, book: PriceBook, *, now: datetime | None = None) -> Decimal:
    """What one Job has cost (all of it once ended, so far while it runs), exact."""
    return cost(charges_of(job, book, now=now))


def reserved_cost(job: Figures | Job, book: PriceBook, *, now: datetime) -> Decimal:
    """What the GPU-hours the job still holds in reserve would cost at today's prices: all it
    reserved while it waits, what it has not used yet while it runs."""
    job = Figures.of(job) if isinstance(job, Job) else job
    left = job.reserved_gpu_hours - so_far(job, now)
    rate = book.rate_at(gpu_model_id=job.gpu_model_id, share=job.share, tier=job.tier, moment=now)
    return max(ZERO, left) * rate


def costs_of(jobs: Iterable[tuple[int, Job | dict]], *, now: datetime | None = None) -> dict[int, Decimal]:
    """Each job's cost by its id: all of it once ended, so far while it runs; exact, unrounded.
    Two queries whatever the number of jobs: the price list, and the attempts of restarted jobs."""
    now = now or timezone.now()
    figures = {pk: Figures.of(job) for pk, job in jobs}
    book = PriceBook.load()
    attempts = earlier_attempts(pk for pk, job in figures.items() if job.attempt > 1)
    return {
        pk: cost(charges_of(job, book, attempts=attempts.get(pk, ()), now=now)) for pk, job in figures.items()
    }


def estimate(*, gpu_model_id: int, share: str, tier: str, gpu_hours: Decimal) -> Decimal:
    """What GPU-hours about to be reserved would cost at today's prices: a submission's preview."""
    rate = PriceBook.load().rate_at(gpu_model_id=gpu_model_id, share=share, tier=tier, moment=timezone.now())
    return gpu_hours * rate
