"""The site report for platform staff: over a range of days of the site's time zone, GPU-hours
and their cost by tenant, GPU model, scenario, cluster, partition and day; each partition's
utilization per day, from the allocation and from the GPU telemetry where there is some; the
wait from submission to the first start by scenario and tier; the top consumers by cost.

Everything comes from one read of the jobs that held GPUs in the range (jobs.selectors), their
attempts, the price list, the partitions and one aggregate of the telemetry: six queries however
many jobs. Money stays exact (Decimal) until it is shown."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, FloatField, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from billing.money import currency, rounded
from billing.pricing import ZERO, PriceBook, midnight
from clusters.models import Partition
from jobs.models import Job, JobAttempt, JobGpuSample
from jobs.selectors import USAGE_COLUMNS, charges_between, jobs_used_between
from tenants.selectors import tenant_ids_visible_to

# The groups of the usage tables, in the order the report shows them.
USAGE_GROUPS = ("tenant", "gpu_model", "scenario", "cluster", "partition", "day")
TOP_DEFAULT = 10


@dataclass
class Tally:
    gpu_hours: Decimal = ZERO
    cost: Decimal = ZERO


@dataclass
class UsageRow:
    key: str
    gpu_hours: Decimal
    cost: Decimal


@dataclass
class UtilizationRow:
    partition: str  # "cluster/partition"
    day: date
    gpus: int
    allocated_gpu_hours: Decimal  # device-GPU-hours held by jobs that day
    allocated_pct: float | None  # of gpus × the day's hours (up to now); None without capacity
    telemetry_pct: float | None  # mean GPU utilization the telemetry read that day; None without


@dataclass
class WaitRow:
    key: str
    jobs: int
    mean_s: float
    p50_s: float
    p90_s: float


@dataclass
class SiteReport:
    start: date
    end: date
    currency: str
    gpu_hours: Decimal = ZERO
    cost: Decimal = ZERO
    usage: dict[str, list[UsageRow]] = field(default_factory=dict)
    utilization: list[UtilizationRow] = field(default_factory=list)
    waits: dict[str, list[WaitRow]] = field(default_factory=dict)
    top_tenants: list[UsageRow] = field(default_factory=list)
    top_users: list[UsageRow] = field(default_factory=list)


def percentile(ordered: list[float], p: float) -> float:
    """The p-th percentile (0–100) of sorted values, interpolated between the two nearest ranks
    (numpy's default, "linear")."""
    position = (len(ordered) - 1) * p / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _overlap_s(a: datetime, b: datetime, lo: datetime, hi: datetime) -> float:
    return max(0.0, (min(b, hi) - max(a, lo)).total_seconds())


def _runs(job: Job, attempts: list[JobAttempt], now: datetime) -> list[tuple[datetime, datetime]]:
    """When the job held its GPUs: each earlier attempt from its start to its end, then the last
    run to its end (to now while it holds them)."""
    runs = [
        (a.started_at, a.ended_at) for a in attempts if a.number < job.attempt and a.started_at is not None
    ]
    if job.started_at is not None:
        runs.append((job.started_at, job.finished_at or now))
    return runs


def _first_start(job: Job, attempts: list[JobAttempt]) -> datetime | None:
    starts = [a.started_at for a in attempts if a.started_at is not None]
    if job.started_at is not None:
        starts.append(job.started_at)
    return min(starts, default=None)


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def site_report_of(
    *, user: AbstractBaseUser, start: date, end: date, top: int = TOP_DEFAULT, now: datetime | None = None
) -> SiteReport:
    """The report from `start` to `end` (days of the site's time zone) over the tenants the
    caller may see: every tenant for platform staff, whom the API and the page require."""
    now = now or timezone.now()
    lo, hi = midnight(start), midnight(end + timedelta(days=1))
    visible = tenant_ids_visible_to(user=user)
    jobs = jobs_used_between(Job.objects.filter(tenant_id__in=visible), start=lo, end=hi)
    jobs = list(jobs.select_related("partition").only(*USAGE_COLUMNS, "partition__name"))
    attempts: dict[int, list[JobAttempt]] = defaultdict(list)
    rows = JobAttempt.objects.filter(job_id__in=[job.pk for job in jobs if job.attempt > 1]).only(
        "job_id", "number", "started_at", "ended_at", "gpu_hours", "gpu_hours_lost"
    )
    for attempt in rows.order_by("job_id", "number"):
        attempts[attempt.job_id].append(attempt)
    book = PriceBook.load()
    report = SiteReport(start=start, end=end, currency=currency())

    usage: dict[str, dict[str, Tally]] = {group: defaultdict(Tally) for group in USAGE_GROUPS}
    users: dict[str, Tally] = defaultdict(Tally)
    allocated: dict[tuple[int, date], float] = defaultdict(float)
    waits: dict[str, dict[str, list[float]]] = {"scenario": defaultdict(list), "tier": defaultdict(list)}
    days = _days(start, end)
    midnights = {day: midnight(day) for day in [*days, end + timedelta(days=1)]}
    for job in jobs:
        job_attempts = attempts.get(job.pk, [])
        keys = {
            "tenant": job.tenant.slug,
            "gpu_model": job.gpu_model.slug,
            "scenario": job.scenario.slug,
            "cluster": job.cluster.slug,
            "partition": f"{job.cluster.slug}/{job.partition.name}",
        }
        for charge in charges_between(job, job_attempts, book, start=lo, end=hi, now=now, daily=True):
            day = timezone.localdate(charge.start).isoformat()
            for group, key in (*keys.items(), ("day", day)):
                tally = usage[group][key]
                tally.gpu_hours += charge.gpu_hours
                tally.cost += charge.cost
            user = users[job.submitted_by.username if job.submitted_by_id else ""]  # "": a deleted account
            user.gpu_hours += charge.gpu_hours
            user.cost += charge.cost
            report.gpu_hours += charge.gpu_hours
            report.cost += charge.cost
        rate = float(job.gpus * job.device_fraction)
        for run_start, run_end in _runs(job, job_attempts, now):
            # only the days the run touches, within the range (not every day for every run)
            day = max(days[0], timezone.localdate(run_start)) if days else None
            while day is not None and day <= days[-1] and midnights[day] < run_end:
                seconds = _overlap_s(run_start, run_end, midnights[day], midnights[day + timedelta(days=1)])
                if seconds:
                    allocated[(job.partition_id, day)] += rate * seconds / 3600
                day += timedelta(days=1)
        first = _first_start(job, job_attempts)
        if first is not None and lo <= first < hi:
            wait_s = max(0.0, (first - job.created).total_seconds())
            waits["scenario"][job.scenario.slug].append(wait_s)
            waits["tier"][job.tier].append(wait_s)

    for group in USAGE_GROUPS:
        report.usage[group] = [UsageRow(k, t.gpu_hours, t.cost) for k, t in sorted(usage[group].items())]
    report.top_tenants = _top(usage["tenant"], top)
    report.top_users = _top(users, top)
    report.waits = {
        group: [_wait_row(key, values) for key, values in sorted(by_key.items())]
        for group, by_key in waits.items()
    }
    report.utilization = _utilization(days, allocated, visible, lo=lo, hi=min(hi, now))
    return report


def _top(tallies: dict[str, Tally], n: int) -> list[UsageRow]:
    ordered = sorted(tallies.items(), key=lambda item: (-item[1].cost, -item[1].gpu_hours, item[0]))
    return [UsageRow(key, tally.gpu_hours, tally.cost) for key, tally in ordered[:n]]


def _wait_row(key: str, values: list[float]) -> WaitRow:
    ordered = sorted(values)
    return WaitRow(
        key, len(ordered), sum(ordered) / len(ordered), percentile(ordered, 50), percentile(ordered, 90)
    )


def _utilization(
    days: list[date], allocated: dict[tuple[int, date], float], visible, *, lo: datetime, hi: datetime
) -> list[UtilizationRow]:
    """Per partition and day up to now: the device-GPU-hours jobs held over what its GPUs could
    give that day (its GPUs as the catalog has them now), and the telemetry's mean utilization
    of the GPUs it read, weighted by how many each reading covered."""
    samples = (
        JobGpuSample.objects.filter(at__gte=lo, at__lt=hi, job__tenant_id__in=visible)
        .annotate(day=TruncDate("at"))
        .values("job__partition_id", "day")
        .annotate(
            weighted=Sum(F("utilization_pct") * F("gpus"), output_field=FloatField()),
            gpus_read=Sum("gpus"),
        )
        .order_by()
    )
    telemetry = {
        (row["job__partition_id"], row["day"]): row["weighted"] / row["gpus_read"]
        for row in samples
        if row["gpus_read"]
    }
    rows = []
    partitions = Partition.objects.select_related("cluster").order_by("cluster__slug", "name")
    for partition in partitions:
        gpus = partition.gpus_per_node * partition.nodes
        for day in days:
            hours = _overlap_s(midnight(day), midnight(day + timedelta(days=1)), lo, hi) / 3600
            if hours <= 0:
                continue
            held = allocated.get((partition.pk, day), 0.0)
            reading = telemetry.get((partition.pk, day))
            rows.append(
                UtilizationRow(
                    partition=f"{partition.cluster.slug}/{partition.name}",
                    day=day,
                    gpus=gpus,
                    allocated_gpu_hours=Decimal(held).quantize(Decimal("0.0001")),
                    allocated_pct=round(100 * held / (gpus * hours), 2) if gpus else None,
                    telemetry_pct=None if reading is None else round(reading, 2),
                )
            )
    return rows


# --- The report as tables: the downloads (CSV, one table; XLSX, a sheet each) and the page

TABLES = ("usage", "utilization", "waits", "top")


def site_report_tables(report: SiteReport) -> dict[str, tuple[list[str], list[list]]]:
    """Each table's headers and rows; money rounded to the currency's minor unit, GPU-hours to
    the ledger's 4 places."""
    hours = Decimal("0.0001")
    usage = [
        [group, row.key, row.gpu_hours.quantize(hours), rounded(row.cost)]
        for group in USAGE_GROUPS
        for row in report.usage[group]
    ]
    utilization = [
        [r.partition, r.day, r.gpus, r.allocated_gpu_hours, r.allocated_pct, r.telemetry_pct]
        for r in report.utilization
    ]
    waits = [
        [group, r.key, r.jobs, round(r.mean_s, 1), round(r.p50_s, 1), round(r.p90_s, 1)]
        for group, rows in report.waits.items()
        for r in rows
    ]
    top = [
        [kind, rank, row.key, row.gpu_hours.quantize(hours), rounded(row.cost)]
        for kind, rows in (("tenant", report.top_tenants), ("user", report.top_users))
        for rank, row in enumerate(rows, start=1)
    ]
    money = f"cost_{report.currency}"
    return {
        "usage": (["group_by", "key", "gpu_hours", money], usage),
        "utilization": (
            ["partition", "day", "gpus", "allocated_gpu_hours", "allocated_pct", "telemetry_pct"],
            utilization,
        ),
        "waits": (["group_by", "key", "jobs", "mean_s", "p50_s", "p90_s"], waits),
        "top": (["kind", "rank", "key", "gpu_hours", money], top),
    }
