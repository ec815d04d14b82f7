"""Password reset by mail through Django's views, the mail sent by a Celery task: an unknown
address is answered exactly as a known one and gets no mail; the mailed link sets a new password once. And in a real browser,
from the login page's link to logging in with the new password."""

import os
import re

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tests.browser import browser_page, screenshot
from tests.factories import PASSWORD, UserFactory
from tests.password_reset_support import DONE, LINK, NEW_PASSWORD, RESET, reset_link, set_password

# Playwright's sync API runs an event loop in this thread; the ORM calls happen outside it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(autouse=True)
def _mail_task_runs_in_the_test():
    """The mail is a Celery task (portal.core.tasks.send_password_reset); here it runs in the
    test's process so that it lands in the locmem outbox. tests/core/test_password_reset_mail.py
    sends it through a real worker."""
    from portal.celery import app

    app.conf.task_always_eager, app.conf.task_eager_propagates = True, True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = False, False


@pytest.fixture
def alice(db):
    return UserFactory(username="alice", email="alice@example.org")


def test_the_login_page_links_to_the_reset_form(client, db):
    page = client.get("/accounts/login/").content.decode()
    assert f'<a href="{RESET}">Forgot your password?</a>' in page
    assert 'name="email"' in client.get(RESET).content.decode()


def test_an_unknown_address_gets_the_same_answer_as_a_known_one_and_no_mail(client, alice, mailoutbox):
    unknown = client.post(RESET, {"email": "nobody@example.org"})
    assert mailoutbox == []
    known = client.post(RESET, {"email": "alice@example.org"})
    assert len(mailoutbox) == 1
    assert (unknown.status_code, unknown["Location"]) == (known.status_code, known["Location"]) == (302, DONE)
    done = client.get(DONE).content.decode()
    assert (
        "If an account has that email address, a mail with a link to set a new password is on its way."
        in done
    )
    assert "alice" not in done


def test_a_known_address_gets_one_mail_with_a_link(client, alice, mailoutbox):
    client.post(RESET, {"email": "ALICE@example.org"})  # the address matches whatever its case
    assert len(mailoutbox) == 1
    message = mailoutbox[0]
    assert message.to == ["alice@example.org"] and message.from_email == settings.DEFAULT_FROM_EMAIL
    assert message.subject == "GPU portal: set a new password"
    assert "Hello alice," in message.body and "The link works once, for 72 hours." in message.body
    assert LINK.search(message.body).group(1) == "http://testserver"  # the host the request came to
    assert "&#x27;" not in message.body and "&amp;" not in message.body  # plain text, not HTML-escaped


def test_the_link_sets_a_new_password(client, alice, mailoutbox):
    client.post(RESET, {"email": "alice@example.org"})
    response = set_password(client, reset_link(mailoutbox[0]))
    assert response.status_code == 302 and response["Location"] == "/accounts/reset/done/"
    assert "Your new password is set. Log in with it." in client.get(response["Location"]).content.decode()
    alice.refresh_from_db()
    assert alice.check_password(NEW_PASSWORD) and not alice.check_password(PASSWORD)
    client.logout()
    assert client.login(username="alice", password=NEW_PASSWORD)


def test_passwords_that_differ_are_refused_next_to_the_field(client, alice, mailoutbox):
    client.post(RESET, {"email": "alice@example.org"})
    form_page = client.get(reset_link(mailoutbox[0]), follow=True)
    response = client.post(
        form_page.redirect_chain[-1][0], {"new_password1": NEW_PASSWORD, "new_password2": "something else 7"}
    )
    assert response.status_code == 200 and "new_password2" in response.context["form"].errors
    assert 'class="error field-error" id="id_new_password2-error-1"' in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_a_used_link_is_refused(client, alice, mailoutbox):
    client.post(RESET, {"email": "alice@example.org"})
    link = reset_link(mailoutbox[0])
    set_password(client, link)
    again = client.get(link, follow=True)
    assert again.context["validlink"] is False
    page = again.content.decode()
    assert "This link is not valid" in page and 'name="new_password1"' not in page
    assert f'href="{RESET}"' in page  # a way to ask for a new one
    # Posting a password through the used link changes nothing either.
    client.post(link, {"new_password1": "third horse 99 abc", "new_password2": "third horse 99 abc"})
    alice.refresh_from_db()
    assert alice.check_password(NEW_PASSWORD)


def test_a_user_resets_the_password_from_the_login_page_and_logs_in_with_it(live_server, member, mailoutbox):
    base = live_server.url
    with browser_page() as page:
        page.goto(f"{base}/accounts/login/")
        page.get_by_role("link", name="Forgot your password?").click()
        page.wait_for_url(f"{base}{RESET}")
        expect(page.get_by_role("heading", level=1)).to_have_text("Reset your password")
        screenshot(page, "password-reset")
        page.get_by_label("Email").fill("member@example.org")
        page.get_by_role("button", name="Send the link").click()
        page.wait_for_url(f"{base}{DONE}")
        expect(page.get_by_role("status")).to_contain_text("If an account has that email address")
        screenshot(page, "password-reset-done")

        # The live server runs in this process: its mail lands in the same locmem outbox.
        assert [m.to for m in mailoutbox] == [["member@example.org"]]
        host, path = LINK.search(mailoutbox[0].body).groups()
        assert host == base
        page.goto(host + path)
        # Django moves the token out of the address before the form shows.
        expect(page).to_have_url(re.compile(r"/accounts/reset/[\w-]+/set-password/$"))
        screenshot(page, "password-reset-confirm")
        page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
        page.get_by_label("New password confirmation").fill(NEW_PASSWORD)
        page.get_by_role("button", name="Set password").click()
        page.wait_for_url(f"{base}/accounts/reset/done/")
        expect(page.get_by_role("status")).to_have_text("Your new password is set. Log in with it.")
        screenshot(page, "password-reset-complete")

        page.get_by_role("link", name="Log in").click()
        page.wait_for_url(f"{base}/accounts/login/")
        page.get_by_label("Username").fill("member")
        page.get_by_label("Password", exact=True).fill(NEW_PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base}/t/protein-lab/")
        expect(page.get_by_role("heading", level=1)).to_have_text("Protein Lab")
    assert get_user_model().objects.get(username="member").check_password(NEW_PASSWORD)
