"""The batched paths behind dispatch and poll throughput (bench/dispatch.py, bench/poll.py), against
the real Slurm testbed and PostgreSQL: several sbatch calls in one SSH exec with an answer per job,
find by many tokens at once, a dispatcher that claims and submits many jobs and keeps each one's
guarantees (find before a resubmission, REJECTED on a refusal, the scheduler's copy of a job
cancelled meanwhile cancelled), a poll that writes only what changed, and the SSH wait that does
not spin. No mocks: jobs a test submits are cancelled and its accounts removed in a finally."""

import base64
import time
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.backends.base import BackendError, BackendUnavailable, JobRef
from clusters.backends.slurm import SlurmBackend, ssh
from clusters.models import Partition
from jobs.models import Job, JobEvent, JobState
from jobs.services import job_cancel, jobs_poll, spec_of
from jobs.services.dispatch import jobs_claim, jobs_dispatch, jobs_submit_claimed
from tenants.models import QuotaGrant, Tenant
from tests.factories import QuotaGrantFactory
from tests.jobs_support import submit_admitted
from tests.slurm_support import job_spec, remove_local, slurm_tenant, wait_for_end
from tests.testbed.env import registered_testbed, testbed_identity
from tests.testbed.env import testbed_config as make_config
from tests.wait_support import wait_until


@pytest.fixture
def held_bed(catalog):
    """A tenant with a Slurm account on the registered testbed, whose jobs Slurm keeps PENDING
    (AssocGrpGRES: none of them takes the testbed's GPUs); its jobs and account go afterwards.
    `nodes` widens the a100 partition for tests that admit more jobs than the testbed's GPUs."""
    beds = []

    def make(*, gpus: int | None = None, nodes: int | None = None):
        cluster = registered_testbed()
        if nodes:
            Partition.objects.filter(cluster=cluster, name="a100").update(nodes=nodes)
        bed = slurm_tenant(cluster, **({"gpus": gpus} if gpus else {}))
        beds.append(bed)
        where = ["where", f"name={bed.tenant.slug}", "set", "GrpTRES=gres/gpu=0"]
        bed.backend.check(["sacctmgr", "-i", "modify", "account", *where])
        return cluster, bed

    yield make
    for bed in beds:
        bed.cleanup()


def slurm_ids(bed) -> dict[str, list[str]]:
    """Slurm's job ids per token under the tenant's account (squeue -t all)."""
    found: dict[str, list[str]] = {}
    for line in bed.backend.check(
        ["squeue", "-h", "-t", "all", "-A", bed.tenant.slug, "-o", "%i|%k"]
    ).split():
        job_id, _, token = line.partition("|")
        found.setdefault(token, []).append(job_id)
    return found


# --- The backend: one exec for many sbatch calls


def ref(spec, backend_id: str = "") -> JobRef:
    return JobRef(backend_id, spec.token, spec.account, spec.user)


def test_submit_many_answers_each_job_from_one_exec_and_delivers_scripts_intact():
    backend, cleaner = SlurmBackend(make_config()), SlurmBackend(make_config())
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    tricky = f"$(touch {marker}) `touch {marker}` '; touch {marker}; echo '"
    good = [
        job_spec('printf "%s" "$PAYLOAD" | base64 -w0; echo', env={"PAYLOAD": tricky}, name=f"x;{tricky}"),
        job_spec("echo second\necho 'quoted \\n stays'", partition="a100", gpu_type="a100"),
    ]
    refused_here = job_spec("true", name="two\nlines")  # checked before anything runs
    refused_by_slurm = job_spec("true", qos=f"nosuch{uuid.uuid4().hex[:6]}")
    before = ssh.commands_run(backend.config.slug)
    results = backend.submit_many([good[0], refused_here, refused_by_slurm, good[1]])
    try:
        assert ssh.commands_run(backend.config.slug) - before == 1, backend.commands
        assert backend.commands[-1][:2] == ["sh", "-c"]  # the fixed script; every value came on stdin
        first, local, remote, second = results
        assert isinstance(first, str) and first.isdigit() and isinstance(second, str) and second.isdigit()
        assert isinstance(local, BackendError) and "job name" in str(local)
        assert type(remote) is BackendError and "Invalid qos specification" in str(remote), remote
        assert backend.find_many([ref(spec) for spec in good]) == {
            good[0].token: first,
            good[1].token: second,
        }

        for job_id in (first, second):
            assert wait_for_end(backend, job_id).state == "COMPLETED"
        tail = backend.log_tail(ref(good[0], first), lines=5, max_bytes=4096)
        assert base64.b64decode(tail.lines[-1]).decode() == tricky
        tail = backend.log_tail(ref(good[1], second), lines=5, max_bytes=4096)
        assert tail.lines == ["second", "quoted \\n stays"]
        assert (
            backend.check(["squeue", "-h", "-t", "all", "-j", first, "-o", "%j"]).rstrip("\n") == good[0].name
        )
        assert backend.run(["test", "-e", marker]).rc == 1
    finally:
        for result, spec in zip(results, [good[0], refused_here, refused_by_slurm, good[1]], strict=True):
            if isinstance(result, str):
                cleaner.cancel(result, user=spec.user)
                remove_local(f"{cleaner.job_dir(spec.account, spec.user)}/{spec.token}.out")


def test_find_many_asks_squeue_once_and_sacct_only_for_what_squeue_lacks():
    backend = SlurmBackend(make_config())
    spec = job_spec("true")
    job_id = backend.submit(spec)
    try:
        before = len(backend.commands)
        assert backend.find_many([ref(spec)]) == {spec.token: job_id}
        assert [argv[0] for argv in backend.commands[before:]] == ["squeue"]
        unknown = replace(spec, token=uuid.uuid4().hex)
        before = len(backend.commands)
        assert backend.find_many([ref(spec), ref(unknown)]) == {spec.token: job_id}
        assert [argv[0] for argv in backend.commands[before:]] == ["squeue", "sacct"]
        assert backend.find(unknown.token, account=spec.account, user=spec.user) is None
        with pytest.raises(BackendError):
            backend.find_many([ref(replace(spec, token="../x"))])
    finally:
        backend.cancel(job_id, user=spec.user)


def test_a_command_cut_off_returns_what_it_printed_when_asked_and_raises_otherwise():
    backend = SlurmBackend(make_config())
    argv = ["sh", "-c", "echo first; sleep 5; echo never"]
    started = time.monotonic()
    cut = backend.run(argv, timeout_s=1, partial=True)
    assert time.monotonic() - started < 3
    assert (cut.rc, cut.stdout) == (None, "first\n") and "did not finish within 1s" in cut.stderr
    with pytest.raises(BackendUnavailable, match="did not finish within 1s"):
        backend.run(argv, timeout_s=1)
    assert backend.run(["true"]).rc == 0  # the pooled connection survives both


def test_waiting_for_the_exit_status_after_eof_does_not_spin():
    """A command that closes its output and goes on: the channel's fd stays readable from EOF on,
    and a loop that waited on it burnt a CPU until the command ended."""
    backend = SlurmBackend(make_config())
    backend.run(["true"])  # connected
    cpu, wall = time.process_time(), time.monotonic()
    result = backend.run(["sh", "-c", "exec >&- 2>&-; sleep 1"])
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert result.rc == 0 and wall >= 1
    assert cpu < 0.25, f"{cpu:.2f} s of CPU while waiting {wall:.2f} s"


# --- The dispatcher: many jobs per claim and per exec, each with its guarantees


@pytest.mark.django_db(transaction=True)
def test_one_message_claims_and_submits_the_waiting_jobs_of_its_cluster_in_one_exec(held_bed):
    cluster, bed = held_bed()
    job_ids = bed.submit(6)
    before = ssh.commands_run(cluster.slug)
    assert jobs_dispatch(job_id=job_ids[2]) == 6
    assert ssh.commands_run(cluster.slug) - before == 1  # one sh -c for six sbatch calls
    jobs = list(Job.objects.filter(pk__in=job_ids))
    assert {job.state for job in jobs} == {JobState.PENDING}
    found = slurm_ids(bed)
    assert all(found[job.token] == [job.backend_id] for job in jobs)
    moves = list(JobEvent.objects.filter(job_id=job_ids[0]).values_list("to_state", flat=True))
    assert moves == [JobState.QUEUED, JobState.SUBMITTING, JobState.PENDING]
    # the other jobs' own messages now cost one query each and take nothing
    with CaptureQueriesContext(connection) as queries:
        assert jobs_dispatch(job_id=job_ids[0]) == 0
    assert len(queries) == 1


@pytest.mark.django_db(transaction=True)
def test_a_batch_adopts_a_job_submitted_before_a_crash_rejects_a_refused_one_and_submits_the_rest(held_bed):
    cluster, bed = held_bed(gpus=20, nodes=100)
    # A second tenant without a Slurm account: sbatch refuses its job for good.
    stranger = Tenant.objects.create(slug=f"fault-{uuid.uuid4().hex[:8]}", name="No account")
    testbed_identity(f"pt-{stranger.slug}")  # a job identity, but no association in any account
    grant = QuotaGrant.objects.get(tenant=bed.tenant)
    QuotaGrantFactory(
        tenant=stranger, scenario=grant.scenario, gpu_model=grant.gpu_model, gpus=4, gpu_hours=10,
        starts_on=grant.starts_on, ends_on=grant.ends_on,
    )  # fmt: skip
    try:
        crashed, fresh = bed.submit(2)
        refused = submit_admitted(bed.user, replace(bed.request, tenant=stranger)).pk
        # The crash: claimed and submitted, and the dispatcher died before it saved the id.
        [job] = jobs_claim(crashed, cluster_id=cluster.pk, limit=1)
        [submitted] = bed.backend.submit_many([spec_of(job)])
        Job.objects.filter(pk=crashed).update(dispatch_lease_until=timezone.now() - timedelta(seconds=1))

        assert jobs_dispatch(job_id=fresh) == 3  # its message takes the other two along
        states = dict(Job.objects.filter(pk__in=[crashed, fresh, refused]).values_list("pk", "state"))
        assert states == {crashed: JobState.PENDING, fresh: JobState.PENDING, refused: JobState.REJECTED}
        adopted = Job.objects.get(pk=crashed)
        assert (adopted.backend_id, adopted.dispatch_attempts) == (submitted, 2)
        assert "Invalid account" in Job.objects.get(pk=refused).reason
        found = slurm_ids(bed)
        assert found[adopted.token] == [submitted]  # adopted by token, not submitted twice
        assert found[Job.objects.get(pk=fresh).token] == [Job.objects.get(pk=fresh).backend_id]
    finally:
        remove_local(bed.backend.job_dir(stranger.slug, f"pt-{stranger.slug}"))


@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_while_its_batch_is_submitted_is_cancelled_in_slurm_too(held_bed):
    cluster, bed = held_bed()
    first, second, third = bed.submit(3)
    jobs = jobs_claim(first, cluster_id=cluster.pk, limit=3)
    assert [job.pk for job in jobs] == [first, second, third]
    job_cancel(actor=None, job=Job.objects.get(pk=second), reason="cancelled during sbatch")
    assert Job.objects.get(pk=second).state == JobState.CANCELLING
    jobs_submit_claimed(bed.backend, jobs)
    cancelled = Job.objects.get(pk=second)
    assert cancelled.state == JobState.CANCELLING and cancelled.backend_id
    assert {Job.objects.get(pk=pk).state for pk in (first, third)} == {JobState.PENDING}
    live = bed.backend.check(["squeue", "-h", "-t", "all", "-j", cancelled.backend_id, "-o", "%T"])
    assert live.split() == ["CANCELLED"]
    jobs_poll(cluster_id=cluster.pk)  # the poll confirms it
    assert Job.objects.get(pk=second).state == JobState.CANCELLED


# --- The poll: two scheduler calls, and only what changed is written


@pytest.mark.django_db(transaction=True)
def test_a_poll_makes_two_scheduler_calls_and_writes_only_the_jobs_that_changed(held_bed):
    cluster, bed = held_bed(gpus=40, nodes=100)
    job_ids = bed.submit(30)
    jobs_dispatch(job_id=job_ids[0])
    assert Job.objects.filter(pk__in=job_ids, state=JobState.PENDING).count() == 30
    # Slurm evaluates a new job's pending reason in its next scheduling pass
    wait_until(
        lambda: all(s.reason for s in bed.backend.poll(_backend_ids(job_ids)).values()),
        timeout_s=60, what="pending reasons",
    )  # fmt: skip
    first = _polled(cluster)
    assert (first.calls, first.moved, first.job_updates, first.events) == (2, 0, 1, 0), first
    assert Job.objects.filter(pk__in=job_ids, reason__startswith="AssocGrp").count() == 30
    steady = _polled(cluster)  # nothing changed: read the jobs, write nothing
    assert (steady.calls, steady.moved, steady.job_updates, steady.events) == (2, 0, 0, 0), steady
    assert steady.queries <= 2, steady

    ids = _backend_ids(job_ids)
    bed.backend.check(["scontrol", "hold", ",".join(ids[:3])])
    bed.backend.check(["scancel", ids[3]])
    changed = _polled(cluster)
    assert changed.calls == 2 and changed.moved == 1, changed  # the cancelled job ended
    assert Job.objects.filter(pk__in=job_ids, reason__startswith="JobHeld").count() == 3
    ended = Job.objects.get(backend_id=ids[3], cluster=cluster)
    assert ended.state == JobState.CANCELLED and not ended.holds_gpus
    assert _polled(cluster).job_updates == 0


# --- helpers


def _backend_ids(job_ids: list[int]) -> list[str]:
    return list(Job.objects.filter(pk__in=job_ids).order_by("pk").values_list("backend_id", flat=True))


@dataclass
class _Poll:
    calls: int  # remote commands: scheduler calls
    moved: int  # jobs whose state moved
    queries: int
    job_updates: int  # UPDATE statements on jobs_job
    events: int  # INSERT statements into jobs_jobevent


def _polled(cluster) -> _Poll:
    before = ssh.commands_run(cluster.slug)
    with CaptureQueriesContext(connection) as captured:
        moved = jobs_poll(cluster_id=cluster.pk)
    sql = [query["sql"] for query in captured]
    return _Poll(
        calls=ssh.commands_run(cluster.slug) - before,
        moved=moved,
        queries=len(sql),
        job_updates=sum(text.startswith('UPDATE "jobs_job"') for text in sql),
        events=sum(text.startswith('INSERT INTO "jobs_jobevent"') for text in sql),
    )


def test_a_batch_answers_a_missing_identity_or_tree_per_job_and_submits_the_jobs_after_them():
    """Refusals half-way through a batch do not shift the following jobs' lines: a job whose
    identity does not exist (67), one whose identity has no tree of its own (69: `nobody`
    exists, but the site made it no tree), then a good job of the same batch, submitted."""
    backend = SlurmBackend(make_config())
    good = job_spec("echo after the refusals")
    batch = [job_spec("true", user=f"no-such-{uuid.uuid4().hex[:6]}"), job_spec("true", user="nobody"), good]
    before = ssh.commands_run(backend.config.slug)
    missing, treeless, submitted = backend.submit_many(batch)
    try:
        assert ssh.commands_run(backend.config.slug) - before == 1
        assert type(missing) is BackendError and "does not exist on the login node" in str(missing)
        assert type(treeless) is BackendError and "missing or not owned by nobody" in str(treeless)
        assert isinstance(submitted, str) and submitted.isdigit()
        assert wait_for_end(backend, submitted).state == "COMPLETED"
        assert backend.log_tail(ref(good, submitted), lines=5, max_bytes=4096).lines == ["after the refusals"]
    finally:
        if isinstance(submitted, str):
            backend.cancel(submitted, user=good.user)
            remove_local(f"{backend.job_dir(good.account, good.user)}/{good.token}.out")
