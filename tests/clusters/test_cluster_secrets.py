"""Cluster secrets: never rendered by the console, read-only or not; encrypted at rest with
FIELD_ENCRYPTION_KEY (portal/core/fields.py) and rotated by `manage.py rotate_field_key`; and a
passphrase-protected SSH key loads through the function the Slurm backend connects with."""

import importlib
import subprocess

import paramiko
import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from django.conf import settings
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.db import connection

from clusters.backends.base import BackendUnavailable
from clusters.backends.slurm.ssh import private_key
from clusters.models import Cluster
from clusters.services import cluster_config
from portal.core.fields import FieldKeyMissing
from portal.core.staff import ROLE_READ_ONLY_SUPPORT
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

SECRETS = {
    "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-private-key-bytes\n"
    "-----END OPENSSH PRIVATE KEY-----\n",
    "ssh_key_passphrase": "passphrase-bytes-4711",
    "k8s_token": "eyJhbGciOiJSUzI1NiJ9.k8s-token-bytes",
    "kubeconfig": "apiVersion: v1\nusers:\n- name: a\n  user: {token: kubeconfig-token-bytes}\n",
}
# What must not appear: each secret whole, and a distinctive piece of each.
FRAGMENTS = [
    *SECRETS.values(),
    "private-key-bytes",
    "passphrase-bytes",
    "k8s-token-bytes",
    "kubeconfig-token-bytes",
]


@pytest.fixture
def cluster(db) -> Cluster:
    return Cluster.objects.create(
        slug="hpc", name="HPC", kind="slurm", ssh_host="login.example.org", **SECRETS
    )


def raw_columns(cluster: Cluster) -> dict[str, str]:
    """The row as the database holds it, past the model's field."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ssh_private_key, ssh_key_passphrase, k8s_token, kubeconfig FROM clusters_cluster WHERE id = %s",
            [cluster.pk],
        )
        return dict(zip(SECRETS, cursor.fetchone(), strict=True))


def logged_in(client, user):
    client.force_login(user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    return client


# --- Never rendered


def test_staff_with_only_the_view_permission_sees_no_byte_of_a_secret(client, cluster):
    reader = UserFactory(username="cluster-reader", is_staff=True)
    reader.user_permissions.set(Permission.objects.filter(codename="view_cluster"))
    response = logged_in(client, reader).get(f"/admin/clusters/cluster/{cluster.pk}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    for fragment in FRAGMENTS:
        assert fragment not in page
    assert page.count("Set (write-only)") == 4
    assert "login.example.org" in page  # the page is the cluster's, read-only
    assert "_clear" not in page and "<textarea" not in page


def test_read_only_support_sees_whether_a_secret_is_set_and_nothing_more(client, cluster):
    support = UserFactory(username="support", is_staff=True)
    support.groups.set(Group.objects.filter(name=ROLE_READ_ONLY_SUPPORT))
    Cluster.objects.filter(pk=cluster.pk).update(ssh_key_passphrase="")
    page = logged_in(client, support).get(f"/admin/clusters/cluster/{cluster.pk}/change/").content.decode()
    for fragment in FRAGMENTS:
        assert fragment not in page
    assert page.count("Set (write-only)") == 3 and "Not set" in page


def test_the_platform_admins_form_renders_no_secret_either(client, admin_user, cluster):
    page = logged_in(client, admin_user).get(f"/admin/clusters/cluster/{cluster.pk}/change/").content.decode()
    for fragment in FRAGMENTS:
        assert fragment not in page
    assert 'name="ssh_key_passphrase"' in page and 'name="ssh_key_passphrase_clear"' in page


# --- Encrypted at rest


def test_the_row_holds_ciphertext_and_the_config_gets_plaintext(cluster):
    stored = raw_columns(cluster)
    for name, value in SECRETS.items():
        assert stored[name].startswith("gAAAAA")  # a Fernet token
        assert value not in stored[name] and "bytes" not in stored[name]
        assert Fernet(settings.FIELD_ENCRYPTION_KEY[0]).decrypt(stored[name].encode()).decode() == value
    config = cluster_config(Cluster.objects.get(pk=cluster.pk))
    assert {name: getattr(config, name) for name in SECRETS} == SECRETS
    for fragment in FRAGMENTS:
        assert fragment not in repr(config)


def test_an_empty_secret_stays_empty_and_needs_no_key(db):
    cluster = Cluster.objects.create(slug="local", name="Local", kind="local")
    assert set(raw_columns(cluster).values()) == {""}
    assert Cluster.objects.filter(k8s_token="").count() == 1


def test_the_migration_encrypts_the_rows_it_finds_and_its_reverse_decrypts(cluster):
    migration = importlib.import_module("clusters.migrations.0006_encrypt_cluster_secrets")
    columns = ("ssh_private_key", "k8s_token", "kubeconfig")
    with connection.cursor() as cursor:  # the row as it was before the migration: in clear
        cursor.execute(
            "UPDATE clusters_cluster SET ssh_private_key = %s, k8s_token = %s, kubeconfig = %s WHERE id = %s",
            [*(SECRETS[c] for c in columns), cluster.pk],
        )
    with connection.schema_editor() as editor:
        migration.encrypt_rows(None, editor)
    stored = raw_columns(cluster)
    assert all(stored[c].startswith("gAAAAA") for c in columns)
    reread = Cluster.objects.get(pk=cluster.pk)
    assert {c: getattr(reread, c) for c in columns} == {c: SECRETS[c] for c in columns}
    with connection.schema_editor() as editor:
        migration.decrypt_rows(None, editor)
    assert {c: raw_columns(cluster)[c] for c in columns} == {c: SECRETS[c] for c in columns}


def test_rotation_re_encrypts_with_the_new_key_and_the_old_one_can_go(cluster, settings, capsys):
    old = settings.FIELD_ENCRYPTION_KEY[0]
    new = Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEY = [new, old]
    assert Cluster.objects.get(pk=cluster.pk).k8s_token == SECRETS["k8s_token"]  # the old key still reads
    call_command("rotate_field_key")
    assert "clusters.Cluster: 1 rows re-encrypted" in capsys.readouterr().out
    stored = raw_columns(cluster)
    assert all(Fernet(new).decrypt(stored[name].encode()).decode() == SECRETS[name] for name in SECRETS)
    settings.FIELD_ENCRYPTION_KEY = [new]
    reread = Cluster.objects.get(pk=cluster.pk)
    assert {name: getattr(reread, name) for name in SECRETS} == SECRETS


def test_a_missing_key_stops_the_read_with_a_clear_error(cluster, settings):
    settings.FIELD_ENCRYPTION_KEY = [Fernet.generate_key().decode()]
    with pytest.raises(FieldKeyMissing, match="FIELD_ENCRYPTION_KEY") as caught:
        Cluster.objects.get(pk=cluster.pk)
    for fragment in FRAGMENTS:
        assert fragment not in str(caught.value)


# --- Passphrase-protected SSH keys


def openssh_text(key, passphrase: bytes | None, form=serialization.PrivateFormat.OpenSSH) -> str:
    encryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, form, encryption).decode()


def public_blob(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def new_rsa():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


OPENSSH, PEM = serialization.PrivateFormat.OpenSSH, serialization.PrivateFormat.TraditionalOpenSSL


@pytest.mark.parametrize(
    ("make", "form", "loaded_as"),
    [
        (ed25519.Ed25519PrivateKey.generate, OPENSSH, paramiko.Ed25519Key),
        (new_rsa, OPENSSH, paramiko.RSAKey),
        (new_rsa, PEM, paramiko.RSAKey),
    ],
    ids=["ed25519-openssh", "rsa-openssh", "rsa-pem"],
)
def test_an_encrypted_key_loads_with_its_passphrase(make, form, loaded_as):
    key = make()
    text = openssh_text(key, b"correct horse", form)
    loaded = private_key(text, "correct horse")
    assert isinstance(loaded, loaded_as)
    assert f"{loaded.get_name()} {loaded.get_base64()}".encode() == public_blob(key)
    with pytest.raises(BackendUnavailable, match="encrypted: set its passphrase"):
        private_key(text, "")
    with pytest.raises(BackendUnavailable, match="cannot be read with its passphrase") as wrong:
        private_key(text, "battery staple")
    assert "battery" not in str(wrong.value) and text[40:80] not in str(wrong.value)


def test_a_key_that_ssh_keygen_encrypted_loads_through_the_clusters_config(tmp_path, db):
    path = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret phrase", "-C", "portal", "-f", str(path)],
        check=True, timeout=30,
    )  # fmt: skip
    cluster = Cluster.objects.create(
        slug="hpc", name="HPC", kind="slurm", ssh_host="h", ssh_private_key=path.read_text(),
        ssh_key_passphrase="s3cret phrase",
    )  # fmt: skip
    config = cluster_config(Cluster.objects.get(pk=cluster.pk))
    loaded = private_key(config.ssh_private_key, config.ssh_key_passphrase)
    assert f"{loaded.get_name()} {loaded.get_base64()}" == " ".join(
        path.with_suffix(".pub").read_text().split()[:2]
    )
    assert "s3cret" not in repr(config)


def test_an_unencrypted_key_still_loads_without_a_passphrase():
    key = ed25519.Ed25519PrivateKey.generate()
    assert isinstance(private_key(openssh_text(key, None)), paramiko.Ed25519Key)
