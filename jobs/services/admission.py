"""Admission: who may start now on a partition, in which order, holding which grant's GPUs
(docs/architecture.md, the flow of a job, step 2). Submit, the ends of jobs and dispatch stand
on it; it stands on no other service of jobs.

Order: the tenant's tier, then the job's priority, then the tenant's recent GPU-hours (fair
share: usage decays by half every FAIR_SHARE_HALF_LIFE_DAYS, so a team that ran a lot last
month is not punished forever), then age. A job that does not fit the partition's free GPUs
stops the line, so that a large job is not starved by a stream of small ones; a job held back
by its own grant's concurrent limit (quota_wait) does not, since that limit is its tenant's
alone.

Locks are taken in one order, the partition first and several grants in id order, so that
submission, admission and settlement never deadlock: an end locks partition → jobs → grants;
admission locks partition → grants and then writes the waiting jobs, which nobody locks without
the partition's lock (a submission inserts its job and locks only its grant). Partition and
grant rows are locked FOR NO KEY UPDATE: admission and the ledger still serialise on them, and
a submission may meanwhile insert a job that refers to them (the foreign key's check takes FOR
KEY SHARE, which a plain FOR UPDATE would make wait)."""

import contextlib
from datetime import date, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import DecimalField, F, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone
from kombu.exceptions import OperationalError

from clusters.models import Partition
from jobs.models import PRIORITY_ORDER, Job, JobState, Loan
from jobs.services.common import log, send_after_commit, send_now
from jobs.services.lending import LendingPool, lending_pool, loans_end, open_loan_grants
from tenants.models import QuotaGrant, TenantState, Tier
from tenants.services import grant_settle, grant_take_gpus

TIER_RANK = {Tier.CRITICAL: 0, Tier.HIGH: 1, Tier.NORMAL: 2, Tier.LOW: 3}
PRIORITY_RANK = {priority: -rank for rank, priority in enumerate(PRIORITY_ORDER)}  # the highest first
FAIR_SHARE_WINDOW = timedelta(days=30)

QUOTA_WAIT = "quota_wait"
CAPACITY_WAIT = "capacity_wait"
RESTART_BACKOFF = "restart_backoff"  # a restarted job waits out its backoff (Job.restart_after)


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
    *("id", "grant_id", "gpus", "device_fraction", "priority", "created", "reason", "holds_gpus", "state"),
    *("partition_id", "tenant_id", "preemptible", "share", "restart_after", "attempt", "gpus_borrowed"),
    *("tenant__tier", "tenant__state", "tenant__slug"),
)


def gpus_held_on(partition_id: int) -> Decimal:
    """The devices' worth its admitted jobs hold: units × each one's device fraction (a MIG
    instance, a slice or a shard holds that part of a device; clusters/shares.py)."""
    held = Job.objects.filter(partition_id=partition_id, holds_gpus=True).aggregate(
        n=Sum(F("gpus") * F("device_fraction"), output_field=DecimalField(max_digits=14, decimal_places=4))
    )["n"]
    return held or Decimal(0)


# --- Admission passes


def job_held_back(job: Job, *, grant: QuotaGrant, today: date) -> str:
    """Why the job's own tenant holds it back from starting, or "": a suspended tenant
    (tenant_suspended) or a grant no longer active (grant_ended). Admission and dispatch both
    ask, so that neither starts work that the cleanup (jobs/services/cleanup.py) would stop."""
    if job.tenant.state != TenantState.ACTIVE:
        return "tenant_suspended"
    if not grant.is_active_on(today):
        return "grant_ended"
    return ""


def job_unadmit_if_held(job: Job) -> bool:
    """Dispatch's check: an admitted QUEUED job whose tenant was suspended or whose grant ended
    since admission gives its GPUs back and waits again with that reason, never submitted. The
    caller holds the job's lock; the grant's is taken after it (partition → job → grant)."""
    held = job_held_back(job, grant=QuotaGrant.objects.get(pk=job.grant_id), today=timezone.localdate())
    if not held:
        return False
    gpus_back(job, now=timezone.now())
    job.holds_gpus, job.reason, job.dispatch_lease_until, job.gpus_borrowed = False, held, None, 0
    job.save(update_fields=["holds_gpus", "reason", "dispatch_lease_until", "gpus_borrowed"])
    partition_id = job.partition_id
    transaction.on_commit(lambda: jobs_admit_soon(partition_id=partition_id))  # its GPUs go to the next
    return True


def gpus_back(job: Job, *, now) -> dict[int, int]:
    """The GPUs an admitted job holds given back: its own grant's, and its loans' to their
    lenders' grants (jobs/services/lending.py). The caller holds the grants' locks or takes them
    here in id order (partition → job → grants). Returns grant id → GPUs given back."""
    back = loans_end([job.pk], now=now)
    back[job.grant_id] = back.get(job.grant_id, 0) + job.gpus - job.gpus_borrowed
    for grant_id in sorted(back):
        if back[grant_id]:
            grant_settle(
                grant_id=grant_id,
                reserved_gpu_hours=Decimal(0),
                used_gpu_hours=Decimal(0),
                gpus=back[grant_id],
            )
    return back


def grants_to_lock(job_ids, grant_ids: set[int]) -> set[int]:
    """The grants whose GPUs these jobs hold: their own, and their loans' lenders'."""
    return grant_ids | open_loan_grants(job_ids)


def _admit(partition: Partition) -> list[int]:
    """Give free GPUs to waiting jobs in admission order; the caller holds the partition lock.

    A job held back by its own tenant (a full grant, a suspended tenant, an ended grant) is
    skipped; the first that waits for the partition's capacity stops the line. With no GPU
    free nobody can start, and only the jobs that have no reason yet (just submitted) get one."""
    free = partition.gpus_total - gpus_held_on(partition.pk)
    if free <= 0 and not Loan.objects.filter(ended_at__isnull=True).exists():
        _mark_waiting(partition)  # full, and no loan a waiting lender could reclaim
        return []
    waiting = waiting_on(partition.pk)
    pool = lending_pool(partition, waiting)
    # Every grant this pass may touch (the cohorts' lenders' too), locked in one statement in id
    # order: two admissions on partitions that share a grant then queue on it instead of
    # deadlocking.
    locked = (
        QuotaGrant.objects.select_for_update(no_key=True)
        .filter(pk__in={j.grant_id for j in waiting} | (pool.grant_ids() if pool else set()))
        .order_by("pk")
    )
    grants = {grant.pk: grant for grant in locked}
    if pool is not None:
        pool.count_loans()
    today, now = timezone.localdate(), timezone.now()
    admitted = []
    order = admission_order(waiting)
    if pool is not None:  # a tenant whose own jobs wait for its quota lends nothing new meanwhile
        pool.short = {job.tenant_id for job in order if not grants[job.grant_id].has_room_for(job.gpus)}
    for job in order:
        before = job.reason
        grant = grants[job.grant_id]
        plan = None
        if held := job_held_back(job, grant=grant, today=today):
            job.reason = held
        elif job.restart_after and job.restart_after > now:
            job.reason = RESTART_BACKOFF
        elif not grant.has_room_for(job.gpus) and not (
            _reclaimed_room(pool, job, grant, grants)
            or (plan := pool and pool.borrow_plan(job, grant, grants))
        ):
            job.reason = QUOTA_WAIT
        elif job.gpus * job.device_fraction > free:
            job.reason = CAPACITY_WAIT
            free = 0  # strict order: nobody passes a job that waits for capacity
        elif not (pool.borrow(job, grant, grants, plan) if plan else _take(job, grant)):
            job.reason = QUOTA_WAIT
        else:
            free -= job.gpus * job.device_fraction
            job.holds_gpus, job.reason = True, ""
            admitted.append(job.pk)
        if job.holds_gpus or job.reason != before:
            Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
                reason=job.reason, holds_gpus=job.holds_gpus, gpus_borrowed=job.gpus_borrowed
            )
    for job_id in admitted:
        send_after_commit("jobs.tasks.dispatch_job", job_id=job_id)
    return admitted


def _take(job: Job, grant: QuotaGrant) -> bool:
    if not grant_take_gpus(grant_id=job.grant_id, gpus=job.gpus):
        return False
    grant.gpus_in_use += job.gpus
    return True


def _reclaimed_room(pool: LendingPool | None, job: Job, grant: QuotaGrant, grants: dict) -> bool:
    """Whether reclaiming what the job's grant has lent made room for it now."""
    return pool is not None and bool(pool.reclaim(job, grant, grants)) and grant.has_room_for(job.gpus)


def _mark_waiting(partition: Partition) -> None:
    """The reasons _admit would give, with no GPU free, to the waiting jobs that have none:
    held back by their tenant, quota_wait on a full grant, else capacity_wait."""
    today = timezone.localdate()
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .filter(partition_id=partition.pk, state=JobState.QUEUED, holds_gpus=False, reason="")
        .select_related("tenant", "grant")
    )
    for job in jobs:
        job.reason = _waiting_reason(job, today)
        job.save(update_fields=["reason"])


def _waiting_reason(job: Job, today: date) -> str:
    return job_held_back(job, grant=job.grant, today=today) or (
        CAPACITY_WAIT if job.grant.has_room_for(job.gpus) else QUOTA_WAIT
    )


@transaction.atomic
def jobs_admit(*, partition_id: int) -> list[int]:
    """Admit what fits on the partition now; returns the admitted job ids."""
    return _admit(
        Partition.objects.select_for_update(no_key=True, of=("self",))
        .select_related("cluster")
        .get(pk=partition_id)
    )


# How long a sent admit task stands for the partition's next pass: submissions meanwhile send none.
ADMIT_PENDING_S = 30


def jobs_admit_soon(*, partition_id: int) -> None:
    """Admission on the partition after an end: here and now when nobody else holds the
    partition, else (another end or the admit task is admitting there) by the admit task,
    which waits for the lock and then sees what changed."""
    with transaction.atomic():
        partition = (
            Partition.objects.select_for_update(no_key=True, of=("self",), skip_locked=True)
            .select_related("cluster")
            .filter(pk=partition_id)
            .first()
        )
        if partition is not None:
            _admit(partition)
            return
    jobs_admit_later(partition_id=partition_id)


def jobs_admit_later(*, partition_id: int) -> None:
    """Admission on the partition by the admit task, once the caller's transaction commits: what
    a submission asks for. One such task at a time per partition: the first caller to find no
    mark sends it, and the task clears the mark as it starts, so that the submissions of a
    burst share one pass (a pass in every submission's request was a fifth of its cost, and
    they queued on the partition's lock). The mark is set after the commit, so that a task that
    clears it has the job to see; a message the broker refused takes its mark away again, so
    that the next submission sends another. A mark whose task was lost otherwise (a worker
    killed) runs out after ADMIT_PENDING_S; the dispatch sweep admits meanwhile."""
    transaction.on_commit(lambda: _send_admit(partition_id))


def _send_admit(partition_id: int) -> None:
    mark = admit_mark(partition_id)
    try:
        first = cache.add(mark, 1, ADMIT_PENDING_S)
    except Exception as exc:  # the cache's own errors (Redis down) differ by backend
        log.warning("admit mark unavailable, sending the admit task anyway: %s", exc.__class__.__name__)
        first = True
    if not first:
        return
    try:
        send_now("jobs.tasks.admit_partition", partition_id=partition_id)
    except OperationalError as exc:
        log.warning("broker unreachable, admission on partition %s left to the sweep: %s", partition_id, exc)
        with contextlib.suppress(Exception):  # the cache may be down with the broker: it runs out anyway
            cache.delete(mark)


def jobs_admit_marked(*, partition_id: int) -> list[int]:
    """What the admit task runs: the mark goes first, so that a submission from now on sends
    another task if it needs one, then the pass (waiting for the partition's lock)."""
    with contextlib.suppress(Exception):  # the cache's own errors differ; the mark runs out anyway
        cache.delete(admit_mark(partition_id))
    return jobs_admit(partition_id=partition_id)


def admit_mark(partition_id: int) -> str:
    return f"jobs:admit-pending:{partition_id}"
