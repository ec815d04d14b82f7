"""The test LDAP directory (tests/ldap_support.py) is a real slapd as the portal will meet it: users
bind with their passwords over StartTLS and LDAPS when the client trusts the site's CA and not when
it trusts another; the portal's reader finds groups and their members but never a password; an
anonymous client finds nothing; and the support's changes are what a client then reads. Checked
with the ldap-utils commands, as any LDAP client would see it."""

import subprocess
from pathlib import Path

import pytest

from tests.ldap_support import (
    CLIMATE,
    MEMBERS,
    OWNERS,
    PLACEHOLDER_MEMBER,
    SEED_USERS,
    LdapDirectory,
    cli_env,
    ldap_directory,
    parse_ldif,
)


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> LdapDirectory:
    with ldap_directory(tmp_path_factory.mktemp("ldap")) as running:
        yield running


def cli(directory: LdapDirectory, *argv: str, ca: Path | None = None) -> subprocess.CompletedProcess:
    """An ldap-utils command; with `ca`, TLS demands a server certificate signed by it."""
    tls = {"cacert": str(ca), "reqcert": "demand"} if ca else {}
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False,
                          env=cli_env(directory.folder, **tls))  # fmt: skip


def whoami(
    directory: LdapDirectory, uid: str, password: str, *, uri: str = "", ca: Path | None = None, tls=()
):
    uri = uri or directory.ldap_uri
    return cli(
        directory, "ldapwhoami", "-x", *tls, "-H", uri, "-D", directory.user_dn(uid), "-w", password, ca=ca
    )


def reader_search(directory: LdapDirectory, base: str, search_filter: str, *attributes: str) -> list[dict]:
    """What the portal's service account finds (over StartTLS, as the portal binds)."""
    done = cli(directory, "ldapsearch", "-x", "-ZZ", "-LLL", "-o", "ldif_wrap=no", "-H", directory.ldap_uri,
               "-D", directory.reader_dn, "-w", directory.reader_password, "-b", base, search_filter, *attributes,
               ca=directory.ca_file)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return parse_ldif(done.stdout)


def groups_of(directory: LdapDirectory, uid: str) -> set[str]:
    """The cns of the groups that list the user, as the portal's group search finds them."""
    search_filter = f"(&(objectClass=groupOfNames)(member={directory.user_dn(uid)}))"
    return {entry["cn"][0] for entry in reader_search(directory, directory.groups_dn, search_filter, "cn")}


def test_a_user_binds_over_starttls_with_the_sites_ca(directory):
    done = whoami(directory, "alice", SEED_USERS["alice"][0], tls=["-ZZ"], ca=directory.ca_file)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"dn:{directory.user_dn('alice')}"


@pytest.mark.parametrize("over", ["starttls", "ldaps"])
def test_a_client_that_trusts_another_ca_refuses_the_server(directory, over):
    """libldap (GnuTLS) says why only in its debug output: `-d 1`."""
    uri, tls = (
        (directory.ldap_uri, ["-ZZ", "-d", "1"]) if over == "starttls" else (directory.ldaps_uri, ["-d", "1"])
    )
    done = whoami(directory, "alice", SEED_USERS["alice"][0], uri=uri, tls=tls, ca=directory.wrong_ca_file)
    assert done.returncode != 0
    assert "TLS: peer cert untrusted" in done.stderr, done.stderr[-2000:]
    assert "dn:uid=alice" not in done.stdout


def test_a_user_binds_over_ldaps_with_the_sites_ca(directory):
    done = whoami(directory, "bob", SEED_USERS["bob"][0], uri=directory.ldaps_uri, ca=directory.ca_file)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"dn:{directory.user_dn('bob')}"


def test_a_wrong_password_is_refused(directory):
    done = whoami(directory, "alice", "not-her-password", tls=["-ZZ"], ca=directory.ca_file)
    assert done.returncode == 49, done.stderr  # invalidCredentials
    assert "Invalid credentials" in done.stderr


def test_the_reader_finds_groups_and_members_but_no_password(directory):
    groups = reader_search(directory, directory.groups_dn, "(objectClass=groupOfNames)", "cn", "member")
    assert {entry["cn"][0]: entry["member"] for entry in groups} == {
        OWNERS: [directory.user_dn("alice")],
        MEMBERS: [directory.user_dn("bob")],
        CLIMATE: [directory.user_dn("carol")],
    }
    people = reader_search(directory, directory.people_dn, "(uid=*)", "uid", "mail", "userPassword")
    assert {entry["uid"][0] for entry in people} == set(SEED_USERS)
    assert all("mail" in entry and "userPassword" not in entry for entry in people), people
    compare = cli(directory, "ldapcompare", "-x", "-H", directory.ldap_uri, "-D", directory.reader_dn,
                  "-w", directory.reader_password, directory.user_dn("alice"),
                  f"userPassword:{SEED_USERS['alice'][0]}")  # fmt: skip
    assert compare.returncode == 50, compare.stdout  # insufficientAccess: no guessing either


def test_a_user_reads_no_password_not_even_their_own(directory):
    done = cli(directory, "ldapsearch", "-x", "-LLL", "-H", directory.ldap_uri, "-D", directory.user_dn("carol"),
               "-w", SEED_USERS["carol"][0], "-b", directory.user_dn("carol"), "userPassword", "uid")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert parse_ldif(done.stdout) == [{"dn": [directory.user_dn("carol")], "uid": ["carol"]}]


def test_an_anonymous_client_finds_nothing(directory):
    for base in (directory.base_dn, directory.people_dn, directory.groups_dn):
        done = cli(
            directory, "ldapsearch", "-x", "-LLL", "-H", directory.ldap_uri, "-b", base, "(objectClass=*)"
        )
        assert done.returncode == 32, (base, done.stdout, done.stderr)  # noSuchObject: not even the tree
        assert "dn:" not in done.stdout


def test_set_groups_is_what_the_portal_then_finds(directory):
    directory.add_user("dora", "dora-secret", groups=[MEMBERS])
    assert groups_of(directory, "dora") == {MEMBERS}

    directory.set_groups("dora", [OWNERS, "gpu-new-lab"])
    assert groups_of(directory, "dora") == {OWNERS, "gpu-new-lab"}
    assert directory.group_members(OWNERS) == [directory.user_dn("alice"), directory.user_dn("dora")]

    directory.set_groups("dora", [])
    assert groups_of(directory, "dora") == set()
    # Her leaving emptied the new group: it stays, with the placeholder as its one member.
    (group,) = reader_search(directory, directory.group_dn("gpu-new-lab"), "(objectClass=*)", "member")
    assert group["member"] == [PLACEHOLDER_MEMBER]
    assert groups_of(directory, "alice") == {OWNERS}


def test_set_password_and_remove_user_take_effect(directory):
    directory.add_user("erin", "erin-old", mail="erin@lab.test", cn="Erin Example", groups=[CLIMATE])
    (entry,) = reader_search(directory, directory.user_dn("erin"), "(objectClass=*)", "cn", "mail")
    assert (entry["cn"], entry["mail"]) == (["Erin Example"], ["erin@lab.test"])

    directory.set_password("erin", "erin-new")
    assert whoami(directory, "erin", "erin-old", tls=["-ZZ"], ca=directory.ca_file).returncode == 49
    assert whoami(directory, "erin", "erin-new", tls=["-ZZ"], ca=directory.ca_file).returncode == 0

    directory.remove_user("erin")
    assert whoami(directory, "erin", "erin-new", tls=["-ZZ"], ca=directory.ca_file).returncode == 49
    assert reader_search(directory, directory.people_dn, "(uid=erin)") == []
    assert groups_of(directory, "erin") == set()
    assert directory.group_members(CLIMATE) == [directory.user_dn("carol")]
