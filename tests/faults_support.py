"""What the fault tests share (tests/faults/): real Celery workers that a test may kill,
a loopback peer that never answers, and Slurm's own count of jobs per portal token: the figure
every fault is judged by. Their tenant on the Slurm testbed comes from tests/slurm_support.py."""

import os
import socket
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from jobs.models import Job
from tests.conftest import ROOT, VENV_BIN, database_url_of_test_db, die_with_parent, stop
from tests.wait_support import wait_until


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
