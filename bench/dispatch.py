"""Dispatch throughput into Slurm on the testbed: admitted QUEUED jobs → PENDING, by real Celery workers.

N jobs go through the real job_submit (a tenant with a big grant on the testbed's a100 partition,
a one-line script), with no worker running, so that their dispatch messages wait in Redis. Then
the workers start and the figure is jobs/s from the first move to SUBMITTING to the last move to
PENDING (the jobs' own events), over the whole window and per 10 s. The jobs never run: the
tenant's Slurm account gets GrpTRES=gres/gpu=0 after the portal applied its limits, so Slurm
holds every job PENDING (AssocGrpGRES) and the 2-node testbed stays free; all of them are
cancelled at the end, and the bench waits until the account has no job left in Slurm.

Then, for the split of one dispatch, a few more jobs are dispatched in this process under
cProfile, by the very function the Celery task runs (claim, SSH to sbatch, the rest: saving);
and, for comparison, sbatch itself is called in a loop over the same pooled SSH transport with
the portal's own options (one SSH exec each, as a shell script over sbatch would).

Uses its own PostgreSQL database and Redis database (BENCH_DATABASE_URL, BENCH_REDIS_URL),
dropped and made anew; prints figures; asserts nothing about time.

    .venv/bin/python bench/dispatch.py [--jobs 6000] [--concurrency 2] [--loop-jobs 500]

The partition's size in the portal's database is raised to hold N one-GPU jobs at once, so
that admission lets all of them through: what is measured is dispatch, not admission.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.procs import stop_all  # noqa: E402 - once ROOT is on the path (run as a script)

DB_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal_bench_dispatch")
ENV = os.environ | {
    "DJANGO_SETTINGS_MODULE": "portal.settings",
    "DATABASE_URL": DB_URL,
    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"),
    "VAR_DIR": os.environ.get("BENCH_VAR_DIR", str(ROOT / "var" / "bench")),
    "LOG_LEVEL": "WARNING",
}
os.environ.update(ENV)
BIN = Path(sys.executable).parent
SCRIPT = "#!/bin/sh\ntrue\n"
PARTITION = "a100"
DRAIN_TIMEOUT_S = 1800  # the longest a dispatch run may take before the bench gives up
CLEAN_TIMEOUT_S = 600  # for Slurm to forget the cancelled jobs' records (MinJobAge is 300 s)
FORGET_OVER = 20_000  # a run of more jobs waits at the end until slurmctld has forgotten them


@dataclass
class Bench:
    """What the benches share: the testbed cluster, a tenant held in Slurm, its submitter."""

    cluster: object
    tenant: object
    user: object
    request: object

    def backend(self):
        from clusters.services import backend_of

        return backend_of(self.cluster)

    def submit(self, count: int, *, report_every: int = 1000) -> list[int]:
        """`count` jobs through job_submit, each its own transaction, and each admitted by the
        pass its admit task runs (dispatch goes on that pass's commit)."""
        from jobs.models import JobState
        from jobs.services import job_submit, jobs_admit

        ids, started = [], time.monotonic()
        for number in range(1, count + 1):
            job, _created = job_submit(user=self.user, request=self.request)
            jobs_admit(partition_id=job.partition_id)
            job.refresh_from_db()
            if job.state != JobState.QUEUED or not job.holds_gpus:
                raise SystemExit(f"job {job.pk} not admitted: {job.state} {job.reason}")
            ids.append(job.pk)
            if number % report_every == 0:
                print(
                    f"  submitted {number}/{count} ({number / (time.monotonic() - started):.0f}/s)",
                    flush=True,
                )
        return ids

    def slurm_count(self) -> int:
        """The account's jobs that Slurm holds pending or running."""
        return len(self.backend().check(["squeue", "-h", "-A", self.tenant.slug, "-o", "%i"]).split())

    def cleanup(self, *, forgotten: bool) -> None:
        """Cancel everything under the account and wait until Slurm runs or queues none of it;
        with `forgotten`, until slurmctld has dropped their records too (MinJobAge): thousands
        of them count against MaxJobCount for everyone sharing the testbed. Then drop the account
        and the jobs' directory."""
        backend = self.backend()
        backend.run(["scancel", "-A", self.tenant.slug])
        argv = ["squeue", "-h", "-A", self.tenant.slug, "-o", "%T", *(["-t", "all"] if forgotten else [])]
        deadline = time.monotonic() + CLEAN_TIMEOUT_S
        while (left := Counter(backend.check(argv).split())) and time.monotonic() < deadline:
            time.sleep(5)
        backend.run(["sacctmgr", "-i", "delete", "account", self.tenant.slug])
        # the jobs' directory, the identity's own: emptied as that identity (its sudoers rule allows find)
        identity = f"pt-{self.tenant.slug}"
        directory = backend.job_dir(self.tenant.slug, identity)
        backend.run(backend.as_identity(identity, ["find", directory, "-mindepth", "1", "-delete"]))
        what = "records" if forgotten else "pending or running"
        print(
            f"cleanup: scancel -A {self.tenant.slug}; {what} left in slurmctld: {dict(left)}; account deleted"
        )


def slurm_headroom(backend, jobs: int) -> None:
    """Wait (bounded) until slurmctld has room for `jobs` more records under MaxJobCount: ended
    jobs count too until MinJobAge has passed, and a full slurmctld answers sbatch "try again"."""
    config = backend.check(["scontrol", "show", "config"])
    limit = int(next(line.split("=")[1] for line in config.splitlines() if line.startswith("MaxJobCount")))
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    while (
        held := len(backend.check(["squeue", "-h", "-t", "all", "-o", "%i"]).split())
    ) + jobs > limit - 200:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"slurmctld holds {held} job records; {jobs} more would pass MaxJobCount={limit}"
            )
        print(f"  slurmctld holds {held} job records (MaxJobCount={limit}): waiting for room for {jobs}")
        time.sleep(15)


def fresh_database(url: str = DB_URL) -> None:
    name = url.rsplit("/", 1)[1]
    if not name.replace("_", "").isalnum():
        raise SystemExit(f"database name {name!r}: letters, digits and _ only")
    for sql in (f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}"):
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", sql], check=True, capture_output=True
        )


def setup(capacity: int) -> Bench:
    """A fresh database with the testbed registered, and a tenant whose grant takes `capacity`
    one-GPU jobs at once; its Slurm account applied by the portal, then held (GrpTRES gpu=0)."""
    subprocess.run(
        ["bash", str(ROOT / "tests/testbed/testbed.sh"), "up"], check=True, stdout=subprocess.DEVNULL
    )
    fresh_database()
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from clusters.models import Cluster, GpuModel, Partition, Scenario
    from jobs.services import JobRequest
    from portal.celery import app
    from tenants.limits import tenant_apply
    from tenants.models import QuotaGrant, Role, Tenant
    from tenants.services import membership_add
    from tests.testbed.env import testbed_identity

    call_command("migrate", verbosity=0)
    call_command("register_testbed", stdout=open(os.devnull, "w"))  # noqa: SIM115
    app.control.purge()
    cluster = Cluster.objects.get(slug="testbed")
    partition = Partition.objects.get(cluster=cluster, name=PARTITION)
    Partition.objects.filter(pk=partition.pk).update(nodes=max(partition.nodes, capacity))
    scenario, gpu_model = Scenario.objects.get(slug="ai-training"), partition.gpu_model
    tenant = Tenant.objects.create(slug=f"bench-{uuid.uuid4().hex[:6]}", name="Dispatch bench")
    testbed_identity(f"pt-{tenant.slug}")  # its job identity: the registered testbed's template
    user = get_user_model().objects.create_user(f"{tenant.slug}-user", password=uuid.uuid4().hex)
    membership_add(actor=None, tenant=tenant, user=user, role=Role.MEMBER)
    QuotaGrant.objects.create(
        tenant=tenant, scenario=scenario, gpu_model=GpuModel.objects.get(pk=gpu_model.pk), gpus=capacity,
        gpu_hours=Decimal(capacity), starts_on=timezone.localdate(),
        ends_on=timezone.localdate() + timedelta(days=1),
    )  # fmt: skip
    tenant_apply(tenant_id=tenant.pk, cluster_id=cluster.pk)
    bench = Bench(cluster=cluster, tenant=tenant, user=user, request=None)
    where = ["where", f"name={tenant.slug}", "set", "GrpTRES=gres/gpu=0"]
    bench.backend().check(["sacctmgr", "-i", "modify", "account", *where])  # Slurm holds its jobs
    bench.request = JobRequest(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=1, walltime_minutes=1, name="bench",
        script=SCRIPT, cluster=cluster, partition=PARTITION,
    )  # fmt: skip
    return bench


def start_workers(count: int, concurrency: int, log_dir: Path) -> list[subprocess.Popen]:
    """Prefork Celery workers on the bench's broker and database, as the stack runs them."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for number in range(count):
        with open(log_dir / f"worker-{number}.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        str(BIN / "celery"),
                        "-A",
                        "portal",
                        "worker",
                        "--concurrency",
                        str(concurrency),
                        "--loglevel",
                        os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING"),
                        "--hostname",
                        f"bench-dispatch-{number}-{os.getpid()}@%h",
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                    ],
                    cwd=ROOT,
                    env=ENV,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def states_of(job_ids: list[int]) -> Counter:
    from jobs.models import Job

    return Counter(Job.objects.filter(pk__in=job_ids).values_list("state", flat=True))


def queued_messages() -> int:
    """Messages waiting in the broker's default queue (not those a worker holds)."""
    from portal.celery import app

    with app.connection_for_write() as connection:
        return connection.default_channel.client.llen(app.conf.task_default_queue)


def wait_drained(timeout_s: float) -> float:
    """Until the broker's queue is empty: the dispatch messages of jobs that a batch took along
    still cost a worker a task each. Returns when (monotonic) it was seen empty."""
    deadline = time.monotonic() + timeout_s
    while queued_messages() and time.monotonic() < deadline:
        time.sleep(0.2)
    return time.monotonic()


def wait_dispatched(job_ids: list[int], timeout_s: float) -> Counter:
    from jobs.models import JobState

    deadline = time.monotonic() + timeout_s
    while True:
        states = states_of(job_ids)
        waiting = states[JobState.QUEUED] + states[JobState.SUBMITTING]
        if not waiting or time.monotonic() > deadline:
            return states
        time.sleep(1)


def throughput(job_ids: list[int]) -> dict:
    """From the jobs' events: the window from the first SUBMITTING to the last PENDING, and how
    many jobs reached PENDING in each full 10 s of it."""
    from jobs.models import JobEvent, JobState

    events = JobEvent.objects.filter(job_id__in=job_ids, to_state__in=[JobState.SUBMITTING, JobState.PENDING])
    first = min(at for at, to in events.values_list("at", "to_state") if to == JobState.SUBMITTING)
    pending = sorted(events.filter(to_state=JobState.PENDING).values_list("at", flat=True))
    window_s = (pending[-1] - first).total_seconds()
    buckets = Counter(int((at - first).total_seconds() // 10) for at in pending)
    full = [buckets[index] / 10 for index in range(int(window_s // 10))]
    latency = sorted(
        (p - s).total_seconds() for (s, p) in _pairs(events.values_list("job_id", "to_state", "at"))
    )
    return {
        "jobs": len(pending),
        "window_s": window_s,
        "rate": len(pending) / window_s if window_s else float("nan"),
        "per_10s": full,
        "submitting_to_pending_p50_ms": 1000 * statistics.median(latency),
        "submitting_to_pending_max_ms": 1000 * latency[-1],
    }


def _pairs(rows) -> list[tuple]:
    from jobs.models import JobState

    at: dict[int, dict[str, object]] = {}
    for job_id, to_state, when in rows:
        at.setdefault(job_id, {})[to_state] = when
    return [(v[JobState.SUBMITTING], v[JobState.PENDING]) for v in at.values() if len(v) == 2]


def profile_split(bench: Bench, count: int) -> None:
    """Dispatch `count` jobs in this process under cProfile, each by the Celery task's own body,
    as a worker receives them one message at a time; print where the time goes."""
    from jobs.models import Job, JobState
    from jobs.tasks import dispatch_job
    from portal.celery import app

    job_ids = bench.submit(count, report_every=count + 1)
    app.control.purge()  # this process dispatches them; no worker runs now
    dispatch_job.run(job_id=job_ids[0])  # warm: the SSH connection and the home directory
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for job_id in job_ids[1:]:
        dispatch_job.run(job_id=job_id)
    profiler.disable()
    total = time.perf_counter() - started
    done = Job.objects.filter(pk__in=job_ids, state=JobState.PENDING).count()
    stats = pstats.Stats(profiler)
    parts = {"claim": 0.0, "find": 0.0, "SSH sbatch": 0.0}
    for (path, _line, name), (_cc, _nc, _tt, cumulative, _callers) in stats.stats.items():
        if path.endswith(os.path.join("jobs", "services", "dispatch.py")) and name in (
            "job_claim",
            "jobs_claim",
        ):
            parts["claim"] = max(parts["claim"], cumulative)
        if path.endswith(os.path.join("slurm", "backend.py")):
            if name.startswith("submit"):
                parts["SSH sbatch"] = max(parts["SSH sbatch"], cumulative)
            elif name.startswith("find"):
                parts["find"] = max(parts["find"], cumulative)
    jobs = len(job_ids) - 1
    parts["save and the rest"] = total - sum(parts.values())
    print(f"one process, one message per job, {jobs} jobs ({done + 0} PENDING): {jobs / total:.1f} jobs/s")
    print("  per job: " + "   ".join(f"{name} {1000 * value / jobs:.2f} ms" for name, value in parts.items()))
    out = Path(ENV["VAR_DIR"]) / "bench-dispatch.pstats"
    stats.dump_stats(out)
    stats.sort_stats("tottime").print_stats(12)
    print(f"  profile: {out}")


def sbatch_loop(bench: Bench, count: int, tag: str) -> float:
    """sbatch called `count` times, one SSH exec each over the pooled transport, as the tenant's
    job identity through the sudoers rule, with the options the portal gives its jobs (the script
    on stdin); jobs/s."""
    from jobs.models import Job

    job = Job.objects.filter(tenant=bench.tenant).first()
    backend = bench.backend()
    home = backend.job_dir(bench.tenant.slug, job.cluster_user)
    backend.check(backend.as_identity(job.cluster_user, ["mkdir", "-p", "--", home]))
    options = [
        f"--account={bench.tenant.slug}", f"--qos=portal-{bench.tenant.tier}", f"--partition={PARTITION}",
        f"--gres=gpu:{PARTITION}:1", "--nodes=1", "--time=1", f"--cpus-per-gpu={job.cpus_per_gpu}",
        f"--mem-per-gpu={job.mem_per_gpu_mb}M",
        f"--output={home}/loop.out", f"--error={home}/loop.out", f"--chdir={home}",
    ]  # fmt: skip
    started = time.perf_counter()
    for number in range(count):
        argv = ["sbatch", "--parsable", "--job-name=loop", *options, f"--comment=loop-{tag}-{number}"]
        backend.check(backend.as_identity(job.cluster_user, argv), stdin=SCRIPT)
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=6000, help="jobs dispatched by the workers")
    parser.add_argument("--workers", type=int, default=1, help="Celery worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes per worker")
    parser.add_argument("--profile-jobs", type=int, default=200, help="jobs dispatched here under cProfile")
    parser.add_argument("--loop-jobs", type=int, default=500, help="sbatch calls of the comparison loop")
    args = parser.parse_args()
    total = args.jobs + args.profile_jobs + 1
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    bench = setup(capacity=total)
    slurm_headroom(bench.backend(), total + args.loop_jobs)
    from jobs.models import JobState

    procs: list[subprocess.Popen] = []
    try:
        print(f"tenant {bench.tenant.slug}: {args.jobs} jobs through job_submit (no worker yet)")
        started = time.monotonic()
        job_ids = bench.submit(args.jobs)
        print(f"  {args.jobs / (time.monotonic() - started):.0f} jobs/s submitted")
        loop_before = sbatch_loop(bench, args.loop_jobs // 2, "before") if args.loop_jobs > 1 else None
        procs = start_workers(args.workers, args.concurrency, Path(ENV["VAR_DIR"]) / "bench-dispatch-logs")
        started = time.monotonic()
        states = wait_dispatched(job_ids, DRAIN_TIMEOUT_S)
        drained_s = wait_drained(DRAIN_TIMEOUT_S) - started
        stop_all(procs)
        procs = []
        figures = throughput(job_ids)
        per_10s = figures["per_10s"]
        print(f"dispatch by {args.workers}×{args.concurrency} Celery worker processes: {dict(states)}")
        print(
            f"  {figures['jobs']} jobs PENDING in {figures['window_s']:.1f} s: {figures['rate']:.1f} jobs/s"
            + (f"   per 10 s: min {min(per_10s):.1f} median {statistics.median(per_10s):.1f} "
               f"max {max(per_10s):.1f} jobs/s over {len(per_10s)} full windows" if per_10s else "")
        )  # fmt: skip
        print(
            f"  SUBMITTING → PENDING per job: p50 {figures['submitting_to_pending_p50_ms']:.0f} ms, "
            f"max {figures['submitting_to_pending_max_ms']:.0f} ms"
        )
        print(
            f"  all {args.jobs} dispatch messages consumed {drained_s:.1f} s after the workers started "
            f"(they boot in ~2 s): {args.jobs / drained_s:.1f} jobs/s including boot and the messages "
            "of jobs that went in another job's batch"
        )
        print(f"  in Slurm under the account: {bench.slurm_count()} (held: AssocGrpGRES)")
        if states[JobState.PENDING] != args.jobs:
            print(f"  NOT ALL DISPATCHED: {dict(states)}")
        if args.profile_jobs:
            profile_split(bench, args.profile_jobs)
        if loop_before is not None:
            loop_after = sbatch_loop(bench, args.loop_jobs - args.loop_jobs // 2, "after")
            print(
                f"sbatch in a loop, one SSH exec each on the pooled transport: {loop_before:.1f} jobs/s "
                f"before the workers ran, {loop_after:.1f} jobs/s after ({args.jobs} more jobs in slurmctld)"
            )
    finally:
        stop_all(procs)
        bench.cleanup(forgotten=total > FORGET_OVER)
        print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
