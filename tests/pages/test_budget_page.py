"""The budget page: in Chromium an owner sets a hard monthly budget and sees its bar on the page
and on the dashboard; through Django's client a viewer reads it without the form, a member's
write is a 403, bad input stays on the form with the field's error, and a budget is removed."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing.models import Budget
from clusters.backends.base import JobState
from portal.core.models import AuditEvent
from tests.browser import browser_page, log_in, screenshot
from tests.budgets_support import priced

PAGE = "/t/protein-lab/budget/"


def test_an_owner_sets_a_hard_budget_and_sees_its_bar(live_server, owner, member, make_job, catalog):
    priced(catalog[1])
    # 300.00 spent; an ended job, so that no page polls while the browser closes
    make_job(member, state=JobState.COMPLETED, started_at=timezone.now() - timedelta(minutes=1),
             finished_at=timezone.now(), gpu_hours=Decimal(30))  # fmt: skip
    with browser_page() as page:
        log_in(page, live_server.url, "owner")
        page.get_by_role("link", name="Budget", exact=True).click()
        expect(page.get_by_text("Your team has no budget.")).to_be_visible()
        page.get_by_label("Budget for").select_option("month")
        page.get_by_label("Amount").fill("1200")
        page.get_by_label("Hard: refuse new jobs").check()
        page.get_by_role("button", name="Save budget").click()
        expect(page.get_by_role("status")).to_contain_text("The budget is saved.")
        bar = page.get_by_role("meter")
        expect(bar).to_have_attribute("aria-valuetext", "CN¥300.00 spent and CN¥0.00 reserved of CN¥1,200.00")
        expect(page.locator("article.budget")).to_contain_text("25.0 % spent or reserved; CN¥900.00 left")
        expect(page.locator("article.budget")).to_contain_text("Hard: new jobs are refused")
        screenshot(page, "budget")
        page.get_by_role("link", name="Dashboard").click()
        expect(page.locator("#budget-panel").get_by_role("meter")).to_have_attribute("aria-valuenow", "300.0")
    budget = Budget.objects.get()
    assert (budget.period, budget.amount, budget.hard) == ("month", Decimal(1200), True)


@pytest.mark.django_db
def test_a_viewer_reads_a_member_may_not_write_and_bad_input_stays(web, tenant, owner, viewer, member):
    budget = Budget.objects.create(tenant=tenant, period="month", amount=Decimal(50))
    page = web(viewer).get(PAGE)
    assert (
        page.status_code == 200 and b"CN\xc2\xa550.00" in page.content and b"save-budget" not in page.content
    )
    assert web(member).post(PAGE, {"target": "month", "amount": "10"}).status_code == 403
    bad = web(owner).post(PAGE, {"target": "month", "amount": "-3"})
    assert bad.status_code == 400 and bad.context["form"].errors.keys() == {"amount"}
    assert web(owner).post(PAGE, {"target": "grant-999", "amount": "3"}).context["form"].errors.keys() == {
        "target"
    }
    assert Budget.objects.get().amount == Decimal(50)
    assert web(owner).post(PAGE, {"target": "month", "amount": "75.5"}).status_code == 302
    assert Budget.objects.get().amount == Decimal("75.5")
    assert web(owner).post(PAGE, {"remove": str(budget.pk)}).status_code == 302
    assert not Budget.objects.exists()
    assert list(AuditEvent.objects.filter(action__startswith="budget.").order_by("id").values_list("action", flat=True)) == [
        "budget.change", "budget.delete"
    ]  # fmt: skip


@pytest.mark.django_db
def test_another_tenants_page_is_404(web, outsider):
    assert web(outsider).get(PAGE).status_code == 404
