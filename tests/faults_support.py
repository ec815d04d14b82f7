"""What the fault tests share (tests/test_faults_*.py): a tenant of their own on the Slurm
testbed, jobs submitted through the service, real Celery workers that a test may kill, and
Slurm's own count of jobs per portal token: the figure every fault is judged by."""

import os
import socket
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from django.utils import timezone

from clusters.backends.slurm import SlurmBackend
from clusters.models import Cluster
from clusters.services import cluster_config
from jobs.models import Job
from jobs.services import JobRequest, job_submit
from tenants.limits import tenant_apply
from tenants.models import QuotaGrant, Role, Tenant
from tests.conftest import ROOT, VENV_BIN, database_url_of_test_db, die_with_parent, join, stop
from tests.factories import catalog_pair
from tests.testbed.env import testbed_identity

SCRIPT = "#!/bin/sh\ntrue\n"  # over at once: the fault tests hold the shared testbed's GPUs briefly
GPU_MODEL = "a100-80gb"  # the a100 partition: the end-to-end tests use h100


@dataclass
class SlurmTenant:
    cluster: Cluster
    tenant: Tenant
    user: object
    request: JobRequest
    backend: SlurmBackend = field(init=False)

    def __post_init__(self) -> None:
        self.backend = SlurmBackend(cluster_config(self.cluster))

    def submit(self, count: int = 1) -> list[int]:
        """Jobs through job_submit, each committed on its own: dispatch is enqueued on commit."""
        return [job_submit(user=self.user, request=self.request)[0].pk for _ in range(count)]

    def slurm_jobs(self) -> dict[str, set[str]]:
        """Slurm job ids per token under the tenant's account: squeue -t all (jobs of the last
        MinJobAge, 300 s) and sacct (the SubmitLine holds --comment=<token>), joined by id."""
        account = self.tenant.slug
        found: dict[str, set[str]] = defaultdict(set)
        live = self.backend.check(["squeue", "-h", "-t", "all", "-A", account, "-o", "%i|%k"])
        for line in live.split():
            job_id, _, token = line.partition("|")
            found[token].add(job_id)
        argv = ["sacct", "-X", "-P", "-n", "-A", account, "-S", "now-1days", "-o", "JobID,SubmitLine"]
        for line in self.backend.check(argv).splitlines():
            job_id, _, submit_line = line.partition("|")
            for word in submit_line.split():
                if word.startswith("--comment="):
                    found[word.removeprefix("--comment=")].add(job_id)
        return found

    def cleanup(self) -> None:
        """Cancel what is left and drop the account (Slurm accounts outlive the test database)."""
        self.backend.run(["scancel", "-A", self.tenant.slug])
        self.backend.run(["sacctmgr", "-i", "delete", "account", self.tenant.slug])


def slurm_tenant(cluster: Cluster, *, gpus: int = 8) -> SlurmTenant:
    """A tenant of its own (unique slug) with a grant of `gpus` concurrent a100 GPUs, applied."""
    scenario, gpu_model = catalog_pair("ai-training", GPU_MODEL)
    tenant = Tenant.objects.create(slug=f"fault-{uuid.uuid4().hex[:8]}", name="Faults")
    testbed_identity(f"pt-{tenant.slug}")  # its job identity on the testbed (the cluster's template)
    user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
    today = timezone.localdate()
    QuotaGrant.objects.create(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=gpus, gpu_hours=Decimal(1000),
        starts_on=today, ends_on=today + timedelta(days=1),
    )  # fmt: skip
    tenant_apply(tenant_id=tenant.pk, cluster_id=cluster.pk)
    request = JobRequest(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=1, walltime_minutes=1, name="fault",
        script=SCRIPT, cluster=cluster, partition="a100",
    )  # fmt: skip
    return SlurmTenant(cluster=cluster, tenant=tenant, user=user, request=request)


@dataclass(frozen=True)
class Tally:
    """Per portal job, its Slurm jobs: lost (none, or the portal gave it up) and doubled (>1)."""

    jobs: int
    lost: list[int]
    doubled: list[int]
    states: dict[str, int]


def tally(job_ids: list[int], by_token: dict[str, set[str]]) -> Tally:
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids)}
    states: dict[str, int] = defaultdict(int)
    lost, doubled = [], []
    for pk in job_ids:
        job = jobs[pk]
        states[job.state] += 1
        in_slurm = by_token.get(job.token, set())
        if not in_slurm or job.state in ("LOST", "REJECTED", "FAILED") or job.backend_id not in in_slurm:
            lost.append(pk)
        if len(in_slurm) > 1:
            doubled.append(pk)
    return Tally(jobs=len(job_ids), lost=lost, doubled=doubled, states=dict(states))


def wait_until(check, *, timeout_s: float, interval_s: float = 0.2, what: str = "condition"):
    """check() until it returns something true; its last value is in the AssertionError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s")
        time.sleep(interval_s)


def spawn_worker(
    log_path: Path, *, redis_url: str, pool: str = "solo", concurrency: int = 1, env: dict | None = None
) -> subprocess.Popen:
    """A real Celery worker on `redis_url`, sharing the test database, still booting; its log
    is the test's to read (task receipts, retries and failures show there). `env`: settings of
    the worker's own (environment variables)."""
    fixed = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url_of_test_db(),
        "REDIS_URL": redis_url,
    }
    env = os.environ | (env or {}) | fixed
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [str(VENV_BIN / "celery"), "-A", "portal", "worker", "--pool", pool, "--concurrency", str(concurrency),
             "--loglevel", "INFO", "--hostname", f"fault-{os.getpid()}-{time.monotonic_ns()}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )  # fmt: skip


def worker_ready(proc: subprocess.Popen, log_path: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"Celery worker exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
    return any(" ready." in line for line in log_path.read_text().splitlines())


def start_worker(
    log_path: Path,
    *,
    redis_url: str,
    pool: str = "solo",
    concurrency: int = 1,
    ready_timeout_s: float = 60,
    env: dict | None = None,
) -> subprocess.Popen:
    """spawn_worker, and wait until the worker logged that it is ready."""
    proc = spawn_worker(log_path, redis_url=redis_url, pool=pool, concurrency=concurrency, env=env)
    try:
        wait_until(
            lambda: worker_ready(proc, log_path), timeout_s=ready_timeout_s, interval_s=0.05, what="worker"
        )
    except BaseException:
        stop(proc)
        raise
    return proc


def pool_children(proc: subprocess.Popen) -> list[int]:
    """The pids of a prefork worker's pool processes."""
    try:
        text = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(pid) for pid in text.split() if _alive(int(pid))]


def _alive(pid: int) -> bool:
    """Running, not a zombie that its parent has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class SilentPeer:
    """A loopback TCP server that accepts and never writes: the SSH banner never comes. It keeps
    each connection open and reads it until the client gives up, so that it can tell how long
    each client waited and how many waited at once."""

    def __init__(self, *, banner: bytes = b""):
        self.banner = banner  # with one, it says that much and no more (the key exchange never comes)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.spans: list[list[float]] = []  # [accepted, closed by the client (or inf)]
        self.running = True
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        while self.running:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            span = [time.monotonic(), float("inf")]
            with self.lock:
                self.spans.append(span)
            thread = threading.Thread(target=self._hold, args=(conn, span), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _hold(self, conn: socket.socket, span: list[float]) -> None:
        conn.settimeout(0.2)
        with conn:
            if self.banner:
                conn.sendall(self.banner)
            while self.running:
                try:
                    if not conn.recv(4096):  # the client closed: its wait is over
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
        span[1] = time.monotonic()

    def waits_s(self) -> list[float]:
        """How long each client that gave up had waited."""
        with self.lock:
            return [closed - accepted for accepted, closed in self.spans if closed != float("inf")]

    def most_at_once(self) -> int:
        """The most connections open at the same time."""
        with self.lock:
            edges = sorted([(a, 1) for a, _ in self.spans] + [(c, -1) for _, c in self.spans])
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most

    def close(self) -> None:
        self.running = False
        for thread in self.threads:
            thread.join(timeout=5)
        self.listener.close()
