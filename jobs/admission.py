"""Which waiting job runs next on a partition (DESIGN.md, Flow of one job, step 2).

Order: the tenant's tier, then the job's priority, then the tenant's recent GPU-hours (fair
share: usage decays by half every FAIR_SHARE_HALF_LIFE_DAYS, so a team that ran a lot last
month is not punished forever), then age. A job that does not fit the partition's free GPUs
stops the line, so that a large job is not starved by a stream of small ones; a job held back
by its own grant's concurrent limit (quota_wait) does not, since that limit is its tenant's
alone."""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from jobs.models import Job, JobState, Priority
from tenants.models import Tier

TIER_RANK = {Tier.CRITICAL: 0, Tier.HIGH: 1, Tier.NORMAL: 2, Tier.LOW: 3}
PRIORITY_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
FAIR_SHARE_WINDOW = timedelta(days=30)

QUOTA_WAIT = "quota_wait"
CAPACITY_WAIT = "capacity_wait"


def recent_usage(tenant_ids: set[int]) -> dict[int, Decimal]:
    """Decayed GPU-hours of each tenant over the last 30 days, from one grouped query."""
    now = timezone.now()
    rows = (
        Job.objects.filter(
            tenant_id__in=tenant_ids, finished_at__gte=now - FAIR_SHARE_WINDOW, gpu_hours__gt=0
        )
        .annotate(day=TruncDate("finished_at"))
        .values("tenant_id", "day")
        .annotate(hours=Sum("gpu_hours"))
    )
    half_life = settings.FAIR_SHARE_HALF_LIFE_DAYS
    usage = dict.fromkeys(tenant_ids, Decimal(0))
    for row in rows:
        age_days = (now.date() - row["day"]).days
        usage[row["tenant_id"]] += row["hours"] * Decimal(0.5 ** (age_days / half_life))
    return usage


def admission_order(jobs: list[Job]) -> list[Job]:
    """Waiting jobs in the order they get GPUs (their tenants must be loaded)."""
    usage = recent_usage({job.tenant_id for job in jobs})
    return sorted(
        jobs,
        key=lambda job: (
            TIER_RANK[job.tenant.tier],
            PRIORITY_RANK[job.priority],
            usage[job.tenant_id],
            job.created,
            job.id,
        ),
    )


def waiting_on(partition_id: int) -> list[Job]:
    return list(
        Job.objects.select_for_update(of=("self",))
        .filter(partition_id=partition_id, state=JobState.QUEUED, holds_gpus=False)
        .select_related("tenant")
    )


def gpus_held_on(partition_id: int) -> int:
    return Job.objects.filter(partition_id=partition_id, holds_gpus=True).aggregate(n=Sum("gpus"))["n"] or 0
