"""The TCO page (/reports/tco/): platform admins only; a profile made and changed through its
forms, the example loaded by its button, and the chart drawn in headless Chromium."""

import re
from decimal import Decimal

import pytest

from reports.models import TcoProfile
from tests.browser import browser_page, outside_the_browser, screenshot
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db

URL = "/reports/tco/"


def new_profile(**overrides) -> dict:
    fields = {
        "name": "site", "cluster": "", "gpu_model": "h100-80gb", "nodes": "1", "gpus_per_node": "1",
        "node_price": "8760", "depreciation_years": "2", "power_w_per_gpu": "1000", "electricity_per_kwh": "0",
        "pue": "1.5", "staff_per_year": "4380", "space_per_year": "0",
    } | overrides  # fmt: skip
    data = {f"new-{k}": v for k, v in fields.items()}
    data |= {"new-cloud-TOTAL_FORMS": "3", "new-cloud-INITIAL_FORMS": "0", "new-cloud-0-provider": "cloud-a",
             "new-cloud-0-per_gpu_hour": "2.5"}  # fmt: skip
    return data


def test_only_platform_admins_see_the_page_and_its_link(web, admin_user, owner):
    assert web(owner).get(URL).status_code == 403
    assert 'href="/reports/tco/"' not in web(owner).get("/t/protein-lab/").content.decode()
    page = web(admin_user).get(URL)
    assert page.status_code == 200
    assert 'href="/reports/tco/"' in page.content.decode()


def test_a_profile_made_through_the_form_shows_its_figures(web, admin_user, catalog):
    client = web(admin_user)
    answer = client.post(URL, new_profile())
    profile = TcoProfile.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"{URL}?profile={profile.pk}"
    assert profile.node_price == Decimal("8760") and profile.cloud_prices.get().provider == "cloud-a"
    page = client.get(answer["Location"]).content.decode()
    # nothing ran: no cost per GPU-hour; break-even 8,760 / (8,760 × 2.50) = 40 %
    assert "no GPU-hour is delivered" in page
    assert re.search(
        r"<td>cloud-a</td>\s*<td class=\"num\">CN¥2\.50</td>\s*<td class=\"num\">40\.0 %</td>", page
    )
    assert "CN¥8,760.00" in page  # the yearly cost


def test_bad_figures_are_named_on_their_fields(web, admin_user, catalog):
    answer = web(admin_user).post(URL, new_profile(pue="0.8", **{"cluster": "no-such"}))
    assert answer.status_code == 400
    page = answer.content.decode()
    assert re.search(
        r'id="id_new-pue-errors"[^>]*><p class="error field-error"[^>]*>Ensure this value is greater', page
    )
    assert re.search(r'id="id_new-cluster-errors"[^>]*><p class="error field-error"', page)
    assert not TcoProfile.objects.exists()


def test_the_example_and_its_chart_in_chromium(live_server, admin_user, catalog):
    base = live_server.url
    with browser_page() as page:
        page.goto(f"{base}/accounts/login/?next={URL}")
        page.get_by_label("Username").fill(admin_user.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base}{URL}")
        page.get_by_label("Your currency per US dollar").fill("7")
        page.get_by_role("button", name="Load the example").click()
        page.wait_for_url(re.compile(r".*\?profile=[0-9]+$"))
        assert "no GPU-hour is delivered" in page.locator("#tco-cost-per-hour").inner_text()
        rows = page.locator("#tco-break-even tbody tr")
        assert rows.count() == 3
        # 539,153.28 × 7 / (280,320 × 2.99 × 7): the cluster breaks even with Lambda at 64.3 %
        assert "64.3 %" in page.locator("#tco-break-even").inner_text()
        # the chart: the cost curve, a line per cloud, a point per break-even
        page.wait_for_function("window.Chart && Chart.getChart(document.getElementById('tco-chart'))")
        datasets = page.evaluate("Chart.getChart(document.getElementById('tco-chart')).data.datasets.length")
        assert datasets == 1 + 3 + 3
        screenshot(page, "tco-example")
        page.locator("#id_edit-nodes").fill("8")
        page.locator("#tco-edit").get_by_role("button", name="Save").click()
        page.get_by_text("The TCO profile is saved.").wait_for()
        assert page.locator("#id_edit-nodes").input_value() == "8"
    profile = outside_the_browser(TcoProfile.objects.get)
    assert (profile.nodes, profile.node_price) == (8, Decimal("2100000.00"))
