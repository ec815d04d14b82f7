"""Which waiting job runs next on a partition (DESIGN.md, Flow of one job, step 2).

Order: the tenant's tier, then the job's priority, then the tenant's recent GPU-hours (fair
share: usage decays by half every FAIR_SHARE_HALF_LIFE_DAYS, so a team that ran a lot last
month is not punished forever), then age. A job that does not fit the partition's free GPUs
stops the line, so that a large job is not starved by a stream of small ones; a job held back
by its own grant's concurrent limit (quota_wait) does not, since that limit is its tenant's
alone."""

import contextlib
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
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


# Fair-share usage moves by the day; a pass may read a tenant's from a minute ago.
FAIR_SHARE_CACHE_S = 60


def recent_usage(tenant_ids: set[int]) -> dict[int, Decimal]:
    """Decayed GPU-hours of each tenant over the last 30 days: from the cache where a pass of
    the last minute computed it, the others from one grouped query. A queue of thousands makes
    a pass after every job's end, and the query over a month of jobs was most of its cost."""
    keys = {f"admission:fair-share:{tenant_id}": tenant_id for tenant_id in tenant_ids}
    try:
        usage = {keys[key]: value for key, value in cache.get_many(list(keys)).items()}
    except Exception:  # the cache's own errors (Redis down) differ by backend: compute them all
        usage = {}
    if missing := tenant_ids - usage.keys():
        computed = _recent_usage(missing)
        usage |= computed
        with contextlib.suppress(Exception):
            cache.set_many({f"admission:fair-share:{k}": v for k, v in computed.items()}, FAIR_SHARE_CACHE_S)
    return usage


def _recent_usage(tenant_ids: set[int]) -> dict[int, Decimal]:
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
    """Waiting jobs in the order they get GPUs (their tenants must be loaded). Usage is read only
    when the line holds more than one tenant: it orders tenants, never one tenant's own jobs."""
    tenant_ids = {job.tenant_id for job in jobs}
    usage = recent_usage(tenant_ids) if len(tenant_ids) > 1 else dict.fromkeys(tenant_ids, Decimal(0))
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
    """The partition's waiting jobs, with what admission reads of them. Not locked row by row:
    every change to a waiting job (admission, an end, a cleanup) holds the partition's lock, and
    locking a queue of thousands on every pass cost more than the pass."""
    return list(
        Job.objects.filter(partition_id=partition_id, state=JobState.QUEUED, holds_gpus=False)
        .select_related("tenant")
        .only(*WAITING_FIELDS)
    )


WAITING_FIELDS = (
    *("id", "grant_id", "gpus", "priority", "created", "reason", "holds_gpus", "state", "partition_id"),
    *("tenant__tier", "tenant__state", "tenant__slug"),
)


def gpus_held_on(partition_id: int) -> int:
    return Job.objects.filter(partition_id=partition_id, holds_gpus=True).aggregate(n=Sum("gpus"))["n"] or 0
