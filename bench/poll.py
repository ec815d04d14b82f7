"""One poll cycle over many active Slurm jobs on the testbed: seconds, scheduler calls, DB queries.

N jobs (2,000 by default) go through job_submit and are dispatched in this process by the
dispatch task's own body, under a tenant whose Slurm account holds them PENDING (AssocGrpGRES,
as bench/dispatch.py sets it up): N active jobs in the portal and in Slurm. Then jobs_poll runs
for the cluster, as beat's poll task does, in four situations:

  first     the first poll after dispatch: every job's reason changes ("submitted" → Slurm's)
  steady    nothing changed since the last poll: the common case
  held      200 of the jobs held in Slurm (scontrol hold): their reason changes
  ended     100 of the jobs cancelled in Slurm: they end (charged, released, next admitted)

Each prints the wall time of the cycle, the remote commands it ran (scheduler calls), the SQL
queries, and how many jobs moved. Everything is cancelled at the end and the bench waits until
slurmctld has forgotten the jobs. Own database and Redis database as bench/dispatch.py
(BENCH_DATABASE_URL, BENCH_REDIS_URL); prints figures, asserts nothing about time.

    .venv/bin/python bench/poll.py [--jobs 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dispatch import Bench, setup, slurm_headroom  # sets the environment first

HELD = 200
ENDED = 100


def commands_run(bench: Bench) -> int:
    """Remote commands this process sent to the cluster so far."""
    from clusters.backends.slurm import ssh

    return ssh.commands_run(bench.cluster.slug)


class QueryCounter:
    """Every SQL statement run, however many (CaptureQueriesContext keeps the last 9000)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def cycle(bench: Bench, name: str, repeat: int) -> None:
    """jobs_poll `repeat` times (once for a situation that the first cycle consumes)."""
    from django.db import connection

    from jobs.services import jobs_poll

    seconds, calls, queries, moved = [], [], [], []
    for _ in range(repeat):
        before, counter = commands_run(bench), QueryCounter()
        with connection.execute_wrapper(counter):
            started = time.perf_counter()
            moved.append(jobs_poll(cluster_id=bench.cluster.pk))
            seconds.append(time.perf_counter() - started)
        calls.append(commands_run(bench) - before)
        queries.append(counter.count)
    print(
        f"  {name:<7} {statistics.median(seconds):6.2f} s   scheduler calls {max(calls)}   "
        f"SQL queries {statistics.median(queries):5.0f}   jobs moved {moved[0]}"
        + (f"   (median of {repeat})" if repeat > 1 else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="active jobs to poll")
    parser.add_argument("--repeat", type=int, default=3, help="cycles of the steady case")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    bench = setup(capacity=args.jobs)
    slurm_headroom(bench.backend(), args.jobs)
    from jobs.models import Job, JobState
    from jobs.tasks import dispatch_job
    from portal.celery import app

    try:
        print(f"tenant {bench.tenant.slug}: {args.jobs} jobs through job_submit, dispatched here")
        job_ids = bench.submit(args.jobs)
        app.control.purge()  # no worker: this process dispatches
        started = time.monotonic()
        for job_id in job_ids:
            dispatch_job.run(job_id=job_id)
        pending = Job.objects.filter(pk__in=job_ids, state=JobState.PENDING)
        print(f"  {pending.count()} PENDING in {time.monotonic() - started:.1f} s; polling them:")
        cycle(bench, "first", 1)
        cycle(bench, "steady", args.repeat)
        ids = list(pending.order_by("pk").values_list("backend_id", flat=True))
        bench.backend().check(["scontrol", "hold", ",".join(ids[:HELD])])
        cycle(bench, "held", 1)
        bench.backend().check(["scancel", *ids[HELD : HELD + ENDED]])
        cycle(bench, "ended", 1)
        cycle(bench, "steady", args.repeat)
    finally:
        bench.cleanup(forgotten=True)
        print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
