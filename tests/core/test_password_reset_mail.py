"""The password reset mail leaves the request: the page's answer and the work done before it
are the same for an address with an account and one without (no query of the users at all),
the mail goes through the broker to a real worker, and requests are counted per client address
and per address typed."""

import time

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from tests.conftest import start_celery_worker, stop
from tests.factories import UserFactory
from tests.password_reset_support import DONE, NEW_PASSWORD, RESET, reset_link, set_password

RATES = {"user": "1000/min", "anon": "1000/min", "token": "1000/min", "member_lookup": "20/hour"}


@pytest.fixture
def mail_worker(transactional_db, tmp_path, monkeypatch):
    """A real Celery worker that writes its mail as files into tmp_path/mail (EMAIL_URL)."""
    from portal.celery import app

    monkeypatch.setenv("EMAIL_URL", f"file://{tmp_path / 'mail'}")
    app.control.purge()
    proc = start_celery_worker(tmp_path / "worker.log")
    yield tmp_path / "mail"
    stop(proc)


def _mails(folder, timeout_s: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = sorted(folder.glob("*.log")) if folder.exists() else []
        if files:
            return [f.read_text() for f in files]
        time.sleep(0.2)
    return []


def test_known_and_unknown_addresses_get_the_same_answer_after_the_same_work(client, mail_worker):
    UserFactory(username="alice", email="alice@example.org")
    answers = {}
    for email in ("nobody@example.org", "alice@example.org"):
        with CaptureQueriesContext(connection) as queries:
            answers[email] = client.post(RESET, {"email": email})
        # The request reads no user: whether one has this address is the worker's question.
        assert not [q["sql"] for q in queries.captured_queries if "auth_user" in q["sql"]]
    unknown, known = answers.values()
    assert (unknown.status_code, unknown["Location"]) == (known.status_code, known["Location"]) == (302, DONE)
    assert unknown.content == known.content
    # The mail arrives, through the broker and the worker: one, to alice.
    mails = _mails(mail_worker)
    assert len(mails) == 1, mails
    assert "To: alice@example.org" in mails[0] and "/accounts/reset/" in mails[0]
    assert "Hello alice," in mails[0]


@pytest.fixture
def eager_tasks(db):
    """The mail task runs in the test's process (its outbox), as in tests/pages/test_pages_password_reset.py."""
    from portal.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_requests_are_counted_per_address_typed(client, eager_tasks):
    with override_settings(
        API_THROTTLE_RATES=RATES | {"reset_address": "100/hour", "reset_account": "2/hour"}
    ):
        for _ in range(2):
            assert client.post(RESET, {"email": "someone@example.org"}).status_code == 302
        refused = client.post(RESET, {"email": "SOMEONE@example.org "})
        other = client.post(RESET, {"email": "else@example.org"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "Too many requests for a new password." in refused.content.decode()
    assert other.status_code == 302


def test_requests_are_counted_per_client_address(client, eager_tasks):
    with override_settings(
        API_THROTTLE_RATES=RATES | {"reset_address": "3/hour", "reset_account": "100/hour"}
    ):
        for n in range(3):
            assert (
                client.post(RESET, {"email": f"a{n}@example.org"}, REMOTE_ADDR="10.7.0.1").status_code == 302
            )
        refused = client.post(RESET, {"email": "a9@example.org"}, REMOTE_ADDR="10.7.0.1")
        elsewhere = client.post(RESET, {"email": "a9@example.org"}, REMOTE_ADDR="10.7.0.2")
    assert refused.status_code == 429 and elsewhere.status_code == 302


def test_a_new_password_set_through_the_mail_ends_a_login_lock(client, eager_tasks, mailoutbox):
    UserFactory(username="alice", email="alice@example.org")
    for _ in range(5):
        client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    assert client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 429
    client.post(RESET, {"email": "alice@example.org"})
    assert set_password(client, reset_link(mailoutbox[0])).status_code == 302
    logged_in = client.post("/accounts/login/", {"username": "alice", "password": NEW_PASSWORD})
    assert logged_in.status_code == 302
