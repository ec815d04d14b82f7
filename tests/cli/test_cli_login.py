"""`gpuportal login`, `logout` and `whoami` against a real portal: the password asked for on a
real terminal with echo off, the token stored in a 0600 file from its first byte (whatever the
umask) and never printed, GPUPORTAL_URL/GPUPORTAL_TOKEN over the stored login, and the errors
that end in exit code 2 (not logged in) or 3 (a bad token, wrong credentials, no portal there,
a portal that never answers)."""

import stat

import httpx
import pytest

from portal.core.models import ApiToken
from tests.cli_support import api_get, in_terminal, rows_of
from tests.conftest import free_port
from tests.factories import PASSWORD
from tests.faults_support import SilentPeer

DB = pytest.mark.django_db(transaction=True)  # the tests that make rows; the others touch no table


def mode_of(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@DB
def test_login_asks_on_the_terminal_hides_the_password_and_stores_the_token_0600(cli, portal, member):
    cli.url = None  # no GPUPORTAL_URL: the prompt asks for it
    rc, screen = in_terminal(
        cli, ["login"], [("Portal URL", portal), ("Username", "member"), ("Password", PASSWORD)], umask=0
    )
    assert rc == 0, screen
    assert f"Logged in to {portal} as member." in screen
    assert "member" in screen and PASSWORD not in screen  # the name echoed as typed, the password not
    stored = cli.config_file()
    # umask 0 would have left a plain open() at 0666: the file is made 0600, its folder 0700
    assert mode_of(stored) == 0o600 and mode_of(stored.parent) == 0o700
    assert sorted(p.name for p in stored.parent.iterdir()) == ["config.json"]  # no temporary left
    token = cli.json_file()["token"]
    assert token not in screen
    assert ApiToken.objects.get(user=member).name.startswith("gpuportal on ")

    whoami = cli.run("whoami")  # the stored URL and token, nothing in the environment
    assert whoami.rc == 0, whoami
    assert ["Token", "from", "config", "file"] in rows_of(whoami.stdout)
    assert ["protein-lab", "Protein", "Lab", "member"] in rows_of(whoami.stdout)
    assert token not in whoami.stdout + whoami.stderr
    assert cli.json("whoami") == api_get(portal, token, "/me/")


@DB
def test_login_with_password_stdin_then_logout_revokes_the_token(cli, portal, member):
    login = cli.run(
        "login", "--url", portal, "-u", "member", "--password-stdin", "--json", input=PASSWORD + "\n"
    )
    answer = login.json()
    token = cli.json_file()["token"]
    assert answer["username"] == "member" and answer["url"] == portal
    assert answer["token"]["scope"] == "submit" and "token" not in answer["token"]
    assert token not in login.stdout + login.stderr
    assert mode_of(cli.config_file()) == 0o600
    assert cli.run("whoami").rc == 0

    logout = cli.run("logout")
    assert logout.rc == 0 and "revoked" in logout.stdout, logout
    assert not cli.config_file().exists()
    refused = httpx.get(f"{portal}/api/v1/me/", headers={"Authorization": f"Token {token}"}, timeout=10)
    assert refused.status_code == 401
    assert cli.run("logout").stdout.strip() == "Not logged in: nothing stored."


@DB
def test_a_second_login_revokes_the_token_the_first_one_made(cli, portal, member):
    for _ in range(2):
        assert cli.run("login", "-u", "member", "--password-stdin", input=PASSWORD).rc == 0
    assert ApiToken.objects.filter(user=member).count() == 1  # revoking deletes


@DB
def test_login_with_a_token_from_stdin(cli, portal, member, token_of):
    token = token_of(member)
    login = cli.run("login", "--token", "-", input=token + "\n")
    assert login.rc == 0 and "Logged in" in login.stdout and token not in login.stdout + login.stderr
    assert cli.json_file() == {"url": portal, "token": token, "username": "member"}


@DB
def test_wrong_credentials_are_exit_3_and_store_nothing(cli, member):
    wrong = cli.run("login", "-u", "member", "--password-stdin", input="not the password\n")
    assert wrong.rc == 3
    assert "invalid (HTTP 400)" in wrong.stderr and "password: Unable to log in" in wrong.stderr
    assert not cli.config_file().exists()


@DB
def test_the_environment_overrides_the_stored_login(cli, portal, member, outsider, token_of):
    assert cli.run("login", "-u", "member", "--password-stdin", input=PASSWORD).rc == 0
    cli.url = None
    assert cli.json("whoami")["username"] == "member"
    assert cli.json("whoami", GPUPORTAL_TOKEN=token_of(outsider))["username"] == "outsider"
    away = cli.run("whoami", GPUPORTAL_URL=f"http://127.0.0.1:{free_port()}")
    assert away.rc == 3 and "unreachable" in away.stderr  # the stored URL was not used
    shown = rows_of(cli.run("whoami", GPUPORTAL_TOKEN=token_of(outsider)).stdout)
    assert ["Token", "from", "environment"] in shown and ["Portal", portal, "(config", "file)"] in shown


def test_a_bad_token_is_exit_3_not_authenticated_and_is_not_printed(cli):
    cli.token = "bogus-token-0123456789"
    bad = cli.run("whoami")
    assert bad.rc == 3 and bad.stdout == ""
    assert bad.stderr.startswith("Error: not_authenticated (HTTP 401)")
    assert cli.token not in bad.stderr
    assert cli.run("ls", "--json").rc == 3
    # one that could not even be sent (a stray line in GPUPORTAL_TOKEN) is not quoted either
    for garbled in ("stray output\n\nbogus-token-0123456789", "bogus-token 0123456789"):
        refused = cli.run("whoami", GPUPORTAL_TOKEN=garbled)
        assert (
            refused.rc == 2
            and "The token has spaces" in refused.stderr
            and "0123456789" not in refused.stderr
        )
    refused = cli.run("login", "--token", "-", input="bogus token\n")
    assert refused.rc == 2 and "bogus" not in refused.stderr


def test_no_login_is_exit_2(cli):
    missing = cli.run("whoami")
    assert missing.rc == 2 and "Not logged in" in missing.stderr
    cli.url = None
    assert "No portal URL" in cli.run("whoami", GPUPORTAL_TOKEN="x").stderr


def test_no_portal_and_a_silent_portal_are_exit_3_within_the_timeout(cli):
    cli.token = "x"
    away = cli.run("whoami", GPUPORTAL_URL=f"http://127.0.0.1:{free_port()}")
    assert away.rc == 3 and away.stderr.startswith(
        "Error: unreachable (no answer): Cannot reach http://127.0.0.1:"
    )
    peer = SilentPeer()
    try:
        silent = cli.run("whoami", GPUPORTAL_URL=f"http://127.0.0.1:{peer.port}", GPUPORTAL_TIMEOUT="1")
        assert silent.rc == 3 and silent.stderr.startswith("Error: timeout (no answer)")
        assert [round(wait) for wait in peer.waits_s()] == [1]  # one request, given up after its timeout
    finally:
        peer.close()


def test_settings_that_cannot_work_are_exit_2(cli):
    bad = cli.run("login", "--url", "ftp://example.org", "--token", "x")
    assert bad.rc == 2 and "Not a portal URL" in bad.stderr
    cli.token = "x"
    for env, message in [
        ({"GPUPORTAL_URL": "portal.example.org"}, "Not a portal URL: portal.example.org"),
        ({"GPUPORTAL_TIMEOUT": "soon"}, "GPUPORTAL_TIMEOUT must be a number of seconds."),
        ({"GPUPORTAL_CA_BUNDLE": str(cli.home / "nope.pem")}, "Cannot use the CA bundle"),
    ]:
        refused = cli.run("whoami", **env)
        assert refused.rc == 2 and message in refused.stderr, (env, refused)
