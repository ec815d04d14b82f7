"""Monthly statements (reports/statements.py): the lines of a month with a price change and jobs
across its end, exact totals, the split at the change, half-even rounding only where shown, kept
as made, and beat's task that makes and mails them once."""

from datetime import date
from decimal import Decimal

import pytest
from django.core import mail
from django.db import transaction
from django.db.models import Sum

from billing.models import Budget, BudgetPeriod
from billing.money import as_text
from portal.core.errors import Conflict, Invalid
from reports.models import Statement, StatementLine
from reports.statements import statement_make, statement_view, statements_make_due
from reports.tasks import statements_make_due as statements_make_due_task
from tests.statements_support import MARCH, TOTAL, at, make_march

pytestmark = pytest.mark.django_db


@pytest.fixture
def march(tenant, catalog, make_job):
    return make_march(tenant, catalog[1], make_job)


def made(tenant) -> Statement:
    statement, new = statement_make(tenant=tenant, month=MARCH, now=at(2, 0, month=4))
    assert new
    return statement


def lines_of(statement, name):
    return list(statement.lines.filter(job_name=name).order_by("start"))


def test_totals_are_the_exact_sums_of_the_lines(tenant, march):
    statement = made(tenant)
    sums = statement.lines.aggregate(cost=Sum("cost"), hours=Sum("gpu_hours"))
    assert statement.cost == sums["cost"] == TOTAL
    assert statement.gpu_hours == sums["hours"] == Decimal("54.0100")
    assert statement.jobs == 4  # February's job has no line
    assert statement.currency == "CNY" and statement.tenant_slug == "protein-lab"


def test_a_price_change_mid_job_splits_its_cost_at_the_change(tenant, march):
    before, after = lines_of(made(tenant), "across-change")
    assert (before.start, before.end, after.start, after.end) == (
        at(14, 12),
        at(15, 0),
        at(15, 0),
        at(15, 12),
    )
    assert (before.gpu_hours, before.unit_price, before.cost) == (Decimal(24), Decimal(10), Decimal(240))
    assert (after.gpu_hours, after.unit_price, after.cost) == (Decimal(24), Decimal("12.5"), Decimal(300))
    assert before.username == "alice" and before.gpu_model == "h100-80gb"


def test_a_job_across_the_months_end_counts_only_its_march_part(tenant, march):
    statement = made(tenant)
    (across,) = lines_of(statement, "across-end")
    assert (across.end, across.gpu_hours, across.cost) == (at(1, 0, month=4), Decimal(4), Decimal(50))
    (running,) = lines_of(statement, "running")  # still running: up to the month's end
    assert (running.gpu_hours, running.cost) == (Decimal(2), Decimal(25))


def test_rounding_is_half_even_and_only_where_shown(tenant, march):
    statement = made(tenant)
    (tiny,) = lines_of(statement, "tiny")
    assert tiny.cost == Decimal("0.125")  # kept exact
    view = statement_view(statement, language="en")
    assert view["totals"]["cost_text"] == "CN¥615.12"  # 615.125: half to even, not up
    assert statement_view(statement, language="zh-hans")["totals"]["cost_text"] == "¥615.12"
    assert [row["cost_text"] for row in view["lines"] if row["line"].job_name == "tiny"] == ["CN¥0.12"]
    assert as_text(Decimal("0.135"), "en") == "CN¥0.14"  # the other side of even


def test_summaries_sum_the_lines_by_gpu_model_scenario_and_user(tenant, march):
    view = statement_view(made(tenant), language="en")
    by_user = {row["key"]: row for row in view["by_user"]}
    assert by_user["alice"]["cost"] == Decimal("540.125") and by_user["alice"]["jobs"] == 2
    assert by_user["bob"]["cost"] == Decimal(75) and by_user["bob"]["jobs"] == 2
    assert [(row["key"], row["cost"]) for row in view["by_gpu_model"]] == [("h100-80gb", TOTAL)]
    assert [(row["key"], row["jobs"]) for row in view["by_scenario"]] == [("ai-training", 4)]


def test_budget_and_grants_are_copied_in(tenant, march):
    Budget.objects.create(tenant=tenant, period=BudgetPeriod.MONTH, amount=Decimal("1000.00"))
    statement = made(tenant)
    assert statement.budget == Decimal("1000.00")
    view = statement_view(statement, language="en")
    assert view["totals"]["budget_left"] == Decimal("384.875")
    assert view["totals"]["budget_used_pct"] == Decimal("61.5")
    (grant,) = statement.grants
    assert grant["gpu_model"] == "h100-80gb" and Decimal(grant["month_gpu_hours"]) == Decimal("54.0100")


def test_a_month_that_has_not_ended_is_refused(tenant, march):
    with pytest.raises(Invalid):
        statement_make(tenant=tenant, month=MARCH, now=at(31, 23))
    assert not Statement.objects.exists()


def test_making_twice_returns_the_statement_made_first(tenant, march):
    first = made(tenant)
    march.jobs["tiny"].delete()  # the past changes after the statement; the statement does not
    again, new = statement_make(tenant=tenant, month=date(2025, 3, 17), now=at(5, 0, month=5))
    assert not new and again.pk == first.pk and again.cost == TOTAL
    assert Statement.objects.count() == 1


def test_statements_and_lines_are_never_changed_or_deleted(tenant, march):
    statement = made(tenant)
    statement.cost = Decimal(1)
    with pytest.raises(Conflict):
        statement.save()
    line = statement.lines.first()
    line.cost = Decimal(0)
    with pytest.raises(Conflict):
        line.save()
    with pytest.raises(Conflict), transaction.atomic():  # Django deletes without a savepoint of its own
        statement.delete()
    assert Statement.objects.get().cost == TOTAL
    assert StatementLine.objects.filter(cost=0).count() == 0


def test_the_beat_task_makes_last_months_statements_once_and_mails_the_owners(
    tenant, owner, manager, other_tenant, march, settings, django_capture_on_commit_callbacks
):
    owner.email, manager.email = "owner@example.org", "manager@example.org"
    owner.save()
    manager.save()
    Budget.objects.create(tenant=other_tenant, period=BudgetPeriod.MONTH, amount=Decimal("50.00"))
    settings.SITE_URL = "https://portal.example.org"
    with django_capture_on_commit_callbacks(execute=True):
        assert statements_make_due(now=at(1, 1, month=4)) == {"made": 2, "failed": 0, "mailed": 1}
    ours = Statement.objects.get(tenant_slug="protein-lab")
    assert ours.month == MARCH and ours.mailed_at is not None
    theirs = Statement.objects.get(tenant_slug="other-team")
    assert theirs.cost == 0 and theirs.budget == Decimal("50.00") and theirs.jobs == 0
    assert theirs.mailed_at is None  # no owner with an address: left for a later run
    to_ours = [m for m in mail.outbox if "protein-lab" in m.subject]
    assert len(to_ours) == 1 and to_ours[0].to == ["owner@example.org"]  # owners, not managers
    assert "CN¥615.12" in to_ours[0].body
    assert f"https://portal.example.org/api/v1/statements/{ours.pk}/pdf/?lang=en" in to_ours[0].body
    # Again (a second run, or a worker that took the message twice): nothing made or mailed.
    with django_capture_on_commit_callbacks(execute=True):
        assert statements_make_due(now=at(1, 2, month=4)) == {"made": 0, "failed": 0, "mailed": 0}
    assert len(mail.outbox) == 1 and Statement.objects.count() == 2


def test_the_task_run_twice_makes_and_mails_once(tenant, owner, django_capture_on_commit_callbacks):
    owner.email = "owner@example.org"
    owner.save()
    Budget.objects.create(tenant=tenant, period=BudgetPeriod.MONTH, amount=Decimal("10.00"))
    with django_capture_on_commit_callbacks(execute=True):
        first = statements_make_due_task.run()
        second = statements_make_due_task.run()
    assert first == {"made": 1, "failed": 0, "mailed": 1}
    assert second == {"made": 0, "failed": 0, "mailed": 0}
    assert len(mail.outbox) == 1 and Statement.objects.get().cost == 0


def test_the_beat_entry_runs_daily_at_the_statement_hour_and_makes_up_a_missed_first(
    settings, march, tenant, owner, django_capture_on_commit_callbacks
):
    entry = settings.CELERY_BEAT_SCHEDULE["make-statements"]
    assert entry["task"] == "reports.tasks.statements_make_due"
    schedule = entry["schedule"]
    assert (schedule.hour, schedule.minute, len(schedule.day_of_month)) == (
        {settings.STATEMENT_HOUR},
        {0},
        31,
    )
    # Beat was down on April 1st: the run of the 3rd makes March's statement all the same.
    with django_capture_on_commit_callbacks(execute=True):
        assert statements_make_due(now=at(3, 1, month=4))["made"] == 1
    assert Statement.objects.get(tenant=tenant).month == MARCH
