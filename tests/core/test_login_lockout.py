"""Login lockout (portal/core/lockout.py, django-axes) on the login page, the admin console's
login and the API's token endpoint; the client address every counter keys on (NUM_PROXIES)."""

import re
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.test import RequestFactory, override_settings
from django.utils import timezone

from portal.core.throttles import TokenCreateThrottle, client_ip
from tests.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/"
TOKEN = "/api/v1/auth/token/"
RATES = {"user": "1000/min", "anon": "1000/min", "token": "1000/min", "member_lookup": "20/hour"}


@pytest.fixture(autouse=True)
def _roomy_token_throttle():
    """The token endpoint's own per-address throttle out of the way: the lockout is under test."""
    with override_settings(API_THROTTLE_RATES=RATES):
        yield


def login(client, url: str, username: str, password: str, address: str = "10.0.0.1"):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def assert_locked_page(response) -> None:
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 15 * 60
    page = response.content.decode()
    assert "Too many failed logins" in page and "Try again in 15 minutes." in page
    assert 'href="/accounts/password_reset/"' in page


@pytest.mark.parametrize("url", [LOGIN, ADMIN_LOGIN])
def test_five_wrong_passwords_lock_the_username_from_that_address(client, admin_user, member, url):
    username = "admin" if url == ADMIN_LOGIN else "member"
    for _ in range(4):
        assert login(client, url, username, "wrong").status_code == 200  # the form, with its error
    assert_locked_page(login(client, url, username, "wrong"))
    # Locked: the right password does not get in from there either.
    assert_locked_page(login(client, url, username, PASSWORD))
    assert "_auth_user_id" not in client.session
    # The same account from another address logs in: one address cannot lock it for everyone.
    assert login(client, url, username, PASSWORD, address="10.0.0.2").status_code == 302


def test_an_unknown_username_is_locked_exactly_as_a_known_one(client, member):
    answers = {}
    for username in ("member", "nobody-x"):
        for _ in range(4):
            login(client, LOGIN, username, "wrong")
        answers[username] = login(client, LOGIN, username, "wrong")
    assert answers["member"].status_code == answers["nobody-x"].status_code == 429
    assert _without_csrf(answers["member"]) == _without_csrf(answers["nobody-x"])


def _without_csrf(response) -> str:
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", response.content.decode())


def test_a_success_resets_the_count(client, member):
    for _ in range(4):
        login(client, LOGIN, "member", "wrong")
    assert login(client, LOGIN, "member", PASSWORD).status_code == 302
    client.logout()
    for _ in range(4):
        assert login(client, LOGIN, "member", "wrong").status_code == 200
    assert login(client, LOGIN, "member", PASSWORD).status_code == 302


def test_the_lock_ends_with_its_cool_off(client, member):
    for _ in range(5):
        login(client, LOGIN, "member", "wrong")
    assert login(client, LOGIN, "member", PASSWORD).status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert login(client, LOGIN, "member", PASSWORD).status_code == 302


@override_settings(LOGIN_ACCOUNT_FAILURE_LIMIT=8)
def test_guessing_spread_over_many_addresses_locks_the_username_at_its_higher_limit(client, member):
    for n in range(4):
        for _ in range(2):
            assert login(client, LOGIN, "member", "wrong", address=f"10.1.0.{n}").status_code in (200, 429)
    assert_locked_page(login(client, LOGIN, "member", PASSWORD, address="10.9.9.9"))
    # Another account is not touched.
    UserFactory(username="carol")
    assert login(client, LOGIN, "carol", PASSWORD, address="10.9.9.9").status_code == 302


@override_settings(LOGIN_ADDRESS_FAILURE_LIMIT=6)
def test_one_address_trying_many_usernames_is_locked_alone(client, member):
    for n in range(6):
        login(client, LOGIN, f"guess{n}", "wrong", address="10.2.0.1")
    assert_locked_page(login(client, LOGIN, "member", PASSWORD, address="10.2.0.1"))
    assert login(client, LOGIN, "member", PASSWORD, address="10.2.0.2").status_code == 302


def test_the_token_endpoint_counts_failures_per_account_and_answers_429_problem(anon_client, member):
    for _ in range(4):
        response = anon_client.post(
            TOKEN, {"username": "member", "password": "wrong"}, REMOTE_ADDR="10.3.0.1"
        )
        assert response.status_code == 400 and response.json()["code"] == "invalid"  # docs/api.md
    locked = anon_client.post(TOKEN, {"username": "member", "password": "wrong"}, REMOTE_ADDR="10.3.0.1")
    right = anon_client.post(TOKEN, {"username": "member", "password": PASSWORD}, REMOTE_ADDR="10.3.0.1")
    for response in (locked, right):
        assert response.status_code == 429
        assert response["Content-Type"] == "application/problem+json"
        body = response.json()
        assert body["code"] == "throttled" and body["status"] == 429
        assert int(response["Retry-After"]) == body["retry_after_s"] > 0
    assert "token" not in right.json()
    other = anon_client.post(TOKEN, {"username": "member", "password": PASSWORD}, REMOTE_ADDR="10.3.0.2")
    assert other.status_code == 201


def test_the_login_page_and_the_token_endpoint_share_one_count(client, anon_client, member):
    for _ in range(3):
        login(client, LOGIN, "member", "wrong", address="10.4.0.1")
    for _ in range(2):
        anon_client.post(TOKEN, {"username": "member", "password": "wrong"}, REMOTE_ADDR="10.4.0.1")
    assert login(client, LOGIN, "member", PASSWORD, address="10.4.0.1").status_code == 429


# --- The client address (NUM_PROXIES)


def _request(remote: str, forwarded: str | None = None):
    meta = {"REMOTE_ADDR": remote} | ({"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {})
    return RequestFactory().get("/", **meta)


def _proxies(n: int):
    from django.conf import settings

    return override_settings(REST_FRAMEWORK=settings.REST_FRAMEWORK | {"NUM_PROXIES": n})


@pytest.mark.parametrize(
    ("proxies", "remote", "forwarded", "expected"),
    [
        (0, "192.0.2.9", "203.0.113.5", "192.0.2.9"),  # no proxy trusted: the header is the client's
        (1, "192.0.2.9", "203.0.113.5", "203.0.113.5"),
        (1, "192.0.2.9", "6.6.6.6, 203.0.113.5", "203.0.113.5"),  # a client-written hop is ignored
        (2, "192.0.2.9", "6.6.6.6, 203.0.113.5, 198.51.100.7", "203.0.113.5"),
        # NUM_PROXIES wrong for the request: the connection's address, never a shared or empty one.
        (1, "192.0.2.9", None, "192.0.2.9"),
        (1, "192.0.2.9", "", "192.0.2.9"),
        (3, "192.0.2.9", "203.0.113.5, 198.51.100.7", "192.0.2.9"),
        (1, "192.0.2.9", "not-an-address", "192.0.2.9"),
        (1, "192.0.2.9", "203.0.113.5, unknown", "192.0.2.9"),
    ],
)
def test_client_ip(proxies, remote, forwarded, expected):
    with _proxies(proxies):
        assert client_ip(_request(remote, forwarded)) == expected
        # The DRF throttles key on the same address.
        assert TokenCreateThrottle().get_ident(_request(remote, forwarded)) == expected


def test_num_proxies_set_too_high_locks_no_one_but_the_guesser(client, member, viewer):
    """NUM_PROXIES=3 behind one proxy: every request's header has one address. The lock falls back
    to the connection's address and never to one every client shares, nor to the client's own
    header; and the lock is on the username (from that address), so others still log in."""
    with _proxies(3):
        for _ in range(5):
            client.post(
                LOGIN, {"username": "member", "password": "wrong"}, REMOTE_ADDR="10.5.0.1",
                HTTP_X_FORWARDED_FOR="203.0.113.5",
            )  # fmt: skip
        spoofed = client.post(
            LOGIN, {"username": "member", "password": PASSWORD}, REMOTE_ADDR="10.5.0.1",
            HTTP_X_FORWARDED_FOR="198.51.100.99",
        )  # fmt: skip
        assert spoofed.status_code == 429  # a new header does not buy a new address
        assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"10.5.0.1"}
        another = client.post(
            LOGIN, {"username": "viewer", "password": PASSWORD}, REMOTE_ADDR="10.5.0.1",
            HTTP_X_FORWARDED_FOR="203.0.113.6",
        )  # fmt: skip
        assert another.status_code == 302


def test_behind_one_proxy_each_client_is_counted_on_its_own(client, member):
    with _proxies(1):
        for _ in range(5):
            client.post(
                LOGIN, {"username": "member", "password": "wrong"}, REMOTE_ADDR="10.6.0.1",
                HTTP_X_FORWARDED_FOR="203.0.113.5",
            )  # fmt: skip
        other_client = client.post(
            LOGIN, {"username": "member", "password": PASSWORD}, REMOTE_ADDR="10.6.0.1",
            HTTP_X_FORWARDED_FOR="203.0.113.77",
        )  # fmt: skip
    assert other_client.status_code == 302
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.5"}
