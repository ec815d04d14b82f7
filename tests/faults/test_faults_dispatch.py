"""Fault: the worker SIGKILLed while it dispatches, at every step, 50 times.

Three real Celery workers (solo pool: the worker is the process that dispatches) send jobs to
the Slurm testbed. Each round, the test waits until one of them has a dispatch in hand (its log
shows the task received and not finished, and the job's lease is fresh), then SIGKILLs that
worker after a random delay drawn over the length of a dispatch, measured on the workers' own
first dispatches (one draw in three over its first twentieth, where the claim's short steps
are): so each kill lands at a random point of one dispatch, and over 50 rounds at every step of
it. The message stays unacknowledged in Redis (until the broker's visibility timeout, an hour);
a new worker boots in the killed one's place while the others go on. Before each round, the
leases of the dead dispatchers are treated as run out and the sweep runs, so recovery
(find(token) first) is killed too. At the end one sweep, and the figure: Slurm jobs per portal
job, by token, exactly 1.

Where each kill landed is read from the database and Slurm just after it: the job still leased
and QUEUED (between the lease and the move to SUBMITTING), SUBMITTING and unknown to Slurm
(SSH, find, mkdir, or sbatch not yet through), SUBMITTING and known to Slurm (sbatch went
through, the id was never saved: the case find(token) exists for), or past SUBMITTING (after
the save, before the acknowledgement)."""

import json
import os
import random
import re
import signal
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from clusters.models import Partition
from jobs.models import Job, JobEvent, JobState
from jobs.services import jobs_sweep
from portal.celery import app
from tests.conftest import stop
from tests.faults_support import spawn_worker, tally, worker_ready
from tests.slurm_support import slurm_tenant
from tests.testbed.env import registered_testbed
from tests.wait_support import wait_until

KILLS = 50
WORKERS = 3
JOBS_PER_ROUND = 2
SEED = 20261129  # random but replayable kill times
SETTLE_S = 0.2  # after a kill, for an sbatch already on its way to finish on the login node
# A dead dispatcher's lease is treated as run out this long after its claim, instead of the
# JOB_DISPATCH_LEASE_S (180 s) that production waits: long enough for an sbatch that the
# killed process had sent to have reached slurmctld, which is what the real lease guarantees.
ORPHAN_S = 2.0
LEASE = timedelta(seconds=settings.JOB_DISPATCH_LEASE_S)  # the workers': the same test settings
ENDED = ("succeeded in", "retry:", "raised", "ignored")


class Worker:
    """One worker process and its log; `in_hand()`: the jobs it received and has not finished."""

    def __init__(self, folder: Path, number: int):
        self.log = folder / f"worker-{number}.log"
        self.proc = spawn_worker(self.log, redis_url=settings.REDIS_URL)
        self.booted = False
        self.read_to = 0  # the log is read on from here: polled every few ms, it must be cheap
        self.tasks: dict[str, tuple[bool, int]] = {}  # task id → (ended, job id)

    def ready(self) -> bool:
        self.booted = self.booted or worker_ready(self.proc, self.log)
        return self.booted and self.proc.poll() is None

    def in_hand(self) -> list[int]:
        with self.log.open() as log:
            log.seek(self.read_to)
            while (line := log.readline()).endswith("\n"):
                self.read_to += len(line.encode())
                if line.startswith("{") and "jobs.tasks.dispatch_job[" in line:
                    record = json.loads(line)
                    task = record["message"].split("[", 1)[1].split("]", 1)[0]
                    kwargs = record.get("data", {}).get("kwargs", "")
                    found = re.search(r"'job_id': (\d+)", kwargs)
                    job_id = int(found[1]) if found else self.tasks[task][1]
                    self.tasks[task] = (any(word in record["message"] for word in ENDED), job_id)
        return [job_id for ended, job_id in self.tasks.values() if not ended]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def _expire_dead_leases(workers: list[Worker], job_ids: list[int]) -> int:
    """Treat as run out the leases taken ORPHAN_S ago or more that no live worker holds: their
    dispatcher was killed. A live one has the job in hand (its log shows the task received before
    the claim and not ended); a claim made meanwhile is newer than the cutoff, and the UPDATE's
    own condition leaves it alone."""
    held = {job for worker in workers if worker.proc.poll() is None for job in worker.in_hand()}
    now = timezone.now()
    cutoff = now + LEASE - timedelta(seconds=ORPHAN_S)
    dead = Job.objects.filter(pk__in=job_ids, dispatch_lease_until__gt=now, dispatch_lease_until__lte=cutoff)
    return dead.exclude(pk__in=held).update(dispatch_lease_until=now - timedelta(seconds=1))


def _queued() -> int:
    """Messages waiting in the broker's default queue."""
    with app.connection_for_write() as connection:
        return connection.default_channel.client.llen(app.conf.task_default_queue)


def _busy(workers: list[Worker], since) -> tuple[Worker, int] | None:
    """A worker that claimed a job since `since` and holds it: a dispatch under way. A message
    whose claim fails on a live lease ends at once and is passed over."""
    for worker in workers:
        jobs = worker.in_hand() if worker.ready() else []
        if jobs and Job.objects.filter(pk=jobs[-1], dispatch_lease_until__gt=since + LEASE).exists():
            return worker, jobs[-1]
    return None


def _dispatch_seconds(job_ids: list[int]) -> list[float]:
    """From the move to SUBMITTING to the move to PENDING, per job."""
    events = JobEvent.objects.filter(job_id__in=job_ids, to_state__in=[JobState.SUBMITTING, JobState.PENDING])
    at = {(event.job_id, event.to_state): event.at for event in events}
    return [(at[pk, JobState.PENDING] - at[pk, JobState.SUBMITTING]).total_seconds() for pk in job_ids]


def _step(victim: Job | None, in_slurm: bool) -> str:
    if victim is None:
        return "between two dispatches"
    recovery = " (recovery)" if victim.dispatch_attempts > 1 else ""
    if victim.state == JobState.QUEUED:
        return f"leased, not yet SUBMITTING{recovery}"
    if victim.state != JobState.SUBMITTING:
        return "after the save, before the acknowledgement"
    return f"after sbatch, id not saved{recovery}" if in_slurm else f"before sbatch{recovery}"


@pytest.mark.django_db(transaction=True)
def test_worker_killed_at_every_step_of_dispatch_leaves_one_slurm_job_per_job(tmp_path, catalog):
    cluster = registered_testbed()
    # The portal admits no more than its partition holds; the loop keeps more jobs in flight
    # than the testbed's 8 GPUs, which Slurm queues. Submissions are what is counted, not runs.
    Partition.objects.filter(cluster=cluster, name="a100").update(nodes=100)
    bed = slurm_tenant(cluster, gpus=400)
    app.control.purge()
    workers = [Worker(tmp_path, number) for number in range(WORKERS)]
    rng = random.Random(SEED)  # noqa: S311  (kill times, not secrets)
    steps: Counter[str] = Counter()
    job_ids: list[int] = []
    try:
        wait_until(lambda: all(w.ready() for w in workers), timeout_s=60, what="workers ready")
        started = time.monotonic()
        # Calibration: the first dispatch of a worker process connects over SSH first (cold).
        warmup = bed.submit(2 * WORKERS)
        job_ids += warmup
        wait_until(
            lambda: not Job.objects.filter(pk__in=warmup).exclude(state=JobState.PENDING).exists(),
            timeout_s=60, what="warm-up dispatches",
        )  # fmt: skip
        durations = sorted(_dispatch_seconds(warmup))
        spread_s = 1.25 * durations[-1]  # a worker booted in an earlier round: its first is cold
        for kill in range(KILLS):
            round_started = timezone.now()
            _expire_dead_leases(workers, job_ids)
            jobs_sweep()  # re-sends what earlier kills left: recovery gets killed too
            for _ in range(10):  # a warm dispatch may begin and end between two looks: send more
                job_ids += bed.submit(JOBS_PER_ROUND)
                deadline = time.monotonic() + 3
                while not (caught := _busy(workers, round_started)) and time.monotonic() < deadline:
                    time.sleep(0.002)
                if caught:
                    break
            else:
                raise AssertionError("no dispatch caught in hand in 10 tries")
            worker = caught[0]
            # Over the whole dispatch, and one kill in three within its first twentieth: the claim's
            # two transactions (the lease, then the move to SUBMITTING) are a few milliseconds of a
            # dispatch that sbatch and sudo make hundreds long, and every step must be hit.
            early = rng.random() < 1 / 3
            time.sleep(rng.uniform(0, spread_s / 20 if early else spread_s))
            in_hand = worker.in_hand()  # by now maybe the next job: a warm dispatch takes ~20 ms
            worker.kill()
            workers[workers.index(worker)] = Worker(tmp_path, WORKERS + kill)  # boots while the others go on
            victim = Job.objects.get(pk=in_hand[-1]) if in_hand else None
            time.sleep(SETTLE_S)
            in_slurm = (
                victim is not None
                and victim.state == JobState.SUBMITTING
                and victim.token in bed.slurm_jobs()
            )
            steps[_step(victim, in_slurm)] += 1
        loop_s = time.monotonic() - started
        # Recovery: the workers finish what they hold, the dead dispatchers' leases run out,
        # and one sweep re-sends what is left. Idle means nothing in hand and nothing queued:
        # the rounds' sweeps left duplicates, whose claims fail on a dead lease but would count
        # as holding it while they run.
        wait_until(lambda: not any(w.in_hand() for w in workers) and not _queued(), timeout_s=30, what="idle")
        time.sleep(ORPHAN_S)
        _expire_dead_leases(workers, job_ids)
        jobs_sweep()
        unsettled = Job.objects.filter(pk__in=job_ids, state__in=[JobState.QUEUED, JobState.SUBMITTING])
        try:
            wait_until(
                lambda: not unsettled.exists(), timeout_s=60, interval_s=0.5, what="all past SUBMITTING"
            )
        except AssertionError:
            rows = unsettled.values_list(
                "pk", "state", "dispatch_lease_until", "dispatch_attempts", "holds_gpus"
            )
            raise AssertionError(f"after one sweep, still {list(rows)} (now {timezone.now()})") from None
        figures = tally(job_ids, bed.slurm_jobs())
    finally:
        for worker in workers:
            stop(worker.proc)
        bed.cleanup()
    print(
        f"\n[faults] dispatch kills: runs={KILLS} jobs={figures.jobs} "
        f"lost={len(figures.lost)} doubled={len(figures.doubled)} states={figures.states} "
        f"kill delay 0-{spread_s * 1000:.0f}ms after a dispatch began (dispatch {durations[0] * 1000:.0f}-"
        f"{durations[-1] * 1000:.0f}ms) loop={loop_s:.1f}s"
    )
    for step, count in sorted(steps.items()):
        print(f"[faults]   killed {step}: {count}")
    assert figures.lost == [] and figures.doubled == [], figures
    assert set(figures.states) <= {JobState.PENDING}, figures.states
    # The kills spread over the steps of a dispatch. Where each lands is chance: the narrowest
    # window (sbatch through, the id not yet saved) is hit in some runs and not in others, so it
    # is not asserted here; test_faults_slurm's failed-transaction test forces that very state
    # every run and proves find(token) adopts the job.
    first_tries = {step for step in steps if not step.endswith("(recovery)")}
    assert {"before sbatch", "leased, not yet SUBMITTING"} <= first_tries, steps
    assert any(step.endswith("(recovery)") for step in steps), steps  # recovery was killed too
