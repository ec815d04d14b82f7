"""Faults between the portal and Slurm: slurmctld stopped, SSH refused or hanging, and the
portal's own transaction failing after sbatch went through. Real worker, real testbed, real
PostgreSQL; the faults are made outside the code under test (a stopped daemon, a loopback
server that never answers, a trigger that refuses one UPDATE)."""

import json
import re
import subprocess
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from clusters.models import Cluster
from clusters.services import backend_of
from clusters.tasks import BACKEND_RETRY
from jobs.models import Job, JobState
from jobs.services import jobs_dispatch, jobs_poll, jobs_sweep
from jobs.tasks import dispatch_job, sweep_jobs
from portal.celery import app
from tests.conftest import free_port, stop
from tests.factories import ClusterFactory, PartitionFactory
from tests.faults_support import SilentPeer, start_worker, tally
from tests.slurm_support import slurm_tenant
from tests.testbed.env import TESTBED_SCRIPT, registered_testbed, testbed_env
from tests.wait_support import wait_until

DISPATCH_SOFT_LIMIT_S = settings.JOB_DISPATCH_TIME_LIMIT_S - 30  # jobs.tasks.dispatch_job


def _dispatch_log(log_path) -> dict[int, list[tuple[datetime, str]]]:
    """Per job id, what the worker logged of its dispatch task, in order: "received" (a retry's
    message too) and "retry: Retry in Ns: <why>". A retry line names the task, not the job."""
    job_of_task: dict[str, int] = {}
    events = defaultdict(list)
    for line in log_path.read_text().splitlines():
        if not line.startswith("{") or "jobs.tasks.dispatch_job[" not in line:
            continue
        record = json.loads(line)
        data = record["data"]
        if "kwargs" in data:
            job_of_task[data["id"]] = int(re.search(r"'job_id': (\d+)", data["kwargs"])[1])
        at = datetime.strptime(record["time"], "%Y-%m-%d %H:%M:%S,%f")
        events[job_of_task[data["id"]]].append((at, record["message"].split("] ", 1)[1]))
    return events


def _retries_logged(log_path) -> int:
    return sum(what.startswith("retry:") for lines in _dispatch_log(log_path).values() for _, what in lines)


# --- slurmctld stopped


def _testbed(command: str) -> None:
    subprocess.run(["bash", str(TESTBED_SCRIPT), command], check=True, capture_output=True, timeout=120)


@pytest.mark.django_db(transaction=True)
def test_slurmctld_stopped_jobs_wait_and_converge_after_its_restart(tmp_path, catalog):
    cluster = registered_testbed()
    bed = slurm_tenant(cluster)
    log = tmp_path / "worker.log"
    app.control.purge()
    worker = start_worker(log, redis_url=settings.REDIS_URL)
    try:
        bed.request = replace(bed.request, script="#!/bin/sh\nsleep 20\n")  # lives through the outage
        [before] = bed.submit()
        wait_until(lambda: Job.objects.get(pk=before).state == JobState.PENDING, timeout_s=30)
        _testbed("ctld-stop")
        outage_started = time.monotonic()
        try:
            [during] = bed.submit()  # the worker's sbatch finds no controller
            assert jobs_poll(cluster_id=cluster.pk) == 0  # squeue finds none either: nothing moves
            assert not Cluster.objects.get(pk=cluster.pk).healthy
            wait_until(lambda: _retries_logged(log) >= 1, timeout_s=30, what="dispatch retry scheduled")
            waiting = dict(Job.objects.filter(pk__in=[before, during]).values_list("pk", "state"))
            assert waiting[during] == JobState.SUBMITTING, waiting
            assert waiting[before] in (JobState.PENDING, JobState.RUNNING), waiting
            assert Job.objects.get(pk=during).backend_id == ""
        finally:
            _testbed("ctld-start")
        outage_s = time.monotonic() - outage_started

        def converged() -> bool:
            jobs_sweep()  # re-sends the dispatch whose retries may still wait in their backoff
            jobs_poll(cluster_id=cluster.pk)
            states = set(Job.objects.filter(pk__in=[before, during]).values_list("state", flat=True))
            return states <= {JobState.PENDING, JobState.RUNNING, JobState.COMPLETED}

        wait_until(converged, timeout_s=60, interval_s=1, what="both jobs past SUBMITTING")
        assert Cluster.objects.get(pk=cluster.pk).healthy
        figures = tally([before, during], bed.slurm_jobs())
        retries = _retries_logged(log)
    finally:
        stop(worker)
        bed.cleanup()
    print(
        f"\n[faults] slurmctld stopped {outage_s:.1f}s: runs=2 jobs, dispatch retries={retries}, "
        f"lost={len(figures.lost)} doubled={len(figures.doubled)} states={figures.states}"
    )
    assert figures.lost == [] and figures.doubled == [], figures


# --- SSH refused or hanging


def _fake_cluster(slug: str, port: int, gpu_model, key: str) -> Cluster:
    cluster = ClusterFactory(
        slug=slug, name=slug, kind="slurm", ssh_host="127.0.0.1", ssh_port=port, ssh_user="gpuportal",
        ssh_private_key=key, scratch_root="/srv/portal-jobs",
    )  # fmt: skip
    PartitionFactory(
        cluster=cluster, name="a100", gpu_model=gpu_model, gpus_per_node=4, max_walltime_minutes=60,
        max_cpus_per_gpu=1, max_mem_per_gpu_mb=1000,
    )  # fmt: skip
    return cluster


@pytest.mark.django_db(transaction=True)
def test_ssh_refused_or_hanging_ends_each_dispatch_within_its_bound_and_retries(tmp_path, catalog):
    """Three clusters, three SSH faults, dispatched side by side by one worker of three pool
    processes. Each attempt must end in its connect bound (far below the task's limits) with
    the cluster marked unhealthy and a retry scheduled, and connect once per attempt."""
    cluster = registered_testbed()
    bed = slurm_tenant(cluster)  # the tenant and grant; its jobs go to the faulty clusters below
    key = Path(testbed_env()["SLURM_TESTBED_KEY_FILE"]).read_text()  # a real key; no server will ask for it
    silent, banner_only = SilentPeer(), SilentPeer(banner=b"SSH-2.0-OpenSSH_9.2\r\n")
    faults = {
        "ssh-refused": (free_port(), None),  # nothing listens there
        "ssh-silent": (silent.port, silent),
        "ssh-banner-only": (banner_only.port, banner_only),
    }
    clusters = {
        slug: _fake_cluster(slug, port, bed.request.gpu_model, key) for slug, (port, _) in faults.items()
    }
    bound_s = backend_of(clusters["ssh-silent"]).connect_timeout_s  # the bound of each SSH wait
    log = tmp_path / "worker.log"
    app.control.purge()
    worker = start_worker(log, redis_url=settings.REDIS_URL, pool="prefork", concurrency=3)
    try:
        jobs = {}
        for slug, faulty in clusters.items():
            bed.request = replace(bed.request, cluster=faulty, partition="a100")
            [jobs[slug]] = bed.submit()

        def first_attempts_over() -> dict | None:
            events = _dispatch_log(log)
            over = {
                slug: events[pk]
                for slug, pk in jobs.items()
                if any(w.startswith("retry:") for _, w in events[pk])
            }
            return over if len(over) == len(jobs) else None

        wait_until(first_attempts_over, timeout_s=bound_s * 3, what="a retry scheduled for each cluster")
        figures = {}
        for slug, events in first_attempts_over().items():
            received, retried = events[0][0], next(at for at, what in events if what.startswith("retry:"))
            countdowns = [int(m[1]) for _, what in events if (m := re.match(r"retry: Retry in (\d+)s", what))]
            job, faulty, server = Job.objects.get(pk=jobs[slug]), clusters[slug], faults[slug][1]
            faulty.refresh_from_db()
            figures[slug] = (
                (retried - received).total_seconds(),
                countdowns,
                len(server.spans) if server else 0,
            )
            assert not faulty.healthy and faulty.health_detail.startswith("SSH to"), faulty.health_detail
            assert job.state == JobState.SUBMITTING and job.backend_id == ""
            # one connection per attempt at most (the one under way may not have connected yet)
            assert not server or len(server.spans) <= job.dispatch_attempts, (
                slug,
                len(server.spans),
                job.dispatch_attempts,
            )
    finally:
        stop(worker)
        silent.close()
        banner_only.close()
        bed.cleanup()
    for slug, (attempt_s, countdowns, accepted) in figures.items():
        print(f"\n[faults] {slug}: first attempt {attempt_s:.2f}s (bound {bound_s:g}s, task limit "
              f"{settings.JOB_DISPATCH_TIME_LIMIT_S}s), retries so far {len(countdowns)} in {countdowns}s, "
              f"connections={accepted}", end="")  # fmt: skip
        assert attempt_s < min(bound_s + 3, DISPATCH_SOFT_LIMIT_S), (slug, attempt_s)
        assert all(countdown <= BACKEND_RETRY["retry_backoff_max"] for countdown in countdowns)
    print()
    assert figures["ssh-refused"][0] < 2
    # Bounded retries: at most max_retries, each wait capped, all far inside the broker's
    # visibility timeout; past them the job waits for the sweep, in the database.
    assert (dispatch_job.max_retries, BACKEND_RETRY["retry_backoff_max"]) == (8, 120)
    assert BACKEND_RETRY["retry_backoff_max"] < settings.BROKER_VISIBILITY_TIMEOUT_S


# --- A transaction that fails after sbatch accepted the job


TRIGGER = """
CREATE OR REPLACE FUNCTION fault_refuse_backend_id() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'fault test: refusing to store the backend id of job %', NEW.id; END
$$ LANGUAGE plpgsql;
CREATE TRIGGER fault_refuse_backend_id BEFORE UPDATE ON jobs_job FOR EACH ROW
WHEN (NEW.id = {job_id} AND NEW.backend_id <> OLD.backend_id) EXECUTE FUNCTION fault_refuse_backend_id();
"""
DROP_TRIGGER = """
DROP TRIGGER IF EXISTS fault_refuse_backend_id ON jobs_job;
DROP FUNCTION IF EXISTS fault_refuse_backend_id();
"""


@pytest.mark.django_db(transaction=True)
def test_a_transaction_failing_after_sbatch_is_healed_by_find_on_the_next_sweep(tmp_path, catalog, settings):
    cluster = registered_testbed()
    bed = slurm_tenant(cluster)
    app.control.purge()
    [job_id] = bed.submit()  # no worker yet: its dispatch message waits in the queue
    app.control.purge()  # and is lost, as if the worker that took it died: the sweep must do
    settings.JOB_DISPATCH_LEASE_S = 2  # this dispatcher's lease; the worker's is the real one
    worker = None
    try:
        with connection.cursor() as cursor:
            cursor.execute(TRIGGER.format(job_id=int(job_id)))
        try:
            with pytest.raises(DatabaseError, match="refusing to store the backend id"):
                jobs_dispatch(job_id=job_id, batch=1)  # sbatch goes through; saving its id rolls back
        finally:
            with connection.cursor() as cursor:
                cursor.execute(DROP_TRIGGER)
        failed = Job.objects.get(pk=job_id)
        assert (failed.state, failed.backend_id) == (JobState.SUBMITTING, "")
        [submitted] = bed.slurm_jobs()[failed.token]  # Slurm has it; the portal does not know
        assert jobs_sweep() == 0  # within the lease, the sweep leaves it to its dispatcher
        wait_until(lambda: failed.dispatch_lease_until < timezone.now() - timedelta(seconds=0.1), timeout_s=5)
        worker = start_worker(tmp_path / "worker.log", redis_url=settings.REDIS_URL)
        assert sweep_jobs.delay().get(timeout=30) == 1
        wait_until(lambda: Job.objects.get(pk=job_id).state == JobState.PENDING, timeout_s=30, what="adopted")
        healed = Job.objects.get(pk=job_id)
        figures = tally([job_id], bed.slurm_jobs())
    finally:
        if worker is not None:
            stop(worker)
        bed.cleanup()
    print(
        f"\n[faults] transaction failed after sbatch: runs=1, lost={len(figures.lost)} "
        f"doubled={len(figures.doubled)}, adopted {healed.backend_id} on attempt {healed.dispatch_attempts}"
    )
    assert healed.backend_id == submitted and healed.dispatch_attempts == 2
    assert figures.lost == [] and figures.doubled == [], figures
