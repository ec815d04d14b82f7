"""The login page and the home page in a real headless Chromium against a live server."""

import os

import pytest

from tests.browser import browser_page, screenshot
from tests.factories import PASSWORD

# Playwright's sync API runs an event loop in this thread; the ORM calls below happen before
# and after it, never inside a request, so the guard has nothing to protect here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def seeded(transactional_db, owner):
    return owner


def test_login_by_keyboard_lands_on_the_home_page_with_the_users_teams(live_server, seeded):
    with browser_page() as page:
        page.goto(f"{live_server.url}/")
        assert page.url.startswith(f"{live_server.url}/accounts/login/")
        screenshot(page, "login")
        # Labels are wired to their inputs, so assistive technology and get_by_label find them.
        page.get_by_label("Username").fill("owner")
        page.get_by_label("Password").fill(PASSWORD)
        page.keyboard.press("Enter")
        # The home page sends a user with a team to that team's dashboard.
        page.wait_for_url(f"{live_server.url}/t/protein-lab/")
        assert page.get_by_role("heading", level=1).inner_text() == "Protein Lab"
        assert page.locator(".role-badge").inner_text() == "Owner"
        screenshot(page, "home")
        page.get_by_role("button", name="Log out").click()
        page.wait_for_url(f"{live_server.url}/accounts/login/")


def test_wrong_password_shows_an_error_and_no_session(live_server, seeded):
    with browser_page() as page:
        page.goto(f"{live_server.url}/accounts/login/")
        page.get_by_label("Username").fill("owner")
        page.get_by_label("Password").fill("not the password")
        page.get_by_role("button", name="Log in").click()
        alert = page.get_by_role("alert")
        assert "didn't match" in alert.inner_text()
        screenshot(page, "login-error")
        page.goto(f"{live_server.url}/")
        assert "/accounts/login/" in page.url
