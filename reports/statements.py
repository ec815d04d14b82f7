"""Monthly statements: made once per tenant and month, after the month has ended, and kept as made.

A statement's lines are every charge of every job of the tenant that falls in the month
(billing/pricing.py cuts a job's runs at each price change and at the month's bounds; a job still
running at the month's end counts up to that end). Its totals are the exact sums of its lines;
nothing is rounded until it is shown (billing/money.py). Rows once written never change: the
guards below refuse a save of an existing row and any delete (`mailed_at` alone is set, by a
conditional UPDATE)."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.models import Budget, BudgetPeriod
from billing.money import as_text, currency, rounded
from billing.pricing import ZERO, PriceBook, midnight, month_start, next_month
from jobs.costs import charges_of, earlier_attempts
from portal.core.errors import Conflict, Invalid
from reports.exports import csv_bytes, xlsx_bytes
from reports.models import Statement, StatementLine
from reports.selectors import (
    jobs_in_month,
    owner_emails,
    statement_lines,
    statement_summaries,
    tenant_ids_due,
)
from tenants.mail import mail_on_commit
from tenants.models import QuotaGrant, Tenant

log = logging.getLogger(__name__)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """[the month's first midnight, the next month's) in the site's time zone."""
    return midnight(month_start(month)), midnight(next_month(month_start(month)))


def month_ended(month: date, *, now: datetime | None = None) -> bool:
    return month_bounds(month)[1] <= (now or timezone.now())


def last_month(*, now: datetime | None = None) -> date:
    """The month before the one `now` falls in, site time."""
    first = month_start(timezone.localdate(now or timezone.now()))
    return month_start(first - timedelta(days=1))


@transaction.atomic
def statement_make(*, tenant: Tenant, month: date, now: datetime | None = None) -> tuple[Statement, bool]:
    """The tenant's statement of the month, made now if it was not yet: (statement, made).
    Refuses (Invalid) a month that has not ended. Safe to call twice, and at once: the tenant's
    row is locked while the month's statement is looked for and made."""
    month = month_start(month)
    start, end = month_bounds(month)
    if end > (now or timezone.now()):
        raise Invalid({"month": "The month has not ended yet; its statement is made once it has."})
    # Two callers at once (beat and a platform admin): the second waits here, then finds the first's.
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    existing = Statement.objects.filter(tenant=tenant, month=month).first()
    if existing is not None:
        return existing, False

    book = PriceBook.load()
    jobs = list(jobs_in_month(tenant_id=tenant.pk, start=start, end=end))
    attempts = earlier_attempts(job.pk for job in jobs)
    lines = []
    for job in jobs:
        # A job still running counts up to the month's end: `now` is that end.
        charges = charges_of(job, book, attempts=attempts.get(job.pk, []), now=end, cuts=(start, end))
        for charge in charges:
            if not start <= charge.start < end or charge.gpu_hours <= 0:
                continue
            lines.append(
                StatementLine(
                    job_id=job.pk,
                    job_name=job.name,
                    username=job.submitted_by.username if job.submitted_by_id else "",
                    gpu_model=job.gpu_model.slug,
                    gpu_model_name=job.gpu_model.name,
                    scenario=job.scenario.slug,
                    scenario_name=job.scenario.name,
                    cluster=job.cluster.slug,
                    partition=job.partition.name,
                    share=job.share,
                    tier=job.tier,
                    grant_id=job.grant_id,
                    start=charge.start,
                    end=charge.end,
                    gpu_hours=charge.gpu_hours,
                    unit_price=charge.unit,
                    multiplier=charge.multiplier,
                    cost=charge.cost,
                )
            )
    budget = (
        Budget.objects.filter(tenant=tenant, period=BudgetPeriod.MONTH)
        .values_list("amount", flat=True)
        .first()
    )
    statement = Statement.objects.create(
        tenant=tenant,
        tenant_slug=tenant.slug,
        tenant_name=tenant.name,
        month=month,
        currency=currency(),
        jobs=len({line.job_id for line in lines}),
        gpu_hours=sum((line.gpu_hours for line in lines), ZERO),
        cost=sum((line.cost for line in lines), ZERO),
        budget=budget,
        grants=_grants_of(tenant, month, lines),
    )
    for line in lines:
        line.statement = statement
    StatementLine.objects.bulk_create(lines, batch_size=1000)
    return statement, True


def _grants_of(tenant: Tenant, month: date, lines: list[StatementLine]) -> list[dict]:
    """The grants active on some day of the month and those its lines drew on, as they stand now,
    with what the month's lines drew on each."""
    last_day = next_month(month) - timedelta(days=1)
    hours, cost = defaultdict(lambda: ZERO), defaultdict(lambda: ZERO)
    for line in lines:
        hours[line.grant_id] += line.gpu_hours
        cost[line.grant_id] += line.cost
    grants = (
        QuotaGrant.objects.filter(tenant=tenant)
        .filter(Q(starts_on__lte=last_day, ends_on__gte=month) | Q(pk__in={line.grant_id for line in lines}))
        .select_related("scenario", "gpu_model")
        .order_by("starts_on", "id")
    )
    return [
        {
            "id": grant.pk,
            "scenario": grant.scenario.slug,
            "scenario_name": grant.scenario.name,
            "gpu_model": grant.gpu_model.slug,
            "gpu_model_name": grant.gpu_model.name,
            "share": grant.share,
            "gpus": grant.gpus,
            "gpu_hours": str(grant.gpu_hours),
            "starts_on": grant.starts_on.isoformat(),
            "ends_on": grant.ends_on.isoformat(),
            "gpu_hours_used": str(grant.gpu_hours_used),
            "month_gpu_hours": str(hours[grant.pk]),
            "month_cost": str(cost[grant.pk]),
        }
        for grant in grants
    ]


def statement_mail(*, statement_id: int, now: datetime | None = None) -> bool:
    """Mails the statement to its tenant's owners (MAIL_LANGUAGE), once: the conditional UPDATE of
    `mailed_at` lets one caller win. False when it had been mailed, or its tenant is gone or has
    no owner with an address (left unmailed: a later run mails it once one has)."""
    tenant_id = Statement.objects.filter(pk=statement_id).values_list("tenant_id", flat=True).first()
    to = owner_emails(tenant_id=tenant_id) if tenant_id else []
    if not to:
        return False
    with transaction.atomic():
        claimed = Statement.objects.filter(
            pk=statement_id, mailed_at__isnull=True, tenant__isnull=False
        ).update(mailed_at=now or timezone.now())
        if not claimed:
            return False
        statement = Statement.objects.get(pk=statement_id)
        page = f"/t/{statement.tenant_slug}/statements/{statement.month:%Y-%m}/"
        pdf = f"/api/v1/statements/{statement.pk}/pdf/"
        mail_on_commit(
            template="statement",
            to=to,
            context={
                "statement": statement,
                "month": f"{statement.month:%Y-%m}",
                "cost": as_text(statement.cost, settings.MAIL_LANGUAGE),
                "budget": as_text(statement.budget, settings.MAIL_LANGUAGE),
                "page_path": page,
                "pdf_path": pdf,
                "pdf_lang": settings.MAIL_LANGUAGE,
            },
        )
    return True


def statements_make_due(*, now: datetime | None = None) -> dict[str, int]:
    """Last month's statements of every tenant that had jobs in it or has a monthly budget (each in
    its own transaction, so that one tenant's failure stops no other), then the mail of every
    statement of that month not mailed yet. Safe to run again: made ones are found, mailed ones
    are not mailed twice."""
    month = last_month(now=now)
    start, end = month_bounds(month)
    made = failed = mailed = 0
    for tenant in Tenant.objects.filter(pk__in=tenant_ids_due(start=start, end=end)).order_by("pk"):
        try:
            _statement, new = statement_make(tenant=tenant, month=month, now=now)
        except Exception:  # one tenant's bad row must not keep every other tenant's statement back
            log.exception("statement of %s for %s failed", tenant.slug, month)
            failed += 1
            continue
        made += new
    for statement_id in Statement.objects.filter(month=month, mailed_at__isnull=True).values_list(
        "pk", flat=True
    ):
        mailed += statement_mail(statement_id=statement_id, now=now)
    return {"made": made, "failed": failed, "mailed": mailed}


# --- As shown: on the page, in the PDF, in the downloads. Rounded here and only here.


def statement_view(statement: Statement, *, language: str) -> dict:
    """The statement's figures for a reader of `language`: each amount exact and as text."""
    summaries = statement_summaries(statement=statement)
    lines = list(statement_lines(statement=statement))

    def shown(row: dict) -> dict:
        return {**row, "cost_text": as_text(row["cost"], language)}

    totals = summaries["totals"]
    return {
        "month": f"{statement.month:%Y-%m}",
        "by_gpu_model": [shown(row) for row in summaries["by_gpu_model"]],
        "by_scenario": [shown(row) for row in summaries["by_scenario"]],
        "by_user": [shown(row) for row in summaries["by_user"]],
        "totals": {
            **totals,
            "cost_text": as_text(totals["cost"], language),
            "budget_text": as_text(totals["budget"], language),
            "budget_left_text": as_text(totals["budget_left"], language),
        },
        "lines": [{"line": line, "cost_text": as_text(line.cost, language)} for line in lines],
        "grants": statement.grants,
    }


LINE_HEADERS = (
    "job_id", "job_name", "username", "gpu_model", "scenario", "cluster", "partition", "share", "tier",
    "grant_id", "start", "end", "gpu_hours", "unit_price", "multiplier", "cost", "cost_exact",
)  # fmt: skip
SUMMARY_HEADERS = ("key", "name", "jobs", "gpu_hours", "cost", "cost_exact")


def _exact(amount: Decimal | None) -> str:
    return "" if amount is None else format(amount.normalize(), "f")


def _line_rows(statement: Statement):
    for line in statement_lines(statement=statement):
        yield (
            line.job_id, line.job_name, line.username, line.gpu_model, line.scenario, line.cluster,
            line.partition, line.share, line.tier, line.grant_id, line.start, line.end, line.gpu_hours,
            line.unit_price, line.multiplier, rounded(line.cost), _exact(line.cost),
        )  # fmt: skip


def statement_filename(statement: Statement) -> str:
    """Ours: the tenant's slug (a validated slug) and the month."""
    return f"statement-{statement.tenant_slug}-{statement.month:%Y-%m}"


def statement_csv(statement: Statement) -> bytes:
    """The lines, one row each: amounts rounded to the cent (half to even) and exact."""
    return csv_bytes(LINE_HEADERS, _line_rows(statement))


def statement_xlsx(statement: Statement) -> bytes:
    """Sheets: the totals, the lines, and the sums by GPU model, scenario and user."""
    summaries = statement_summaries(statement=statement)
    totals = summaries["totals"]

    def summary(rows):
        return [
            (r["key"], r["name"], r["jobs"], r["gpu_hours"], rounded(r["cost"]), _exact(r["cost"]))
            for r in rows
        ]

    sheets = {
        "Statement": (
            ("tenant", "month", "currency", "jobs", "gpu_hours", "cost", "cost_exact", "budget"),
            [
                (
                    statement.tenant_slug,
                    f"{statement.month:%Y-%m}",
                    statement.currency,
                    totals["jobs"],
                    totals["gpu_hours"],
                    rounded(totals["cost"]),
                    _exact(totals["cost"]),
                    totals["budget"],
                )
            ],
        ),
        "Lines": (LINE_HEADERS, _line_rows(statement)),
        "By GPU model": (SUMMARY_HEADERS, summary(summaries["by_gpu_model"])),
        "By scenario": (SUMMARY_HEADERS, summary(summaries["by_scenario"])),
        "By user": (SUMMARY_HEADERS, summary(summaries["by_user"])),
    }
    return xlsx_bytes(sheets)


# --- Kept as made: connected in reports/apps.py to pre_save and pre_delete of both models.


def refuse_change(sender, instance, **kwargs) -> None:
    """A statement or line once written is never saved again (Conflict)."""
    if instance.pk is not None and not instance._state.adding:
        raise Conflict("A statement is kept as it was made; it never changes.")


def refuse_delete(sender, instance, **kwargs) -> None:
    raise Conflict("A statement is kept as it was made; it is never deleted.")
