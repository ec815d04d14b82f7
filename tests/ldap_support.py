"""A real LDAP directory for tests: Debian's `slapd` on loopback, started by the test in a folder of
its own, with a test CA, users and groups as the portal's site directory holds them.

`ldap_directory(folder)` yields a running, seeded `LdapDirectory`: plain LDAP with StartTLS on one
port, LDAPS on another, both with a server certificate for 127.0.0.1 and localhost signed by the
test CA (`ca_file`); `wrong_ca_file` is an unrelated CA, for the tests that a client refuses the
server when it trusts the wrong one. The directory is changed through the ldap-utils commands
(ldapadd, ldapmodify, ldapdelete, ldapsearch), bound as the admin, password in a file (`-y`).

Who may read what (the `access` lines of `slapd_conf`): anyone may bind with a password and read
the root DSE and the schema (clients ask them); a bound user or service reads every entry but no
one's userPassword; an anonymous client finds nothing. The admin is the rootdn, above the rules.

groupOfNames must have a member: a group whose last user leaves keeps `PLACEHOLDER_MEMBER` (the
admin's DN, which is no user and no entry) as its only member, and loses it when a user joins."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import secrets
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import die_with_parent, free_port, stop
from tests.wait_support import wait_until

SLAPD = "/usr/sbin/slapd"
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")  # Debian builds the backends as modules: back_mdb is loaded
START_TIMEOUT_S = 15
CLI_TIMEOUT_S = 10

BASE_DN = "dc=portal,dc=test"
PEOPLE_DN = f"ou=people,{BASE_DN}"
GROUPS_DN = f"ou=groups,{BASE_DN}"
SERVICES_DN = f"ou=services,{BASE_DN}"
ADMIN_DN = f"cn=admin,{BASE_DN}"
ADMIN_PASSWORD = "admin-secret"
READER_DN = f"cn=portal-reader,{SERVICES_DN}"
READER_PASSWORD = "reader-secret"
PLACEHOLDER_MEMBER = ADMIN_DN  # the one member of a group with no user (see the docstring)

# The seed: group cns, and each user's password and groups.
OWNERS = "gpu-protein-owners"
MEMBERS = "gpu-protein-members"
CLIMATE = "gpu-climate-members"
SEED_GROUPS = (OWNERS, MEMBERS, CLIMATE)
SEED_USERS = {
    "alice": ("alice-secret", (OWNERS,)),
    "bob": ("bob-secret", (MEMBERS,)),
    "carol": ("carol-secret", (CLIMATE,)),
}
FIRST_UID_NUMBER = 10000


def ssha(password: str) -> str:
    """The {SSHA} hash that slappasswd would write: base64(SHA1(password + salt) + salt)."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()  # noqa: S324  (the {SSHA} scheme)
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


# --- The certificates


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(b"")
    path.chmod(0o600)  # before the key is in it; slapd runs as this process's user
    path.write_bytes(pem)


# What a CA's key may sign: certificates and CRLs.
CA_KEY_USAGE = x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                             data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                             encipher_only=False, decipher_only=False)  # fmt: skip


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _server_cert(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, key) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def certificates(folder: Path) -> dict[str, Path]:
    """The test CA, the server's key and certificate (127.0.0.1 and localhost, signed by the CA)
    and an unrelated CA, as PEM files in `folder`: {"ca", "wrong_ca", "cert", "key"}."""
    ca, ca_key = _ca("Portal test LDAP CA")
    wrong_ca, _ = _ca("Some other CA")
    key = _key()
    paths = {name: folder / f"{name}.pem" for name in ("ca", "wrong_ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["wrong_ca"].write_bytes(wrong_ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(_server_cert(ca, ca_key, key).public_bytes(serialization.Encoding.PEM))
    _write_key(paths["key"], key)
    return paths


# --- slapd


def slapd_conf(folder: Path, certs: dict[str, Path]) -> str:
    """slapd's static configuration (`slapd -f`): the schemas the entries need, one mdb database
    in `folder`/db, the certificates, and the access rules of the module's docstring."""
    schemas = "\n".join(
        f"include {SCHEMA_DIR / name}.schema" for name in ("core", "cosine", "inetorgperson", "nis")
    )
    return f"""\
{schemas}
modulepath {MODULE_DIR}
moduleload back_mdb
pidfile {folder / "slapd.pid"}
argsfile {folder / "slapd.args"}
TLSCACertificateFile {certs["ca"]}
TLSCertificateFile {certs["cert"]}
TLSCertificateKeyFile {certs["key"]}

access to dn.base="" by * read
access to dn.base="cn=Subschema" by * read

database mdb
maxsize 67108864
suffix "{BASE_DN}"
rootdn "{ADMIN_DN}"
rootpw {ssha(ADMIN_PASSWORD)}
directory {folder / "db"}
index objectClass,uid,cn,member eq

access to attrs=userPassword
    by anonymous auth
    by * none
access to dn.subtree="{BASE_DN}"
    by dn.exact="{READER_DN}" read
    by users read
    by * none
"""


def _ldif(dn: str, attributes: dict[str, str | Iterable[str]]) -> str:
    lines = [f"dn: {dn}"]
    for name, values in attributes.items():
        for value in [values] if isinstance(values, str) else values:
            assert value.isprintable() and not value.startswith((" ", ":", "<")), (name, value)
            lines.append(f"{name}: {value}")
    return "\n".join(lines) + "\n"


def parse_ldif(text: str) -> list[dict[str, list[str]]]:
    """ldapsearch -LLL -o ldif_wrap=no's entries: [{"dn": [dn], attribute: [values]}, …]."""
    entries = []
    for block in text.strip().split("\n\n"):
        entry: dict[str, list[str]] = {}
        for line in block.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.partition(":")
            value = base64.b64decode(value[2:]).decode() if value.startswith(":") else value[1:]
            entry.setdefault(name, []).append(value)
        if entry:
            entries.append(entry)
    return entries


@dataclass
class LdapDirectory:
    """A running slapd and what a test needs of it; the change methods act as the site's admin."""

    ldap_uri: str  # ldap://127.0.0.1:port, StartTLS there
    ldaps_uri: str
    ca_file: Path
    wrong_ca_file: Path
    folder: Path
    proc: subprocess.Popen | None = None
    base_dn: str = BASE_DN
    people_dn: str = PEOPLE_DN
    groups_dn: str = GROUPS_DN
    admin_dn: str = ADMIN_DN
    admin_password: str = ADMIN_PASSWORD
    reader_dn: str = READER_DN
    reader_password: str = READER_PASSWORD
    next_uid_number: int = FIRST_UID_NUMBER
    _password_file: Path = field(init=False)

    def __post_init__(self):
        self._password_file = self.folder / "admin.password"
        self._password_file.touch(mode=0o600)
        self._password_file.write_text(self.admin_password)  # -y reads it all: no newline

    def user_dn(self, uid: str) -> str:
        return f"uid={uid},{self.people_dn}"

    def group_dn(self, cn: str) -> str:
        return f"cn={cn},{self.groups_dn}"

    def log_tail(self, chars: int = 3000) -> str:
        return (self.folder / "slapd.log").read_text(errors="replace")[-chars:]

    # --- The ldap-utils, bound as the admin over plain LDAP on loopback

    def admin_cli(self, tool: str, *args: str, ldif: str | None = None) -> str:
        """Run an ldap-utils command bound as the admin; its stdout, or an AssertionError with
        what it said."""
        argv = [tool, "-x", "-H", self.ldap_uri, "-D", self.admin_dn, "-y", str(self._password_file), *args]
        done = subprocess.run(argv, input=ldif, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                              env=cli_env(self.folder), check=False)  # fmt: skip
        assert done.returncode == 0, f"{tool} {args} exited {done.returncode}: {done.stderr}{done.stdout}"
        return done.stdout

    def search(self, base: str, search_filter: str = "(objectClass=*)", *attributes: str) -> list[dict]:
        """The entries under `base` that match, as the admin sees them (see `parse_ldif`)."""
        out = self.admin_cli(
            "ldapsearch", "-LLL", "-o", "ldif_wrap=no", "-b", base, search_filter, *attributes
        )
        return parse_ldif(out)

    def add(self, ldif: str) -> None:
        self.admin_cli("ldapadd", ldif=ldif)

    def modify(self, ldif: str) -> None:
        self.admin_cli("ldapmodify", ldif=ldif)

    # --- Users and groups

    def add_group(self, cn: str) -> None:
        """A groupOfNames with no user yet (its member is `PLACEHOLDER_MEMBER`)."""
        self.add(
            _ldif(self.group_dn(cn), {"objectClass": "groupOfNames", "cn": cn, "member": PLACEHOLDER_MEMBER})
        )

    def group_members(self, cn: str) -> list[str]:
        """The DNs of the group's users (the placeholder left out)."""
        (entry,) = self.search(self.group_dn(cn), "(objectClass=groupOfNames)", "member")
        return [dn for dn in entry.get("member", []) if dn != PLACEHOLDER_MEMBER]

    def add_user(
        self,
        uid: str,
        password: str,
        *,
        mail: str | None = None,
        cn: str | None = None,
        groups: Iterable[str] = (),
    ) -> str:
        """An inetOrgPerson + posixAccount under ou=people, in `groups` (made when missing); its DN."""
        number = str(self.next_uid_number)
        self.next_uid_number += 1
        self.add(
            _ldif(self.user_dn(uid), {
                "objectClass": ("inetOrgPerson", "posixAccount"), "uid": uid, "cn": cn or uid.title(),
                "sn": uid.title(), "givenName": uid.title(), "mail": mail or f"{uid}@portal.test",
                "uidNumber": number, "gidNumber": number, "homeDirectory": f"/home/{uid}",
                "userPassword": ssha(password),
            })
        )  # fmt: skip
        if groups:
            self.set_groups(uid, groups)
        return self.user_dn(uid)

    def set_groups(self, uid: str, groups: Iterable[str]) -> None:
        """The user's groups become exactly `groups` (cns; a group not there yet is made)."""
        dn, wanted = self.user_dn(uid), set(groups)
        members = {
            entry["cn"][0]: set(entry.get("member", []))
            for entry in self.search(self.groups_dn, "(objectClass=groupOfNames)", "cn", "member")
        }
        for cn in sorted(wanted - members.keys()):
            self.add_group(cn)
            members[cn] = {PLACEHOLDER_MEMBER}
        changes = []
        for cn, current in sorted(members.items()):
            if cn in wanted and dn not in current:
                change = [f"add: member\nmember: {dn}"]
                if PLACEHOLDER_MEMBER in current:
                    change.append(f"delete: member\nmember: {PLACEHOLDER_MEMBER}")
            elif cn not in wanted and dn in current:
                change = [f"delete: member\nmember: {dn}"]
                if current == {dn}:
                    change.insert(0, f"add: member\nmember: {PLACEHOLDER_MEMBER}")
            else:
                continue
            changes.append(f"dn: {self.group_dn(cn)}\nchangetype: modify\n" + "\n-\n".join(change) + "\n")
        if changes:
            self.modify("\n".join(changes))

    def set_password(self, uid: str, password: str) -> None:
        self.modify(
            f"dn: {self.user_dn(uid)}\nchangetype: modify\nreplace: userPassword\nuserPassword: {ssha(password)}\n"
        )

    def remove_user(self, uid: str) -> None:
        """The user's entry deleted, after it left every group."""
        self.set_groups(uid, ())
        self.admin_cli("ldapdelete", self.user_dn(uid))

    def seed(self) -> None:
        """The tree, the reader, and the module's seed groups and users."""
        self.add(
            "\n".join([
                _ldif(BASE_DN, {"objectClass": ("dcObject", "organization"), "dc": "portal", "o": "Portal test"}),
                *(_ldif(dn, {"objectClass": "organizationalUnit", "ou": dn.split(",")[0][3:]})
                  for dn in (self.people_dn, self.groups_dn, SERVICES_DN)),
                _ldif(self.reader_dn, {
                    "objectClass": ("organizationalRole", "simpleSecurityObject"),
                    "cn": "portal-reader", "userPassword": ssha(self.reader_password),
                }),
                *(_ldif(self.group_dn(cn), {"objectClass": "groupOfNames", "cn": cn, "member": PLACEHOLDER_MEMBER})
                  for cn in SEED_GROUPS),
            ])
        )  # fmt: skip
        for uid, (password, groups) in SEED_USERS.items():
            self.add_user(uid, password, groups=groups)


def cli_env(folder: Path, **tls: str) -> dict[str, str]:
    """The environment for an ldap-utils command: no user's ~/.ldaprc, no proxy, and `tls`'s
    settings as LDAPTLS_<NAME> (cacert=…, reqcert="demand")."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LDAP") and "proxy" not in key.lower()
    }
    env["HOME"] = str(folder)
    return env | {f"LDAPTLS_{name.upper()}": value for name, value in tls.items()}


@contextmanager
def ldap_directory(folder: Path) -> Iterator[LdapDirectory]:
    """slapd with the seed, its files in `folder` (made), running until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "db").mkdir(mode=0o700)
    certs = certificates(folder)
    conf = folder / "slapd.conf"
    conf.write_text(slapd_conf(folder, certs))
    ldap_port, ldaps_port = free_port(), free_port()
    for _ in range(10):  # the kernel may hand the same free port out twice
        if ldaps_port != ldap_port:
            break
        ldaps_port = free_port()
    directory = LdapDirectory(
        ldap_uri=f"ldap://127.0.0.1:{ldap_port}", ldaps_uri=f"ldaps://127.0.0.1:{ldaps_port}",
        ca_file=certs["ca"], wrong_ca_file=certs["wrong_ca"], folder=folder,
    )  # fmt: skip
    argv = [SLAPD, "-d", "0", "-f", str(conf), "-h", f"{directory.ldap_uri}/ {directory.ldaps_uri}/"]
    with open(folder / "slapd.log", "w") as log:
        directory.proc = subprocess.Popen(argv, cwd=folder, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, preexec_fn=die_with_parent)  # fmt: skip
    try:

        def answers():
            assert directory.proc.poll() is None, (
                f"slapd exited with {directory.proc.returncode}:\n{directory.log_tail()}"
            )
            argv = ["ldapwhoami", "-x", "-H", directory.ldap_uri, "-o", "nettimeout=1"]
            done = subprocess.run(
                argv, capture_output=True, timeout=CLI_TIMEOUT_S, env=cli_env(folder), check=False
            )
            return done.returncode == 0

        wait_until(answers, timeout_s=START_TIMEOUT_S, interval_s=0.05, what="slapd answers")
        directory.seed()
        yield directory
    finally:
        stop(directory.proc, timeout_s=5)
