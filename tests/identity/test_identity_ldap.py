"""Sign-in against a real LDAP directory (slapd on loopback, tests/ldap_support.py) through
django-auth-ldap: the login page in Chromium, StartTLS and LDAPS with the site's CA (and a
refusal with the wrong CA), group mappings followed at sign-in and at each sync, a user moved
between groups changing role, a user removed losing sessions and tokens, a local account never
taken over, and an unreachable directory disabling no one."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django_auth_ldap.backend import ldap_error
from playwright.sync_api import expect
from rest_framework.test import APIClient

from identity.models import DirectoryAccount, GroupMapping, Source
from identity.tasks import sync_directory
from portal.core.models import AuditEvent
from tenants.models import Membership, Profile, Role
from tests.browser import browser_page, screenshot
from tests.conftest import free_port
from tests.factories import PASSWORD
from tests.identity_support import ldap_on
from tests.ldap_support import MEMBERS, OWNERS, ldap_directory

User = get_user_model()


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    with ldap_directory(tmp_path_factory.mktemp("slapd")) as running:
        yield running


@pytest.fixture
def mapped(tenant, directory):
    GroupMapping.objects.create(
        source=Source.LDAP, group=directory.group_dn(OWNERS), tenant=tenant, role=Role.OWNER
    )
    GroupMapping.objects.create(
        source=Source.LDAP, group=directory.group_dn(MEMBERS), tenant=tenant, role=Role.MEMBER
    )


def _role(username: str, tenant) -> str | None:
    return (
        Membership.objects.filter(user__username=username, tenant=tenant)
        .values_list("role", flat=True)
        .first()
    )


def _log_in(username: str, password: str) -> tuple[Client, int]:
    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": password})
    return client, response.status_code


def test_a_directory_user_signs_in_on_the_login_page_as_their_groups_say(
    live_server, directory, mapped, tenant
):
    directory.add_user("lena", "lena-secret-1", groups=[OWNERS])
    base = live_server.url
    with ldap_on(directory), browser_page() as page:
        page.goto(f"{base}/accounts/login/")
        expect(page.get_by_label("Username (your institution's account)")).to_be_visible()
        page.get_by_label("Username (your institution's account)").fill("lena")
        page.get_by_label("Password").fill("lena-secret-1")
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base}/t/protein-lab/")
        expect(page.locator(".role-badge")).to_have_text("Owner")
        screenshot(page, "ldap-signed-in")
    user = User.objects.get(username="lena")
    assert not user.has_usable_password()  # only the directory signs her in
    assert user.email == "lena@portal.test"
    entry = directory.search(directory.user_dn("lena"), "(objectClass=*)", "entryUUID")[0]
    assert user.directory.subject == entry["entryUUID"][0]  # who she is for good, not her DN
    assert Profile.objects.get(user=user).cluster_username == "lena"  # from `uid`
    assert Membership.objects.get(user=user, tenant=tenant).managed


@pytest.mark.django_db
def test_the_sync_moves_a_user_between_roles_and_a_removed_user_loses_access(directory, mapped, tenant):
    directory.add_user("max", "max-secret-1", groups=[MEMBERS])
    with ldap_on(directory):
        browser, status = _log_in("max", "max-secret-1")
        assert status == 302 and _role("max", tenant) == Role.MEMBER
        made = APIClient().post("/api/v1/auth/token/", {"username": "max", "password": "max-secret-1"})
        assert made.status_code == 201 and made.json()["scope"] == "submit"
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {made.json()['token']}")
        assert api.get("/api/v1/me/").json()["tenants"] == [
            {"slug": "protein-lab", "name": tenant.name, "role": "member"}
        ]

        directory.set_groups("max", [OWNERS])
        assert sync_directory() == {"synced": 1, "gone": 0, "failed": 0, "held": 0}
        assert _role("max", tenant) == Role.OWNER
        cause = AuditEvent.objects.filter(action="membership.role", data__username="max").get().data["cause"]
        assert cause == f"sync: group {directory.group_dn(OWNERS).lower()}"

        directory.remove_user("max")
        assert sync_directory() == {"synced": 0, "gone": 1, "failed": 0, "held": 0}
        assert browser.get("/t/protein-lab/").status_code == 302  # to the login page: the session ended
        assert api.get("/api/v1/me/").status_code == 401
        assert _log_in("max", "max-secret-1")[1] == 200
        assert AuditEvent.objects.get(action="user.disable").data["cause"] == "sync: not in the directory"


@pytest.mark.django_db
def test_ldaps_with_the_sites_ca_works_and_starttls_with_the_wrong_ca_is_refused(directory):
    directory.add_user("nia", "nia-secret-1")
    directory.add_user("ola", "ola-secret-1")
    with ldap_on(directory, uri=directory.ldaps_uri, LDAP_START_TLS="false"):
        assert _log_in("nia", "nia-secret-1")[1] == 302
    errors = []

    def record(sender, context, exception, **kwargs):
        errors.append(exception)

    ldap_error.connect(record, weak=False)
    try:
        with ldap_on(directory, ca_file=directory.wrong_ca_file):
            assert _log_in("ola", "ola-secret-1")[1] == 200
    finally:
        ldap_error.disconnect(record)
    # libldap (GnuTLS on Debian) reports a failed certificate check as a connect error of the
    # StartTLS handshake; the same sign-in with the site's CA is the control that it was the CA.
    assert [type(error).__name__ for error in errors] == ["CONNECT_ERROR"]
    assert not User.objects.filter(username="ola").exists()
    with ldap_on(directory):
        assert _log_in("ola", "ola-secret-1")[1] == 302


@pytest.mark.django_db
def test_a_wrong_directory_password_is_refused(directory):
    directory.add_user("pia", "pia-secret-1")
    with ldap_on(directory):
        assert _log_in("pia", "wrong")[1] == 200
    assert not User.objects.filter(username="pia").exists()


@pytest.mark.django_db
def test_a_directory_user_never_takes_over_a_local_account(directory, member):
    directory.add_user("member", "directory-secret-1")
    with ldap_on(directory):
        assert _log_in("member", "directory-secret-1")[1] == 200
        assert _log_in("member", PASSWORD)[1] == 302  # the portal's own password still works
    assert not DirectoryAccount.objects.exists()


@pytest.mark.django_db
def test_an_unreachable_directory_disables_no_one(directory, mapped, tenant):
    directory.add_user("quin", "quin-secret-1", groups=[MEMBERS])
    with ldap_on(directory):
        assert _log_in("quin", "quin-secret-1")[1] == 302
    with ldap_on(directory, uri=f"ldap://127.0.0.1:{free_port()}"):
        assert sync_directory() == {"synced": 0, "gone": 0, "failed": 1, "held": 0}
    assert User.objects.get(username="quin").is_active and _role("quin", tenant) == Role.MEMBER


@pytest.mark.django_db
def test_a_user_the_directory_disables_loses_access_at_the_next_sync(directory, mapped, tenant):
    directory.add_user("rita", "rita-secret-1", groups=[MEMBERS, "gpu-active"])
    with ldap_on(directory, LDAP_ACTIVE_GROUP=directory.group_dn("gpu-active")):
        browser, status = _log_in("rita", "rita-secret-1")
        assert status == 302
        directory.set_groups("rita", [MEMBERS])  # still in the directory, no longer let in
        assert sync_directory() == {"synced": 0, "gone": 1, "failed": 0, "held": 0}
        assert browser.get("/t/protein-lab/").status_code == 302
        assert _log_in("rita", "rita-secret-1")[1] == 200
    assert AuditEvent.objects.get(action="user.disable").data["cause"] == "sync: disabled in the directory"


@pytest.mark.django_db
@pytest.mark.parametrize("active_group", [False, True])
def test_a_user_a_platform_admin_deactivated_stays_so_through_sync_and_sign_in(
    directory, mapped, active_group
):
    uid = f"sam{int(active_group)}"
    directory.add_user(uid, "sam-secret-1", groups=[MEMBERS, "gpu-active"])
    more = {"LDAP_ACTIVE_GROUP": directory.group_dn("gpu-active")} if active_group else {}
    with ldap_on(directory, **more):
        assert _log_in(uid, "sam-secret-1")[1] == 302
        User.objects.filter(username=uid).update(is_active=False)
        assert sync_directory() == {"synced": 0, "gone": 0, "failed": 0, "held": 0}
        assert _log_in(uid, "sam-secret-1")[1] == 200
    sam = User.objects.get(username=uid)
    assert not sam.is_active and sam.directory.gone is None


@pytest.mark.django_db
def test_a_refused_first_sign_in_leaves_nothing_and_a_later_one_works(directory):
    directory.add_user("uma", "uma-secret-1", groups=[MEMBERS])
    with ldap_on(directory, LDAP_ACTIVE_GROUP=directory.group_dn("gpu-active")):
        assert _log_in("uma", "uma-secret-1")[1] == 200
        assert not User.objects.filter(username="uma").exists()
        directory.set_groups("uma", [MEMBERS, "gpu-active"])
        assert _log_in("uma", "uma-secret-1")[1] == 302


@pytest.mark.django_db
def test_a_recycled_uid_never_inherits_the_old_account(directory, mapped, tenant):
    directory.add_user("vic", "vic-secret-1", groups=[OWNERS])
    with ldap_on(directory):
        assert _log_in("vic", "vic-secret-1")[1] == 302
        directory.remove_user("vic")
        assert sync_directory()["gone"] == 1
        directory.add_user("vic", "new-person-1", groups=[MEMBERS])  # a new entry, a new entryUUID
        assert _log_in("vic", "new-person-1")[1] == 200
    vic = User.objects.get(username="vic")
    assert not vic.is_active and _role("vic", tenant) == Role.OWNER  # the old account, untouched


@pytest.mark.django_db
def test_a_sync_that_would_disable_most_users_disables_none(directory, mapped):
    names = [f"w{n}" for n in range(4)]
    for name in names:
        directory.add_user(name, f"{name}-secret-1", groups=[MEMBERS])
    with ldap_on(directory):
        for name in names:
            assert _log_in(name, f"{name}-secret-1")[1] == 302
    # A filter that finds no one, as a broken search would: every user looks gone.
    with ldap_on(directory, LDAP_USER_FILTER="(&(uid=%(user)s)(description=nobody))"):
        assert sync_directory() == {"synced": 0, "gone": 0, "failed": 0, "held": 4}
    assert User.objects.filter(username__in=names, is_active=True).count() == 4
