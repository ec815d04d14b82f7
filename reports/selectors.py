"""Reads of the reports app, scoped to what the caller may see, and the sets beat goes over."""

from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Sum

from billing.models import Budget, BudgetPeriod
from jobs.models import Job, JobAttempt
from portal.core.staff import sees_all_tenants
from reports.models import Statement, StatementLine
from tenants.models import Membership, Role
from tenants.selectors import tenant_id_list_visible_to

# --- Statements

# A job whose last run ended more than this before a month began has no charge in it (a run's
# charged GPU-hours end with it; the margin covers the rounding of a run's end).
ENDED_MARGIN = timedelta(days=1)


def _in_month(start: datetime, end: datetime) -> Q:
    ran_before_end = Q(started_at__lt=end) | Exists(
        JobAttempt.objects.filter(job_id=OuterRef("pk"), started_at__lt=end)
    )
    return ran_before_end & (Q(finished_at__isnull=True) | Q(finished_at__gte=start - ENDED_MARGIN))


def jobs_in_month(*, tenant_id: int, start: datetime, end: datetime) -> QuerySet[Job]:
    """The tenant's jobs that may have a charge in [start, end), with what a statement line copies."""
    return (
        Job.objects.filter(_in_month(start, end), tenant_id=tenant_id)
        .select_related("submitted_by", "gpu_model", "scenario", "cluster", "partition")
        .order_by("pk")
    )


def tenant_ids_due(*, start: datetime, end: datetime) -> list[int]:
    """Tenants whose statement for the month beat makes: those with jobs that may have run in it,
    and those with a monthly budget (a statement of nothing spent, against the budget)."""
    with_jobs = Job.objects.filter(_in_month(start, end)).values_list("tenant_id", flat=True)
    with_budget = Budget.objects.filter(period=BudgetPeriod.MONTH).values_list("tenant_id", flat=True)
    return sorted(set(with_jobs) | set(with_budget))


def owner_emails(*, tenant_id: int) -> list[str]:
    """Where a statement is mailed: the tenant's active owners with an address."""
    return list(
        Membership.objects.filter(tenant_id=tenant_id, role=Role.OWNER, user__is_active=True)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )


def statements_visible_to(*, user: AbstractBaseUser) -> QuerySet[Statement]:
    """Every member of a tenant reads its statements (any role); staff who see every tenant read
    all, those of deleted tenants too."""
    if not user.is_authenticated or not user.is_active:
        return Statement.objects.none()
    if sees_all_tenants(user):
        return Statement.objects.all()
    return Statement.objects.filter(tenant_id__in=tenant_id_list_visible_to(user=user))


def statement_lines(*, statement: Statement) -> QuerySet[StatementLine]:
    return StatementLine.objects.filter(statement=statement).order_by("start", "job_id", "id")


PCT = Decimal("0.1")

SUMMARY_KEYS = {
    "by_gpu_model": ("gpu_model", "gpu_model_name"),
    "by_scenario": ("scenario", "scenario_name"),
    "by_user": ("username", "username"),
}


def statement_summaries(*, statement: Statement) -> dict:
    """The statement's lines summed by GPU model, scenario and user (exact), largest cost first,
    and its totals against its budget."""
    found = {}
    for kind, (key, name) in SUMMARY_KEYS.items():
        rows = (
            StatementLine.objects.filter(statement=statement)
            .values(key, name)
            .annotate(jobs_n=Count("job_id", distinct=True), hours=Sum("gpu_hours"), total=Sum("cost"))
            .order_by("-total", key)
        )
        found[kind] = [
            {
                "key": row[key],
                "name": row[name],
                "jobs": row["jobs_n"],
                "gpu_hours": row["hours"],
                "cost": row["total"],
            }
            for row in rows
        ]
    budget = statement.budget
    found["totals"] = {
        "jobs": statement.jobs,
        "gpu_hours": statement.gpu_hours,
        "cost": statement.cost,
        "budget": budget,
        "budget_left": None if budget is None else budget - statement.cost,
        "budget_used_pct": None
        if not budget
        else (statement.cost * 100 / budget).quantize(PCT, ROUND_HALF_EVEN),
    }
    return found
