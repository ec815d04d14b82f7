"""What a tenant's budgets (billing/models.py, Budget) have spent, the hard budget's refusal of a
new job, and the 50/80/100 % notices.

Spent counts the cost (jobs/costs.py, at the price book) of the GPU-hours charged in the budget's
period — a monthly budget: the calendar month in the site's time zone, each run cut at the
month's bounds; a budget per grant: every job on the grant — and, as `reserved`, what the
GPU-hours still held by the running and waiting jobs of that period or grant would cost at
today's prices. The percent, the thresholds and a hard budget's check all judge the two
together. Money stays an exact Decimal here; billing/money.py rounds it where it is shown."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from kombu.exceptions import OperationalError

from billing import money
from billing.models import THRESHOLDS, Budget, BudgetNotice, BudgetPeriod
from billing.pricing import ZERO, PriceBook, midnight, month_start, next_month
from clusters.backends.base import JobState
from jobs.costs import attempts_prefetch, charges_of, cost_of, reserved_cost
from jobs.models import Job
from portal.core.errors import PortalError
from portal.core.services import audit_record
from tenants.mail import mail_on_commit
from tenants.models import QuotaGrant, Tenant
from tenants.selectors import tenant_manager_emails

log = logging.getLogger(__name__)

# The jobs whose GPU-hours are still reserved: waiting in the portal or the scheduler, running, or
# being cancelled (until the scheduler confirms the end, the reservation stays).
HOLDING = (JobState.QUEUED, JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING, JobState.CANCELLING)
NOTIFY_TASK = "jobs.tasks.check_budgets"
HUNDRED = Decimal(100)


class BudgetExhausted(PortalError):
    """409 `budget_exhausted`: a hard budget that the new job would pass; its figures ride along."""

    code = "budget_exhausted"


@dataclass(frozen=True)
class BudgetStatus:
    """A budget in its current period: `spent` charged so far, `reserved` held by waiting and
    running jobs; `left` and `percent` judge both."""

    budget: Budget
    period_start: date
    period_end: date | None  # the first day after a month; a grant's last day
    spent: Decimal
    reserved: Decimal

    @property
    def total(self) -> Decimal:
        return self.spent + self.reserved

    @property
    def left(self) -> Decimal:
        return self.budget.amount - self.total

    @property
    def percent(self) -> Decimal:
        return self.total * HUNDRED / self.budget.amount


def _period(budget: Budget, today: date) -> tuple[date, date | None]:
    if budget.period == BudgetPeriod.MONTH:
        return month_start(today), next_month(today)
    return budget.grant.starts_on, budget.grant.ends_on


def _jobs(budget: Budget, start: date, end: date | None) -> QuerySet[Job]:
    """The jobs that may have been charged in the period or hold GPU-hours now."""
    jobs = Job.objects.prefetch_related(attempts_prefetch()).only(
        "state", "started_at", "gpu_hours", "reserved_gpu_hours", "gpus", "device_fraction", "attempt",
        "gpu_model_id", "share", "tier",
    )  # fmt: skip
    if budget.period == BudgetPeriod.GRANT:
        return jobs.filter(grant_id=budget.grant_id)
    # A job is made before any of its runs starts, and ends after all of them.
    return jobs.filter(tenant_id=budget.tenant_id, created__lt=midnight(end)).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gte=midnight(start))
    )


def budget_status(
    *, budget: Budget, book: PriceBook | None = None, now: datetime | None = None
) -> BudgetStatus:
    """The budget's figures in its current period (a budget per grant: the grant's life)."""
    book = book or PriceBook.load()
    now = now or timezone.now()
    start, end = _period(budget, timezone.localdate(now))
    spent = reserved = ZERO
    if budget.period == BudgetPeriod.MONTH:
        bounds = (midnight(start), midnight(end))
        for job in _jobs(budget, start, end):
            charges = charges_of(job, book, now=now, cuts=bounds)
            spent += sum((c.cost for c in charges if bounds[0] <= c.start < bounds[1]), ZERO)
            if job.state in HOLDING:
                reserved += reserved_cost(job, book, now=now)
    else:
        for job in _jobs(budget, start, end):
            spent += cost_of(job, book, now=now)
            if job.state in HOLDING:
                reserved += reserved_cost(job, book, now=now)
    return BudgetStatus(budget, start, end, spent, reserved)


def budgets_of(*, tenant: Tenant, now: datetime | None = None) -> list[BudgetStatus]:
    """The tenant's budgets with their figures, the monthly one first; the caller scoped the
    tenant to what the user may see."""
    budgets = list(Budget.objects.filter(tenant=tenant).select_related("tenant", "grant"))
    if not budgets:  # the dashboard of a tenant without a budget reads no price list
        return []
    book = PriceBook.load()
    rows = [budget_status(budget=budget, book=book, now=now) for budget in budgets]
    return sorted(rows, key=lambda row: (row.budget.period != BudgetPeriod.MONTH, row.budget.pk))


def budget_of(*, tenant: Tenant, budget_id: int) -> Budget | None:
    return Budget.objects.filter(tenant=tenant, pk=budget_id).select_related("tenant", "grant").first()


def _applicable(tenant: Tenant, grant: QuotaGrant | None) -> QuerySet[Budget]:
    """The budgets a new job of the tenant on `grant` counts against: the month's and the grant's."""
    scope = Q(period=BudgetPeriod.MONTH) | (Q(grant=grant) if grant is not None else Q(pk__in=[]))
    return Budget.objects.filter(scope, tenant=tenant).select_related("tenant", "grant").order_by("id")


def budget_check(
    *,
    tenant: Tenant,
    grant: QuotaGrant | None,
    gpu_model_id: int,
    share: str,
    gpu_hours: Decimal,
    lock: bool = True,
) -> list[Budget]:
    """Refuse a new job (BudgetExhausted, 409) that a hard budget of its tenant cannot take: its
    spent and reserved, with what the job's GPU-hours would cost at today's prices, above the
    amount. Returns the budgets the job counts against, so that the caller asks for notices.

    With `lock` (a submission, inside its transaction) the budget rows are locked where a hard
    one applies: two submissions that each fit alone but not together would otherwise both read
    the spent before either's job is stored, and both pass. The second waits here for the first's commit
    and then reads its job among the reserved. A preview reads without locking."""
    budgets = list(_applicable(tenant, grant))
    if lock and any(budget.hard for budget in budgets):
        # Only where a hard budget applies: a tenant with soft budgets alone never queues its
        # submissions here. Read again under the lock (a change of `hard` takes it too).
        budgets = list(_applicable(tenant, grant).select_for_update(of=("self",)))
    if not any(budget.hard for budget in budgets):
        return budgets
    book, now = PriceBook.load(), timezone.now()
    rate = book.rate_at(gpu_model_id=gpu_model_id, share=share, tier=tenant.tier, moment=now)
    job_cost = gpu_hours * rate
    for budget in budgets:
        if not budget.hard:
            continue
        status = budget_status(budget=budget, book=book, now=now)
        if status.total + job_cost > budget.amount:
            raise BudgetExhausted(
                f"The {_name(budget)} of {tenant.slug} is {money.as_api(budget.amount)} "
                f"{money.currency()}: {money.as_api(status.total)} is spent or reserved and this job "
                f"would cost {money.as_api(job_cost)}.",
                extra={
                    "budget": str(budget.pk),
                    "period": budget.period,
                    "period_start": status.period_start.isoformat(),
                    "amount": money.as_api(budget.amount),
                    "spent": money.as_api(status.spent),
                    "reserved": money.as_api(status.reserved),
                    "job_cost": money.as_api(job_cost),
                    "currency": money.currency(),
                },
            )
    return budgets


def _name(budget: Budget) -> str:
    return "monthly budget" if budget.period == BudgetPeriod.MONTH else f"budget of grant {budget.grant_id}"


def budgets_notify_later(*, tenant_id: int) -> None:
    """After the caller's commit, a look at the tenant's budgets for notices (check_budgets).
    A broker that is down costs this look only: beat's next one catches up."""

    def send() -> None:
        try:
            current_app.send_task(NOTIFY_TASK, kwargs={"tenant_id": tenant_id}, ignore_result=True)
        except OperationalError as exc:
            log.warning("broker unreachable, budget notices of tenant %s left to beat: %s", tenant_id, exc)

    transaction.on_commit(send)


def budgets_notify(*, tenant_id: int | None = None, now: datetime | None = None) -> int:
    """Tell each budget's tenant (its owners and managers by mail, an audit event
    `budget.threshold` that its webhooks deliver) once per period of each threshold of
    THRESHOLDS its spent and reserved reach. Thresholds passed at once are recorded each, and
    told once, at the highest. Every tenant's budgets, or one's; returns how many were told.
    A budget per grant is looked at while its grant has not ended."""
    now = now or timezone.now()
    today = timezone.localdate(now)
    budgets = Budget.objects.filter(Q(period=BudgetPeriod.MONTH) | Q(grant__ends_on__gte=today))
    if tenant_id is not None:
        budgets = budgets.filter(tenant_id=tenant_id)
    book, told = PriceBook.load(), 0
    for budget in budgets.select_related("tenant", "grant").order_by("id"):
        status = budget_status(budget=budget, book=book, now=now)
        reached = [t for t in THRESHOLDS if status.percent >= t]
        if reached and _notice(status, reached):
            told += 1
    return told


@transaction.atomic
def _notice(status: BudgetStatus, reached: list[int]) -> bool:
    budget = status.budget
    # The unique constraint makes a notice once per threshold and period, whoever runs at once.
    new = [
        threshold
        for threshold in reached
        if BudgetNotice.objects.get_or_create(
            budget=budget, period_start=status.period_start, threshold=threshold,
            defaults={"spent": status.total},
        )[1]
    ]  # fmt: skip
    if not new:
        return False
    threshold, currency = max(new), money.currency()
    mail_on_commit(
        template="budget_threshold",
        to=tenant_manager_emails(tenant=budget.tenant),
        context={
            "budget": budget, "threshold": threshold, "period_start": status.period_start,
            "amount": money.as_text(budget.amount, settings.MAIL_LANGUAGE),
            "spent": money.as_text(status.spent, settings.MAIL_LANGUAGE),
            "reserved": money.as_text(status.reserved, settings.MAIL_LANGUAGE),
            "hard": budget.hard,
        },
    )  # fmt: skip
    audit_record(
        actor=None, action="budget.threshold", target=budget, tenant=budget.tenant,
        data={"threshold": threshold, "period": budget.period, "grant": budget.grant_id,
              "amount": money.as_api(budget.amount), "spent": money.as_api(status.total),
              "currency": currency, "period_start": status.period_start.isoformat()},
    )  # fmt: skip
    return True
