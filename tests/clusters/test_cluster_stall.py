"""One slow cluster cannot stall the others (clusters/breaker.py, docs/architecture/cluster-stall.md).

The stalled cluster is a Slurm cluster whose login node is a loopback TCP server that accepts
and never answers (the SSH banner never comes), with a known_hosts entry and a key, exactly as
an admin registers one; 300 admitted jobs wait for it and 5 were in its queue before it hung.
The healthy cluster is a local one. A real Celery worker of three pool processes runs the real
tasks, which the test sends as beat would; the stalled cluster's 300 dispatch messages are in
the queue before the healthy cluster's. Then the stalled cluster is replaced by one that answers
(the Slurm testbed is not this test's to use: a local cluster in its place) and its jobs go on."""

import io
import os
import subprocess
import time
import uuid

import paramiko
import pytest
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count
from django.utils import timezone

from clusters import breaker
from clusters.backends.slurm import SlurmBackend
from clusters.breaker import REASON_UNAVAILABLE, breaker_state, cluster_slot
from clusters.models import Cluster, Partition
from clusters.services import backend_of, cluster_available, cluster_config, cluster_mark_health
from jobs.models import Job, JobEvent, JobState
from jobs.services import JobRequest
from jobs.tasks import poll_clusters, sweep_jobs
from portal.celery import app
from tests.conftest import stop
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory
from tests.faults_support import SilentPeer, start_worker
from tests.jobs_support import submit_admitted
from tests.wait_support import wait_until

PERIOD_S = 10  # the poll period of this test's beat: JOB_POLL_INTERVAL_S's default
SWEEP_S = 60  # beat's sweep period (CELERY_BEAT_SCHEDULE)
COOLOFF_S = 5  # the breaker's first cool-off, in the worker
WORKERS = 3
STALLED_JOBS = 300
QUEUED_BEFORE = 5  # in the stalled cluster's queue before it hung: its poll hangs too
HEALTHY_JOBS = 4  # per round, two rounds
DISPATCHED = (JobState.PENDING, JobState.RUNNING, JobState.COMPLETED)


def _slurm_cluster(port: int) -> Cluster:
    """A Slurm cluster registered as an admin would: host, port, user, key, known_hosts line."""
    host_key, client_key, text = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate(), io.StringIO()
    client_key.write_private_key(text)
    slug = f"hung-{uuid.uuid4().hex[:8]}"
    return ClusterFactory(
        slug=slug, name=slug, kind="slurm", ssh_host="127.0.0.1", ssh_port=port, ssh_user="gpuportal",
        ssh_private_key=text.getvalue(), scratch_root="/srv/portal-jobs",
        ssh_known_hosts=f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n",
    )  # fmt: skip


def _local_cluster() -> Cluster:
    slug = f"ok-{uuid.uuid4().hex[:8]}"  # its own state directory under VAR_DIR
    return ClusterFactory(slug=slug, name=slug)


def _partition(cluster: Cluster, gpu_model, *, gpus: int) -> Partition:
    return PartitionFactory(
        cluster=cluster, name="gpu", gpu_model=gpu_model, gpus_per_node=gpus, max_walltime_minutes=60,
        max_cpus_per_gpu=1, max_mem_per_gpu_mb=1000,
    )  # fmt: skip


def _submit(user, request: JobRequest, count: int) -> list[int]:
    """Through job_submit, each committed on its own and admitted as the admit task would: its
    dispatch message goes on the admission's commit."""
    return [submit_admitted(user, request).pk for _ in range(count)]


def _latency_s(job_ids: list[int], to_state: str, since=None) -> list[float]:
    """Per job, from `since` (or its submission) to its move to to_state."""
    events = JobEvent.objects.filter(job_id__in=job_ids)
    at = {(e.job_id, e.to_state): e.at for e in events.filter(to_state__in=[JobState.QUEUED, to_state])}
    return sorted((at[pk, to_state] - (since or at[pk, JobState.QUEUED])).total_seconds() for pk in job_ids)


def _states(job_ids: list[int]) -> dict[str, int]:
    rows = Job.objects.filter(pk__in=job_ids).values("state").annotate(n=Count("pk"))
    return {row["state"]: row["n"] for row in rows}


class Beat:
    """What beat sends, on beat's schedule: the poll fan-out every PERIOD_S, the sweep every 60 s."""

    def __init__(self):
        self.started = self.polled = self.swept = time.monotonic()
        poll_clusters.apply_async(expires=PERIOD_S - 1)

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.polled >= PERIOD_S:
            self.polled = now
            poll_clusters.apply_async(expires=PERIOD_S - 1)
        if now - self.swept >= SWEEP_S:
            self.swept = now
            sweep_jobs.apply_async(expires=55)


def _until(beat: Beat, check, *, timeout_s: float, what: str):
    def ticking():
        beat.tick()
        return check()

    return wait_until(ticking, timeout_s=timeout_s, interval_s=0.1, what=what)


@pytest.mark.django_db(transaction=True)
def test_a_cluster_that_never_answers_stalls_no_other_and_its_jobs_go_on_once_replaced(
    tmp_path, catalog, tenant, member
):
    scenario, gpu_model = catalog
    QuotaGrantFactory(tenant=tenant, pair=catalog, gpus=400, gpu_hours=10_000, days=1)
    peer = SilentPeer()
    hung, healthy = _slurm_cluster(peer.port), _local_cluster()
    _partition(hung, gpu_model, gpus=400)
    _partition(healthy, gpu_model, gpus=8)
    connect_s = backend_of(hung).connect_timeout_s
    asks = {"tenant": tenant, "scenario": scenario, "gpu_model": gpu_model, "gpus": 1, "walltime_minutes": 1}
    to_hung = JobRequest(**asks, name="stalled", script="#!/bin/sh\ntrue\n", cluster=hung, partition="gpu")
    to_healthy = JobRequest(
        **asks, name="healthy", script="#!/bin/sh\nsleep 1\n", cluster=healthy, partition="gpu"
    )
    app.control.purge()
    # In the hung cluster's queue before it hung: its poll asks it about these.
    before = _submit(member, to_hung, QUEUED_BEFORE)
    for n, pk in enumerate(before):
        Job.objects.filter(pk=pk).update(
            state=JobState.PENDING,
            backend_id=f"local-9{n:05d}",
            submitted_at=timezone.now(),
            reason="submitted",
        )
    app.control.purge()
    stalled = _submit(member, to_hung, STALLED_JOBS)  # 300 dispatch messages first in the queue
    first = _submit(member, to_healthy, HEALTHY_JOBS)  # then the healthy cluster's
    assert set(_states(stalled + first)) == {JobState.QUEUED}
    assert Job.objects.filter(pk__in=stalled + first, holds_gpus=True).count() == STALLED_JOBS + HEALTHY_JOBS
    env = {"JOB_POLL_INTERVAL_S": str(PERIOD_S), "CLUSTER_BREAKER_COOLOFF_S": str(COOLOFF_S)}
    worker = start_worker(
        tmp_path / "worker.log", redis_url=settings.REDIS_URL, pool="prefork", concurrency=WORKERS, env=env
    )
    try:
        ready, ready_at = time.monotonic(), timezone.now()
        beat = Beat()
        # 1. Behind 300 messages of the hung cluster, the healthy cluster's jobs are dispatched
        # within one poll period, and the poll sees them end.
        _until(
            beat, lambda: set(_states(first)) <= set(DISPATCHED), timeout_s=3 * PERIOD_S, what="first round"
        )
        first_dispatch_s = _latency_s(first, JobState.PENDING, since=ready_at)
        # 2. The hung cluster's breaker opens; the healthy cluster goes on while it is open.
        _until(beat, lambda: breaker_state(cluster_id=hung.pk).open, timeout_s=6 * connect_s, what="open")
        opened_s = time.monotonic() - ready
        second = _submit(member, to_healthy, HEALTHY_JOBS)
        healthy_jobs = first + second
        _until(
            beat, lambda: _states(healthy_jobs).get(JobState.COMPLETED) == 2 * HEALTHY_JOBS,
            timeout_s=6 * PERIOD_S, what="healthy jobs completed",
        )  # fmt: skip
        second_dispatch_s = _latency_s(second, JobState.PENDING)
        ended = {job.pk: job.finished_at for job in Job.objects.filter(pk__in=healthy_jobs)}
        seen = JobEvent.objects.filter(job_id__in=healthy_jobs, to_state=JobState.COMPLETED)
        poll_lag_s = sorted((event.at - ended[event.job_id]).total_seconds() for event in seen)
        # 3. The hung cluster's jobs wait as they were, saying why; nothing is lost.
        waiting = Job.objects.filter(pk__in=stalled)
        _until(
            beat, lambda: waiting.filter(reason=REASON_UNAVAILABLE).count() == STALLED_JOBS,
            timeout_s=SWEEP_S + 10, what="every stalled job says cluster_unavailable",
        )  # fmt: skip
        held = _states(stalled)
        assert set(held) <= {JobState.QUEUED, JobState.SUBMITTING}, held
        assert not waiting.exclude(backend_id="").exists()
        assert _states(before) == {JobState.PENDING: QUEUED_BEFORE}
        connections, at_once, waits = len(peer.spans), peer.most_at_once(), peer.waits_s()
        # 4. Replaced by a cluster that answers: once the cool-off is over one probe closes the
        # breaker, and its 300 jobs are dispatched, each once.
        Cluster.objects.filter(pk=hung.pk).update(kind="local", local_gpus=8)
        replaced = time.monotonic()
        _until(
            beat,
            lambda: set(_states(stalled)) <= set(DISPATCHED),
            timeout_s=120,
            what="stalled jobs dispatched",
        )
        resumed_s = time.monotonic() - replaced
        assert not breaker_state(cluster_id=hung.pk).open
    finally:
        stop(worker)
        peer.close()
    rows = list(Job.objects.filter(pk__in=stalled).values_list("token", "backend_id"))
    assert len({backend_id for _, backend_id in rows}) == STALLED_JOBS  # one scheduler job each
    local = backend_of(Cluster.objects.get(pk=hung.pk))
    assert all(local.find(token) == backend_id for token, backend_id in rows)
    print(
        f"\n[stall] hung cluster, {STALLED_JOBS} jobs; {WORKERS} worker processes, "
        f"{settings.CLUSTER_WORKER_SLOTS} slots per cluster, breaker after {settings.CLUSTER_BREAKER_FAILURES}"
        f"\n[stall] healthy dispatch behind the hung cluster's messages: {max(first_dispatch_s):.2f}s after "
        f"the worker was ready; while the breaker was open: {max(second_dispatch_s):.2f}s after submission"
        f"\n[stall] healthy ends seen by the poll after {max(poll_lag_s):.2f}s at most (period {PERIOD_S}s)"
        f"\n[stall] breaker open {opened_s:.1f}s after the worker was ready; SSH connections to the hung "
        f"peer {connections}, at most {at_once} at once, each waited {max(waits):.2f}s at most "
        f"(connect timeout {connect_s:g}s)"
        f"\n[stall] replaced: all {STALLED_JOBS} dispatched {resumed_s:.1f}s later (cool-off {COOLOFF_S}s)"
    )
    assert max(first_dispatch_s) < PERIOD_S and max(second_dispatch_s) < PERIOD_S
    assert max(poll_lag_s) < PERIOD_S + 2
    assert at_once <= settings.CLUSTER_WORKER_SLOTS + 1  # the slots, and the probe of a cool-off
    assert connections <= 15, connections  # not one per job: one per failure before it opened, then probes
    assert max(waits) < connect_s + 1.5


# --- The pieces, one at a time


def test_the_breaker_opens_after_n_failures_and_its_cooloff_doubles_to_the_cap(db, settings):
    settings.CLUSTER_BREAKER_FAILURES = 3
    settings.CLUSTER_BREAKER_COOLOFF_S, settings.CLUSTER_BREAKER_COOLOFF_MAX_S = 1, 3
    cluster = _local_cluster()
    for _ in range(2):
        assert not breaker.breaker_failure(cluster_id=cluster.pk, detail="no banner").open
    cooloffs = []
    for _ in range(4):
        state = breaker.breaker_failure(cluster_id=cluster.pk, detail="no banner")
        assert state.cooling
        cooloffs.append(round(state.open_until - time.time()))
        # a failure of a call that began before it opened leaves the cool-off as it is
        assert breaker.breaker_failure(cluster_id=cluster.pk, detail="late").open_until == state.open_until
        wait_until(lambda: not breaker_state(cluster_id=cluster.pk).cooling, timeout_s=4, interval_s=0.05)
    assert cooloffs == [1, 2, 3, 3]
    assert breaker.breaker_success(cluster_id=cluster.pk) is True  # it was open
    assert breaker_state(cluster_id=cluster.pk) == breaker.BreakerState(0, 0.0, 0, "")


def test_a_probe_after_the_cooloff_closes_the_breaker_and_one_caller_probes(db, settings):
    settings.CLUSTER_BREAKER_FAILURES, settings.CLUSTER_BREAKER_COOLOFF_S = 1, 1
    cluster = _local_cluster()
    cluster_mark_health(cluster=cluster, healthy=False, detail="unreachable")  # one failure opens it
    assert breaker_state(cluster_id=cluster.pk).cooling
    assert not cluster_available(cluster=cluster)  # cooling: not asked
    wait_until(lambda: not breaker_state(cluster_id=cluster.pk).cooling, timeout_s=3, interval_s=0.05)
    assert breaker.breaker_probe_claim(cluster_id=cluster.pk, hold_s=10)
    assert not cluster_available(cluster=cluster)  # another caller probes
    breaker.breaker_probe_release(cluster_id=cluster.pk)
    assert cluster_available(cluster=cluster)  # this one probes: the local cluster's health() answers
    cluster.refresh_from_db()
    assert cluster.healthy and not breaker_state(cluster_id=cluster.pk).open


def test_a_cluster_never_holds_more_than_its_worker_slots(db, settings):
    settings.CLUSTER_WORKER_SLOTS = 2
    cluster, other = _local_cluster(), _local_cluster()
    slot = lambda pk: cluster_slot(cluster_id=pk, hold_s=30)  # noqa: E731
    with slot(cluster.pk) as one, slot(cluster.pk) as two, slot(cluster.pk) as three, slot(other.pk) as four:
        assert (one, two, three) == (True, True, False)
        assert four  # slots are per cluster
    with slot(cluster.pk) as again:
        assert again  # given back


def test_a_slot_left_by_a_worker_killed_on_this_machine_is_taken_back(db, settings):
    """A worker SIGKILLed mid-dispatch (the OOM killer) leaves its slot behind: another process on
    the same machine takes it back at once instead of waiting out the slot's hold; a slot whose
    holder lives stays taken."""
    settings.CLUSTER_WORKER_SLOTS = 1
    cluster = _local_cluster()
    key = breaker.cache_key(cluster.pk, "slot0")
    alive = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    try:
        # what each one's cluster_slot would have written: host, pid, nonce
        cache.set(key, f"{breaker.HOST}:{alive.pid}:x", timeout=600)
        with cluster_slot(cluster_id=cluster.pk, hold_s=600) as free:
            assert not free  # its holder runs: not taken back
        cache.set(key, f"{breaker.HOST}:{dead.pid}:x", timeout=600)
        with cluster_slot(cluster_id=cluster.pk, hold_s=600) as free:
            assert free and cache.get(key).startswith(f"{breaker.HOST}:{os.getpid()}:")
        cache.set(key, f"another-host:{dead.pid}:x", timeout=600)
        with cluster_slot(cluster_id=cluster.pk, hold_s=600) as free:
            assert not free  # another machine's process: its liveness is not ours to judge
    finally:
        alive.kill()
        alive.wait(timeout=10)
        cache.delete(key)


@pytest.mark.parametrize("banner", [b"", b"SSH-2.0-OpenSSH_9.2\r\n"], ids=["silent", "banner-only"])
def test_an_ssh_peer_that_hangs_costs_one_connect_timeout_at_most(db, banner):
    peer = SilentPeer(banner=banner)
    try:
        backend = SlurmBackend(cluster_config(_slurm_cluster(peer.port)), connect_timeout_s=1.5)
        started = time.monotonic()
        health = backend.health()
        took_s = time.monotonic() - started
    finally:
        peer.close()
    assert not health.healthy and health.detail.startswith("SSH to"), health.detail
    assert took_s < 1.5 + 0.5, took_s
    assert len(peer.spans) == 1  # one connection per attempt
