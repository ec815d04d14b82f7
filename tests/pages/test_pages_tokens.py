"""The personal API tokens page /account/tokens/: a token made in Chromium is shown once and
works against the API with its scope; revoked, it stops working; bad input is named."""

import re

import pytest
from playwright.sync_api import expect
from rest_framework.test import APIClient

from portal.core.models import ApiToken
from tests.browser import browser_page, log_in, outside_the_browser, screenshot

URL = "/account/tokens/"


def _api(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_member_makes_a_read_token_in_the_browser_uses_it_and_revokes_it(live_server, member, tenant):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.get_by_role("link", name="API tokens").click()
        page.wait_for_url(f"{base}{URL}")
        page.get_by_label("Name").fill("workflow server")
        page.get_by_label("Scope").select_option("read")
        expect(page.get_by_label("Expires in (days)")).to_have_value("90")
        page.get_by_label("Expires in (days)").fill("30")
        page.get_by_role("button", name="Create token").click()
        key = page.locator("#new-token-key").inner_text().strip()
        expect(page.locator("#new-token")).to_contain_text("shown this once")
        screenshot(page, "tokens-created")
        assert re.fullmatch(r"[\w-]{43}", key)
        row = page.locator("#token-rows tr").filter(has_text="workflow server")
        expect(row).to_contain_text("read")
        client = _api(key)
        assert outside_the_browser(lambda: client.get("/api/v1/me/").status_code) == 200
        assert outside_the_browser(lambda: client.post("/api/v1/jobs/", {}).json()["code"]) == "token_scope"
        page.goto(f"{base}{URL}")  # the key is not on the page any more
        expect(page.locator("#new-token-key")).to_have_count(0)
        assert key not in page.content()
        row.get_by_role("button", name="Revoke").click()
        expect(page.get_by_role("status").or_(page.locator(".msg-success"))).to_contain_text("revoked")
        assert outside_the_browser(lambda: client.get("/api/v1/me/").status_code) == 401


@pytest.mark.django_db
def test_bad_input_is_named_and_admin_scope_is_not_offered_to_members(web, member, settings):
    client = web(member)
    page = client.get(URL).content.decode()
    assert 'value="admin"' not in page and 'value="submit"' in page
    response = client.post(f"{URL}new/", {"name": "x", "scope": "admin", "expires_in_days": "7"})
    assert response.status_code == 400 and "scope" in response.context["form"].errors
    response = client.post(f"{URL}new/", {"name": "x", "scope": "read", "expires_in_days": "400"})
    assert response.status_code == 400 and "expires_in_days" in response.context["form"].errors
    response = client.post(f"{URL}new/", {"name": "", "scope": "read", "expires_in_days": "7"})
    assert response.status_code == 400 and "name" in response.context["form"].errors
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_another_users_token_cannot_be_revoked(web, member, outsider):
    from portal.core.tokens import token_create

    theirs, _ = token_create(user=outsider, name="theirs")
    assert web(member).post(f"{URL}{theirs.pk}/revoke/").status_code == 404
    assert ApiToken.objects.filter(pk=theirs.pk).exists()
