from collections import defaultdict
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import (
    Avg,
    Case,
    CharField,
    Count,
    Exists,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast
from django.utils import timezone

from billing.pricing import ZERO, Charge, PriceBook, midnight
from clusters.models import Cluster
from jobs.costs import Figures, earlier_attempts, pieces_of
from jobs.models import Job, JobEvent, JobGpuSample, JobState, Loan, LoanRole
from jobs.states import ACTIVE_IN_SCHEDULER
from portal.core.compiled import CompiledQuery
from portal.core.staff import holds_staff_perm, sees_all_tenants
from tenants import roles
from tenants.models import CohortMember, Tenant, TenantUserPermission
from tenants.selectors import tenant_id_list_visible_to, tenant_ids_visible_to, tenant_perms


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Job]:
    return Job.objects.filter(tenant_id__in=tenant_ids_visible_to(user=user)).select_related(
        "tenant", "scenario", "gpu_model", "cluster", "partition", "submitted_by"
    )


# A job's answer in the API, field by field, and the column of the job each is read from: the
# one declaration of what the answer holds. jobs.serializers.JobOut answers these fields in this
# order (and the schema shows them), the queries below read these columns, and the answer is
# built from a row of them (docs/architecture/performance-layer.md). A column of the job is added
# to the answer here alone; JobOut declares how a field is shown when not as its column is.
# The catalog's names are read apart (clusters.selectors.catalog_names): joining four more
# tables into every job query cost PostgreSQL more to plan than the query took to run.
JOB_ANSWER = {
    "id": "id",
    "tenant": "tenant__slug",
    "name": "name",
    "scenario": "scenario_id",
    "gpu_model": "gpu_model_id",
    "gpus": "gpus",
    "nodes": "nodes",
    "share": "share",
    "mig_profile": "mig_profile",
    "gpu_memory_mib": "gpu_memory_mib",
    "gpu_cores_pct": "gpu_cores_pct",
    "device_fraction": "device_fraction",
    "walltime_minutes": "walltime_minutes",
    "priority": "priority",
    "state": "state",
    "reason": "reason",
    "cluster": "cluster_id",
    "partition": "partition_id",
    "backend_id": "backend_id",
    "submitted_by": "submitted_by__username",
    "created": "created",
    "started_at": "started_at",
    "finished_at": "finished_at",
    "exit_code": "exit_code",
    "gpu_hours": "gpu_hours",
    "gpu_hours_reserved": "reserved_gpu_hours",
    "preemptible": "preemptible",
    "max_restarts": "max_restarts",
    "restart_exit_codes": "restart_exit_codes",
    "attempt": "attempt",
    "gpus_borrowed": "gpus_borrowed",
    "gpu_hours_lost": "gpu_hours_lost",
    "stop_at": "stop_at",
    "restart_after": "restart_after",
    "tier": "tier",
}
API_JOB_FIELDS = tuple(JOB_ANSWER.values())
# What JobDetailOut adds for the job's submitter and the tenant's owners and managers: columns
# shown under their own names.
API_JOB_DETAIL_FIELDS = ("raw_state", "node_list", "template", "parameters", "env", "script")


def job_answers_visible_to(*, user: AbstractBaseUser, detail: bool = False) -> QuerySet[Job]:
    """The jobs of jobs_visible_to as the API answers them (JobOut, JobDetailOut): the caller's
    tenants as a list of ids, two joins (tenant, submitter) and the columns the answer shows;
    `detail` adds the script, env and the rest."""
    fields = (*API_JOB_FIELDS, *API_JOB_DETAIL_FIELDS) if detail else API_JOB_FIELDS
    return (
        Job.objects.filter(tenant_id__in=tenant_id_list_visible_to(user=user))
        .select_related("tenant", "submitted_by")
        .only(*fields)
    )


# GET /jobs/{id}/: a job's answer row by its id, compiled once (portal.core.compiled), with the
# detail's columns and what the caller's rights over it are judged by. Building and compiling
# the ORM query anew was half of what the answer cost in the web process (docs/performance.md).
JOB_ROW_FIELDS = (*API_JOB_FIELDS, *API_JOB_DETAIL_FIELDS, "tenant_id", "submitted_by_id")
_JOB_ROW_BY_ID = CompiledQuery(
    lambda pk: Job.objects.filter(pk=pk).values_list(*JOB_ROW_FIELDS),
    7_300_000_000_000_000_001,
)


def _holds(user_id: int, codename: str) -> Exists:
    """Whether the user holds the permission on the job's tenant (a subquery of the job's row)."""
    return Exists(
        TenantUserPermission.objects.filter(
            user_id=user_id,
            content_object_id=OuterRef("tenant_id"),
            permission__codename=codename,
            permission__content_type__app_label="tenants",
        )
    )


# The same row for a caller whose rights are its memberships alone, with those rights on the
# job's tenant read in the same query: whether it may view, cancel any job, submit. Reading the caller's whole
# permission map first was a second query, a tenth of the answer's cost in the web process.
RIGHTS = ("may_view", "may_cancel_any", "may_submit")
_JOB_ROW_WITH_RIGHTS = CompiledQuery(
    lambda pk, viewer, canceller, submitter: (
        Job.objects.filter(pk=pk)
        .annotate(
            may_view=_holds(viewer, roles.VIEW),
            may_cancel_any=_holds(canceller, roles.CANCEL_ANY_JOB),
            may_submit=_holds(submitter, roles.SUBMIT_JOB),
        )
        .values_list(*JOB_ROW_FIELDS, *RIGHTS)
    ),
    7_300_000_000_000_000_002,
    -7_300_002,
    -7_300_003,
    -7_300_004,
)


def job_answer_row_visible_to(*, user: AbstractBaseUser, pk: int) -> tuple[dict, bool] | None:
    """The job as a row of JOB_ROW_FIELDS if the caller may see it (a tenant of
    tenant_id_list_visible_to), and whether the caller may see its detail (job_is_own_or_managed);
    else None. For a caller whose rights are its memberships alone, one query; for a staff role
    that reads every tenant (platform admins included), the row by its id and the rights as
    tenant_perms reads them."""
    if not sees_all_tenants(user):
        rows = _JOB_ROW_WITH_RIGHTS.rows(pk, user.pk, user.pk, user.pk) if user.is_active else []
        if not rows or not rows[0][-3]:
            return None
        row = dict(zip(JOB_ROW_FIELDS, rows[0][: len(JOB_ROW_FIELDS)], strict=True))
        _, may_cancel_any, may_submit = rows[0][-3:]
        return row, may_cancel_any or (row["submitted_by_id"] == user.pk and may_submit)
    rows = _JOB_ROW_BY_ID.rows(pk)
    if not rows:
        return None
    row = dict(zip(JOB_ROW_FIELDS, rows[0], strict=True))
    visible = tenant_id_list_visible_to(user=user)
    # Not a list: staff who see every tenant (the subquery of them all).
    if isinstance(visible, list) and row["tenant_id"] not in visible:
        return None
    perms = tenant_perms(user=user, tenant=Tenant(pk=row["tenant_id"]))
    return row, _own_or_managed(perms, row["submitted_by_id"] == user.pk)


def job_answer_rows_visible_to(*, user: AbstractBaseUser) -> QuerySet[dict]:
    """job_answers_visible_to as rows of API_JOB_FIELDS (dicts), for the list: a page of 50 read 2 ms
    faster than as 150 model instances (a job, its tenant, its submitter)."""
    return _JOB_ANSWER_ROWS.filter(tenant_id__in=tenant_id_list_visible_to(user=user))


# The list's values() query, set up once: a clone of it costs less than values() made anew (its
# joins and columns resolved) on every page. Never evaluated itself: only its clones are.
_JOB_ANSWER_ROWS = Job.objects.values(*API_JOB_FIELDS)


def job_events_of(*, user: AbstractBaseUser, tenant) -> QuerySet[JobEvent]:
    """The tenant's latest job events, newest first, scoped like the jobs themselves."""
    visible = jobs_visible_to(user=user).filter(tenant=tenant).values("id")
    return (
        JobEvent.objects.filter(job_id__in=visible)
        .select_related("job")
        .only("at", "from_state", "to_state", "reason", "job__id", "job__name")
        .order_by("-id")
    )


def job_may_cancel(*, user: AbstractBaseUser, job: Job) -> bool:
    """Who may cancel the job: whoever may act on it (job_is_own_or_managed), and staff who hold
    `jobs.change_job`, the permission the console's bulk cancel asks for: one rule for the API,
    the pages and the console."""
    return job_is_own_or_managed(user=user, job=job) or holds_staff_perm(user, "jobs.change_job")


def job_is_own_or_managed(*, user: AbstractBaseUser, job: Job) -> bool:
    """May the user act on this job as more than a reader: cancel it, see its script and env?
    Its submitter (while still allowed to submit), the tenant's owners and managers, admins."""
    perms = tenant_perms(user=user, tenant=job.tenant)
    return _own_or_managed(perms, job.submitted_by_id == user.pk)


def _own_or_managed(perms: frozenset[str], own: bool) -> bool:
    return roles.CANCEL_ANY_JOB in perms or (own and roles.SUBMIT_JOB in perms)


# --- Usage: GPU-hours and what they cost, on the days they were used (jobs/costs.py prices them)

USAGE_GROUPS = ("day", "user", "gpu_model", "tenant", "scenario", "cluster")

# What a usage row of a job is keyed by, per group (the day is its charge's, below).
USAGE_KEYS = {
    "user": lambda job: job.submitted_by.username if job.submitted_by_id else "",  # "": a deleted account
    "gpu_model": lambda job: job.gpu_model.slug,
    "tenant": lambda job: job.tenant.slug,
    "scenario": lambda job: job.scenario.slug,
    "cluster": lambda job: job.cluster.slug,
}

# The columns a job's charges and usage keys read: the job's script and environment stay unread.
USAGE_COLUMNS = (
    "id", "tenant_id", "gpu_model_id", "scenario_id", "cluster_id", "partition_id", "submitted_by_id",
    "gpus", "device_fraction", "share", "tier", "state", "attempt", "created", "started_at",
    "finished_at", "gpu_hours", "reserved_gpu_hours", "tenant__slug", "gpu_model__slug",
    "scenario__slug", "cluster__slug", "submitted_by__username",
)  # fmt: skip


def day_cuts(start: datetime, end: datetime) -> list[datetime]:
    """The midnights of the site's time zone strictly between two moments."""
    cuts, day = [], timezone.localdate(start) + timedelta(days=1)
    while midnight(day) < end:
        cuts.append(midnight(day))
        day += timedelta(days=1)
    return cuts


def jobs_used_between(jobs: QuerySet[Job], *, start: datetime, end: datetime) -> QuerySet[Job]:
    """Those of `jobs` that may have held GPUs in [start, end): started before its end (or
    restarted: an earlier attempt ran), and not finished before its start; in one query."""
    ran = Q(started_at__lt=end) | Q(attempt__gt=1)
    not_over = Q(finished_at__gte=start) | Q(finished_at__isnull=True)
    return (
        jobs.filter(ran & not_over)
        .select_related("tenant", "gpu_model", "scenario", "cluster", "submitted_by")
        .only(*USAGE_COLUMNS)
        .order_by("id")
    )


def charges_between(
    job: Job,
    attempts: list,
    book: PriceBook,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    daily: bool = False,
) -> list[Charge]:
    """The job's charges (earlier runs, then the last run, or the current one so far) that fall
    in [start, end), cut there and, when `daily`, at each midnight between: GPU-hours land on
    the days they were used, and the parts of a run add up to the whole exactly."""
    pieces = pieces_of(Figures.of(job), attempts, now=now)
    if not pieces:
        return []
    cuts = [start, end]
    if daily:
        cuts += day_cuts(max(start, min(p.start for p in pieces)), min(end, max(p.end for p in pieces)))
    charges = book.charges(pieces, gpu_model_id=job.gpu_model_id, share=job.share, tier=job.tier, cuts=cuts)
    return [charge for charge in charges if start <= charge.start < end]


def usage_of(
    *,
    user: AbstractBaseUser,
    tenant_slug: str | None,
    start: date,
    end: date,
    group_by: str,
    now: datetime | None = None,
) -> list[dict]:
    """GPU-hours and their cost (exact Decimal) used from `start` to `end` (days of the site's
    time zone) by the jobs the caller may see, running ones so far, by day, user, GPU model,
    tenant, scenario or cluster: `[{key, gpu_hours, cost}]` in key order. A run's GPU-hours land
    on the days it ran, each part at the price then in force. Three queries however many jobs:
    the jobs, the attempts of restarted ones, the price list."""
    now = now or timezone.now()
    lo, hi = midnight(start), midnight(end + timedelta(days=1))
    jobs = Job.objects.filter(tenant_id__in=tenant_ids_visible_to(user=user))
    if tenant_slug:
        jobs = jobs.filter(tenant__slug=tenant_slug)
    jobs = list(jobs_used_between(jobs, start=lo, end=hi))
    attempts = earlier_attempts(job.pk for job in jobs if job.attempt > 1)
    book = PriceBook.load()
    daily = group_by == "day"
    totals: dict[str, list[Decimal]] = defaultdict(lambda: [ZERO, ZERO])
    for job in jobs:
        for charge in charges_between(
            job, attempts.get(job.pk, []), book, start=lo, end=hi, now=now, daily=daily
        ):
            key = timezone.localdate(charge.start).isoformat() if daily else USAGE_KEYS[group_by](job)
            totals[key][0] += charge.gpu_hours
            totals[key][1] += charge.cost
    return [
        {"key": key, "gpu_hours": float(hours), "cost": cost}
        for key, (hours, cost) in sorted(totals.items())
        if hours
    ]


# A job waits while it has no GPUs yet: for dispatch or quota (QUEUED), on its way to the
# scheduler (SUBMITTING), or in the scheduler's queue (PENDING).
WAITING_STATES = (JobState.QUEUED, JobState.SUBMITTING, JobState.PENDING)


def jobs_waiting_of(*, user: AbstractBaseUser, tenant) -> QuerySet[Job]:
    """The tenant's waiting jobs, longest waiting first, with what a row shows in one query."""
    return jobs_visible_to(user=user).filter(tenant=tenant, state__in=WAITING_STATES).order_by("id")


def job_counts_of(*, user: AbstractBaseUser, tenant) -> dict[str, int]:
    """How many of the tenant's jobs wait and how many run, in one query."""
    return Job.objects.filter(tenant_id__in=tenant_ids_visible_to(user=user), tenant=tenant).aggregate(
        waiting=Count("id", filter=Q(state__in=WAITING_STATES)),
        running=Count("id", filter=Q(state=JobState.RUNNING)),
    )


# --- What the beat's fan-out tasks go over (jobs/tasks.py)


def cluster_ids_to_poll() -> list[int]:
    """The clusters a poll asks: every enabled one, and a disabled one while it still has jobs
    to follow to their end."""
    busy = Job.objects.filter(state__in=ACTIVE_IN_SCHEDULER).values("cluster_id")
    return list(Cluster.objects.filter(Q(enabled=True) | Q(pk__in=busy)).values_list("pk", flat=True))


def awaiting_dispatch(now) -> Q:
    """Admitted QUEUED jobs, and SUBMITTING ones whose last dispatcher is gone, with no live
    dispatch lease: what a dispatcher may claim, and what waits while its cluster stalls."""
    claimable = Q(state=JobState.QUEUED, holds_gpus=True) | Q(state=JobState.SUBMITTING)
    return claimable & (Q(dispatch_lease_until__isnull=True) | Q(dispatch_lease_until__lt=now))


# The most points a job's GPU charts and GET /jobs/{id}/gpu-samples/ carry: 30 days of one-minute
# readings are 43,200; buckets of consecutive readings, each one point, are plenty for a chart.
GPU_SAMPLES_SHOWN = 720
_SAMPLE_FIELDS = (
    "at", "gpus", "utilization_pct", "utilization_min_pct", "utilization_max_pct", "memory_used_mib",
    "memory_total_mib", "temperature_c", "power_w", "xid",
)  # fmt: skip


def gpu_samples_of(job: Job, *, limit: int = GPU_SAMPLES_SHOWN) -> list[JobGpuSample]:
    """The job's GPU readings in time order. More than `limit` are merged into `limit` buckets of
    consecutive readings, so that no peak is lost: each at its last reading's time, with the mean
    utilization and power, the lowest least-busy and highest busiest GPU, the peak memory and
    temperature and the highest XID. The caller has found the job among those it may see."""
    rows = list(JobGpuSample.objects.filter(job=job).order_by("at").values_list(*_SAMPLE_FIELDS))
    if len(rows) <= limit:
        return [JobGpuSample(job=job, **dict(zip(_SAMPLE_FIELDS, row, strict=True))) for row in rows]
    size = -(-len(rows) // limit)  # ceil
    return [_merged(job, rows[start : start + size]) for start in range(0, len(rows), size)]


def _merged(job: Job, rows: list[tuple]) -> JobGpuSample:
    at, gpus, mean, low, high, used, total, temperature, power, xid = zip(*rows, strict=True)

    def present(values: tuple) -> list:
        return [value for value in values if value is not None]

    def average(values: tuple) -> float | None:
        return sum(present(values)) / len(present(values)) if present(values) else None

    def peak(values: tuple):
        return max(present(values), default=None)

    return JobGpuSample(
        job=job, at=at[-1], gpus=max(gpus), utilization_pct=average(mean), utilization_min_pct=min(low),
        utilization_max_pct=max(high), memory_used_mib=peak(used), memory_total_mib=peak(total),
        temperature_c=peak(temperature), power_w=average(power), xid=peak(xid),
    )  # fmt: skip


def gpu_latest_of(job: Job, *, count: int) -> list[JobGpuSample]:
    """The job's latest readings as they were taken, newest first."""
    return list(JobGpuSample.objects.filter(job=job).order_by("-at")[:count])


def gpu_efficiency_of(jobs: list[Job]) -> dict[int, dict]:
    """Per job (of those given: the caller's visible ones) that has readings: its GPUs' mean
    utilization over its kept readings (`mean_pct`, the GPU efficiency: its life so far, or its
    last GPU_SAMPLE_KEEP_DAYS), how many, and its latest reading."""
    ids = [job.pk for job in jobs]
    if not ids:
        return {}
    overall = (
        JobGpuSample.objects.filter(job_id__in=ids)
        .values("job_id")
        .annotate(mean_pct=Avg("utilization_pct"), readings=Count("id"), latest_at=Max("at"))
    )
    by_job = {row["job_id"]: row for row in overall}
    latest = JobGpuSample.objects.filter(
        job_id__in=list(by_job), at__in=[row["latest_at"] for row in by_job.values()]
    )
    for sample in latest:
        row = by_job[sample.job_id]
        if sample.at == row["latest_at"]:
            row["latest"] = sample
    return by_job


# --- Lending (jobs/services/lending.py): what a tenant lends, borrows and has reclaimed

LENDING_DAYS_MAX = 90


def lending_of(*, tenant: Tenant, days: int = 30, now: datetime | None = None) -> dict:
    """The tenant's places in cohorts with the GPUs it lends and borrows now, and its loans of
    the last `days` days by day: GPU-hours lent and borrowed within each day, and reclaims (its
    GPUs taken back from borrowers, and its borrowed jobs stopped for their lenders). The
    caller has checked that the user may read the tenant; no other tenant is named."""
    now = now or timezone.now()
    since = now - timedelta(days=days)
    places = list(
        CohortMember.objects.filter(tenant=tenant)
        .select_related("cohort__gpu_model", "cohort__partition__cluster")
        .order_by("cohort__slug")
    )
    open_loans = (
        Loan.objects.filter(ended_at__isnull=True)
        .filter(Q(lender=tenant) | Q(borrower=tenant))
        .values("cohort_id")
        .annotate(
            lent=Sum("gpus", filter=Q(lender=tenant), default=0),
            borrowed=Sum("gpus", filter=Q(borrower=tenant), default=0),
        )
    )
    by_cohort = {row["cohort_id"]: row for row in open_loans}
    cohorts = [
        {
            "cohort": place.cohort.slug,
            "gpu_model": place.cohort.gpu_model.slug,
            "partition": (
                {"cluster": place.cohort.partition.cluster.slug, "name": place.cohort.partition.name}
                if place.cohort.partition_id
                else None
            ),
            "reclaim_grace_s": place.cohort.reclaim_grace_s,
            "lending_limit": place.lending_limit,
            "borrowing_limit": place.borrowing_limit,
            "lent_gpus": by_cohort.get(place.cohort_id, {}).get("lent", 0),
            "borrowed_gpus": by_cohort.get(place.cohort_id, {}).get("borrowed", 0),
        }
        for place in places
    ]
    loans = (
        Loan.objects.filter(Q(lender=tenant) | Q(borrower=tenant), started_at__lt=now)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        .values_list("lender_id", "gpus", "started_at", "ended_at", "reclaimed")
    )
    first_day = since.date()
    daily = {
        first_day + timedelta(days=n): {"lent_gpu_hours": 0.0, "borrowed_gpu_hours": 0.0, "reclaimed": 0}
        for n in range((now.date() - first_day).days + 1)
    }
    totals = {"lent_gpu_hours": 0.0, "borrowed_gpu_hours": 0.0, "reclaimed_from_borrowers": 0}
    totals["reclaimed_from_us"] = 0
    for lender_id, gpus, started_at, ended_at, reclaimed in loans:
        side = "lent_gpu_hours" if lender_id == tenant.pk else "borrowed_gpu_hours"
        # an end after now: another host's clock; counted up to now
        ended_at = min(ended_at, now) if ended_at else None
        for day, hours in _hours_by_day(max(started_at, since), ended_at or now, gpus):
            daily[day][side] += hours
            totals[side] += hours
        if reclaimed and ended_at is not None and ended_at >= since:
            daily[ended_at.date()]["reclaimed"] += 1
            totals["reclaimed_from_borrowers" if lender_id == tenant.pk else "reclaimed_from_us"] += 1
    return {
        "tenant": tenant.slug,
        "cohorts": cohorts,
        "lent_gpus": sum(row["lent_gpus"] for row in cohorts),
        "borrowed_gpus": sum(row["borrowed_gpus"] for row in cohorts),
        "days": days,
        **{key: round(value, 4) for key, value in totals.items()},
        "daily": [
            {"date": day.isoformat(), **{key: round(value, 4) for key, value in row.items()}}
            for day, row in sorted(daily.items())
        ],
    }


def loans_of(*, user: AbstractBaseUser, tenant: Tenant) -> QuerySet[Loan]:
    """The tenant's loans, lent and borrowed, as its reader may see them (the caller has checked
    that the user may read the tenant): the other tenant (`counterpart`) only to staff who see
    every tenant, by their role; the borrowing job (`job_shown`) only to its own tenant."""
    lent = Q(lender_id=tenant.pk)
    if sees_all_tenants(user):
        counterpart = Case(When(lent, then=F("borrower__slug")), default=F("lender__slug"))
    else:
        counterpart = Value(None, output_field=CharField())
    return (
        Loan.objects.filter(lent | Q(borrower_id=tenant.pk))
        .select_related("cohort")
        .only("id", "gpus", "started_at", "ended_at", "reclaimed", "job_id", "cohort__slug")
        .annotate(
            role=Case(When(lent, then=Value(LoanRole.LENT)), default=Value(LoanRole.BORROWED)),
            job_shown=Case(
                When(lent, then=Value(None, output_field=CharField())), default=Cast("job_id", CharField())
            ),
            counterpart=counterpart,
        )
    )


def _hours_by_day(start: datetime, end: datetime, gpus: int):
    """GPU-hours of `gpus` held from start to end, cut at each midnight (UTC)."""
    while start < end:
        next_day = start.date() + timedelta(days=1)
        midnight = datetime.combine(next_day, datetime.min.time(), tzinfo=start.tzinfo)
        cut = min(end, midnight)
        yield start.date(), (cut - start).total_seconds() * gpus / 3600
        start = cut


def lending_panel_of(*, tenant: Tenant, days: int = 30) -> dict | None:
    """The dashboard's lending panel: lending_of for a tenant in a cohort; None, after one
    query, for a tenant in none (most tenants), whose dashboard leaves the panel out."""
    if not CohortMember.objects.filter(tenant=tenant).exists():
        return None
    return lending_of(tenant=tenant, days=days)
