"""The site report page (/reports/site/): platform staff only, its range form, tables, export
links and the nav link; in headless Chromium, its charts drawn by Chart.js."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing.models import Price
from billing.pricing import midnight
from jobs.models import JobState
from tests.browser import browser_page, screenshot
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db

DAY = timezone.localdate() - timedelta(days=1)


@pytest.fixture
def used(catalog, make_job, member):
    Price.objects.create(
        gpu_model=catalog[1], per_gpu_hour=Decimal("2.50"), effective_from=midnight(DAY) - timedelta(days=9)
    )
    start = midnight(DAY) + timedelta(hours=6)
    return make_job(
        member, state=JobState.COMPLETED, gpus=2, started_at=start, finished_at=start + timedelta(hours=3),
        gpu_hours=Decimal(6),
    )  # fmt: skip


def test_staff_read_the_report_and_others_are_refused(web, used, admin_user, owner):
    assert web(owner).get("/reports/site/").status_code == 403
    page = web(admin_user).get(f"/reports/site/?from={DAY}&to={DAY}")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/reports/site/"' in html  # the nav link
    assert 'id="usage-tenant"' in html and 'data-key="protein-lab"' in html
    assert page.context["report"].cost == Decimal(15)
    assert f"/api/v1/reports/site/xlsx/?from={DAY}&amp;to={DAY}" in html
    bad = web(admin_user).get("/reports/site/?from=2024-02-30")
    assert bad.status_code == 400 and "from" in bad.content.decode()


def test_the_page_draws_its_charts(live_server, used, admin_user):
    with browser_page() as page:
        page.goto(f"{live_server.url}/accounts/login/?next=/reports/site/%3Ffrom%3D{DAY}%26to%3D{DAY}")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{live_server.url}/reports/site/**")
        expect(page.get_by_role("heading", level=1)).to_have_text("Site report")
        for chart in ("site-hours-chart", "site-cost-chart", "site-util-chart", "site-tenants-chart"):
            expect(page.locator(f"canvas#{chart}[data-drawn]")).to_be_visible()
        expect(page.locator("#usage-tenant tr[data-key='protein-lab'] td").nth(2)).to_have_text("CN¥15.00")
        screenshot(page, "site-report")
