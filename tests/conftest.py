import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from clusters.selectors import catalog_names_forget
from portal.core.tokens import token_create
from tenants.models import Role
from tenants.services import membership_add
from tests.factories import (
    ClusterFactory,
    JobFactory,
    PartitionFactory,
    QuotaGrantFactory,
    TenantFactory,
    UserFactory,
    catalog_pair,
)

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, *, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout_s}s")


def stop(proc: subprocess.Popen, *, timeout_s: float = 10) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


@pytest.fixture(autouse=True)
def _clean_cache() -> None:
    """Throttle counters live in the cache, catalog names in the process; each test starts with
    none (SQLite gives a rolled-back test's ids to the next)."""
    cache.clear()
    catalog_names_forget()


# --- Personas: platform admin, tenant owner, member, viewer, outsider.


def join(tenant, username: str, role: Role):
    """A user in the tenant with the role, through the service (so guardian permissions too)."""
    user = UserFactory(username=username)
    membership_add(actor=None, tenant=tenant, user=user, role=role)
    return user


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="protein-lab")


@pytest.fixture
def other_tenant(db):
    return TenantFactory(slug="other-team")


@pytest.fixture
def admin_user(db):
    return UserFactory(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def owner(tenant):
    return join(tenant, "owner", Role.OWNER)


@pytest.fixture
def manager(tenant):
    return join(tenant, "manager", Role.MANAGER)


@pytest.fixture
def member(tenant):
    return join(tenant, "member", Role.MEMBER)


@pytest.fixture
def viewer(tenant):
    return join(tenant, "viewer", Role.VIEWER)


@pytest.fixture
def outsider(other_tenant):
    return join(other_tenant, "outsider", Role.OWNER)


@pytest.fixture
def catalog(db):
    """(scenario, gpu_model): ai-training and H100-80GB, which the scenario lists."""
    return catalog_pair()


@pytest.fixture
def testbed(transactional_db, catalog):
    """The Slurm testbed, up and registered as the Cluster "testbed" with its partitions. Every
    tenant made while it is in use gets its job identity there (pt-<slug>), as a site's admin
    makes a new team's cluster account once: the portal itself can create no Unix user."""
    from django.db.models.signals import post_save

    from tenants.models import Tenant
    from tests.testbed.env import registered_testbed, testbed_identity

    def identity_for(sender, instance, created, **kwargs):
        if created:
            testbed_identity(f"pt-{instance.slug}")

    post_save.connect(identity_for, sender=Tenant, dispatch_uid="testbed-identities")
    yield registered_testbed()
    post_save.disconnect(sender=Tenant, dispatch_uid="testbed-identities")


@pytest.fixture
def local_partition(catalog):
    """A local cluster of 4 GPUs whose partition offers the catalog's GPU model."""
    cluster = ClusterFactory(slug="local", local_gpus=4)
    return PartitionFactory(
        cluster=cluster, gpu_model=catalog[1], gpus_per_node=4, max_walltime_minutes=60, max_cpus_per_gpu=1,
        max_mem_per_gpu_mb=1000,
    )  # fmt: skip


@pytest.fixture
def grant(request, tenant, catalog):
    """An active grant of the tenant for the catalog's pair: 4 GPUs at once, 100 GPU-hours, 30 days.
    A test, class or module marked `@pytest.mark.grant(gpus=8, ...)` gets those fields instead."""
    marker = request.node.get_closest_marker("grant")
    return QuotaGrantFactory(tenant=tenant, pair=catalog, **(marker.kwargs if marker else {}))


@pytest.fixture
def make_job(tenant, catalog):
    """make_job(user, **fields): a QUEUED job of the tenant, submitted by the user, on a local
    partition of 8 GPUs under a grant of 8 GPUs and 1000 GPU-hours (straight into the database)."""
    cluster = ClusterFactory(slug="local", healthy=False)
    partition = PartitionFactory(cluster=cluster, gpu_model=catalog[1])
    grant = QuotaGrantFactory(tenant=tenant, pair=catalog, gpus=8, gpu_hours=1000, days=9)

    def make(user, **fields):
        return JobFactory(grant=grant, partition=partition, submitted_by=user, **fields)

    return make


@pytest.fixture
def web(client):
    """web(user): Django's test client, logged in as the user, pages in English."""
    from django.conf import settings

    def login(user):
        client.force_login(user)
        client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
        return client

    return login


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture
def client_for():
    """client_for(user): an API client that sends a real token of that user."""

    def make(user) -> APIClient:
        _, key = token_create(user=user, name="test")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client

    return make


# --- Real services started by the suite.


@pytest.fixture
def redis_server(tmp_path) -> Iterator[dict]:
    """A Redis server of the test's own on a free loopback port, so that a test may stop it."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed (.ci/run installs it)"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, timeout_s=10, proc=proc)
    yield {"url": f"redis://127.0.0.1:{port}/0", "proc": proc}
    stop(proc)


def database_url_of_test_db() -> str:
    """The DATABASE_URL under which another process reaches the database pytest-django made."""
    from django.db import connection

    settings_dict = connection.settings_dict
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    host, port = settings_dict["HOST"] or "127.0.0.1", settings_dict["PORT"] or 5432
    return f"postgres://{settings_dict['USER']}@{host}:{port}/{settings_dict['NAME']}"


def die_with_parent() -> None:
    """In a child before exec: SIGTERM when the test process dies, so that a killed test run
    leaves no worker behind to consume the next run's messages."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def start_celery_worker(log_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """A real Celery worker process on the machine's Redis, sharing the test database."""
    from django.conf import settings

    from portal.celery import app

    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url_of_test_db(),
        "REDIS_URL": settings.REDIS_URL,
        **(extra_env or {}),
    }
    hostname = f"test-{os.getpid()}-{time.monotonic_ns()}"
    log = open(log_path, "w")  # noqa: SIM115  (the child keeps it; closed when it ends)
    proc = subprocess.Popen(
        [str(VENV_BIN / "celery"), "-A", "portal", "worker", "--pool", "solo", "--loglevel", "INFO",
         "--hostname", f"{hostname}@%h", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + 30
    while not app.control.ping(destination=[f"{hostname}@{socket.gethostname()}"], timeout=0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"Celery worker did not start:\n{log_path.read_text()[-3000:]}")
    return proc


@pytest.fixture
def celery_worker(transactional_db, tmp_path) -> Iterator[subprocess.Popen]:
    """A real Celery worker on an empty queue, for the length of the test."""
    from portal.celery import app

    app.control.purge()
    proc = start_celery_worker(tmp_path / "worker.log")
    yield proc
    stop(proc)
