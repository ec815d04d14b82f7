"""A tenant's statements pages: the list, one statement with its sums, charts and downloads
(Django's test client for who sees what, headless Chromium for the page as a person uses it)."""

import pytest
from playwright.sync_api import expect

from reports.statements import statement_make
from tests.browser import browser_page, log_in, outside_the_browser, screenshot
from tests.statements_support import MARCH, at, make_march

pytestmark = pytest.mark.django_db


@pytest.fixture
def statement(tenant, catalog, make_job):
    make_march(tenant, catalog[1], make_job)
    made, _ = statement_make(tenant=tenant, month=MARCH, now=at(2, 0, month=4))
    return made


def test_a_viewer_reads_the_list_and_the_statement_by_month_or_id(web, viewer, statement):
    client = web(viewer)
    listing = client.get("/t/protein-lab/statements/")
    assert listing.status_code == 200
    assert 'href="/t/protein-lab/statements/2025-03/"' in listing.content.decode()
    assert "CN¥615.12" in listing.content.decode()
    for key in ("2025-03", str(statement.pk)):
        page = client.get(f"/t/protein-lab/statements/{key}/")
        assert page.status_code == 200
        html = page.content.decode()
        assert 'data-total="cost">CN¥615.12<' in html
        assert f"/api/v1/statements/{statement.pk}/pdf/?lang=zh-hans" in html
    assert client.get("/t/protein-lab/statements/2025-04/").status_code == 404
    assert client.get("/t/protein-lab/statements/0000-01/").status_code == 404  # no such month: not a 500


def test_an_outsider_gets_404_for_the_tenants_statements(web, outsider, statement):
    client = web(outsider)
    assert client.get("/t/protein-lab/statements/").status_code == 404
    assert client.get(f"/t/protein-lab/statements/{statement.pk}/").status_code == 404
    assert client.get(f"/t/other-team/statements/{statement.pk}/").status_code == 404


def test_a_member_opens_a_statement_sees_its_charts_and_downloads_its_pdf_in_chromium(
    live_server, member, statement
):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.get_by_role("navigation", name="Team pages").get_by_role("link", name="Statements").click()
        page.wait_for_url(f"{base}/t/protein-lab/statements/")
        row = page.locator("#statement-rows tr[data-month='2025-03']")
        expect(row).to_contain_text("CN¥615.12")
        row.get_by_role("link", name="2025-03").click()
        page.wait_for_url(f"{base}/t/protein-lab/statements/2025-03/")
        expect(page.locator("[data-total=cost]")).to_have_text("CN¥615.12")
        expect(page.locator("#statement-sums tr[data-by=user]")).to_have_count(2)
        expect(page.locator("#chart-by-gpu-model")).to_have_attribute("data-drawn", "1")
        expect(page.locator("#chart-by-user")).to_have_attribute("data-drawn", "1")
        expect(page.locator("#statement-lines tbody tr")).to_have_count(5)
        href = page.get_by_role("link", name="PDF (简体中文)").get_attribute("href")
        pdf = page.request.get(f"{base}{href}")
        assert pdf.status == 200 and pdf.headers["content-type"] == "application/pdf"
        assert pdf.body().startswith(b"%PDF")
        kept = outside_the_browser(lambda: statement.lines.count())
        assert kept == 5
        screenshot(page, "statement")
