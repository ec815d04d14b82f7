"""Lost work through the services (jobs/services/attempts.py) on real PostgreSQL: the review of an
ended attempt reads its log for the last checkpoint and gives back what ran past it, once; and a
reclaimed job on the real local cluster is warned, saves, comes back and is reviewed. After every
step each grant's ledger is checked against its jobs and loans (lending_support.ledger_errors); the
fixtures (restarted, broker_queue, pool) are in tests/jobs/conftest.py."""

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from clusters.backends.base import JobState
from clusters.services import backend_of
from jobs.models import Job, JobAttempt
from jobs.services import attempt_review, job_stop, job_warn, jobs_admit, jobs_dispatch, jobs_poll
from jobs.services.attempts import last_checkpoint
from tenants.models import QuotaGrant
from tests.jobs_support import submit_admitted
from tests.lending_support import (
    H,
    end,
    job_request,
    ledger_errors,
    refreshed,
    run,
    sent_tasks,
    whole_seconds_ago,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lending_backoff")]


# --- Lost work: the attempt's log read for checkpoints


def log_of(settings, token: str):
    """Where the local cluster "local" keeps a job's output (clusters/backends/local)."""
    path = settings.VAR_DIR / "local-cluster" / "local" / "jobs" / token / f"{token}.out"
    path.parent.mkdir(parents=True)
    return path


def test_last_checkpoint_is_the_newest_marker_within_the_attempt():
    start = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    stamp = int(start.timestamp())
    lines = [
        f"PORTAL_CHECKPOINT {stamp - 60}",  # before the attempt: an earlier attempt's
        f"  PORTAL_CHECKPOINT {stamp + 600} step=12",
        f"PORTAL_CHECKPOINT {stamp + 1200}",
        f"PORTAL_CHECKPOINT {stamp + 900}",  # older than the one above, printed later
        f"echo PORTAL_CHECKPOINT {stamp + 1500}",  # not at the start of its line
        f"PORTAL_CHECKPOINT {stamp + 1600}x",
        "PORTAL_CHECKPOINT soon",
        f"PORTAL_CHECKPOINT {stamp + 7200}",  # after the attempt's end
    ]
    assert last_checkpoint(lines, started_at=start, ended_at=start + H) == start + timedelta(seconds=1200)
    assert last_checkpoint(lines[:2], started_at=start, ended_at=start + H) == start + timedelta(seconds=600)
    assert last_checkpoint(lines[4:], started_at=start, ended_at=start + H) is None


def test_attempt_review_gives_back_what_ran_past_the_last_checkpoint_once(settings, restarted):
    job, attempt = restarted
    start = int(attempt.started_at.timestamp())
    log_of(settings, attempt.token).write_text(
        "\n".join(
            [
                "epoch 1",
                f"PORTAL_CHECKPOINT {start - 100}",
                f"PORTAL_CHECKPOINT {start + 600}",
                f"PORTAL_CHECKPOINT {start + 2400} step=7",
                f"PORTAL_CHECKPOINT {start + 3613 + 60}",  # after the end: not this attempt's
                "node failure",
            ]
        )
        + "\n"
    )
    reviewed = attempt_review(attempt_id=attempt.pk)
    assert reviewed.reviewed and reviewed.checkpoint_at == attempt.started_at + timedelta(seconds=2400)
    assert reviewed.minutes_kept == 40
    lost = Decimal("0.6739")  # 2 GPUs × the 1213 s after the checkpoint
    assert reviewed.gpu_hours_lost == lost
    (job,) = refreshed(job)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    # not charged: off the grant's used hours, back into the job's reservation for the next attempt
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (
        Decimal("2.0072") - lost,
        Decimal("1.9928") + lost,
    )
    assert (job.gpu_hours, job.reserved_gpu_hours, job.gpu_hours_lost) == (
        Decimal("1.3333"), Decimal("2.6667"), lost,
    )  # fmt: skip
    assert ledger_errors() == []

    again = attempt_review(attempt_id=attempt.pk)
    assert (again.checkpoint_at, again.gpu_hours_lost) == (reviewed.checkpoint_at, lost)
    (job,) = refreshed(job)
    (grant,) = refreshed(grant)
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (Decimal("1.3333"), Decimal("2.6667"))
    assert (job.gpu_hours, job.reserved_gpu_hours, job.gpu_hours_lost) == (
        Decimal("1.3333"), Decimal("2.6667"), lost,
    )  # fmt: skip


@pytest.mark.parametrize("backend_id", ["", "local-7"], ids=["never-submitted", "no-log"])
def test_attempt_review_without_a_checkpoint_loses_the_whole_attempt(settings, restarted, backend_id):
    job, attempt = restarted
    JobAttempt.objects.filter(pk=attempt.pk).update(backend_id=backend_id)
    reviewed = attempt_review(attempt_id=attempt.pk)
    assert (reviewed.reviewed, reviewed.checkpoint_at, reviewed.gpu_hours_lost) == (
        True,
        None,
        Decimal("2.0072"),
    )
    (job,) = refreshed(job)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (0, Decimal("4.0000"))
    assert (job.gpu_hours, job.reserved_gpu_hours) == (0, Decimal("4.0000"))
    assert ledger_errors() == []


def test_the_review_of_a_jobs_last_attempt_takes_lost_hours_off_used_only(settings, restarted, partition):
    """Once the job has ended, nothing more runs the lost work again: the reservation stays 0."""
    job, _ = restarted
    Job.objects.filter(pk=job.pk).update(restart_after=None, max_restarts=1)  # its last attempt
    jobs_admit(partition_id=partition.pk)
    job = run(Job.objects.get(pk=job.pk), started_at=whole_seconds_ago(H), backend_id="local-9")
    job = end(job, JobState.NODE_FAIL, ran_s=1801)  # 1.0006
    assert job.state == JobState.NODE_FAIL
    last = JobAttempt.objects.get(job=job, number=2)
    log_of(settings, last.token).write_text(f"PORTAL_CHECKPOINT {int(last.started_at.timestamp()) + 1501}\n")
    assert attempt_review(attempt_id=last.pk).gpu_hours_lost == Decimal("0.1667")  # 2 GPUs × 300 s
    (job,) = refreshed(job)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (Decimal("2.0072") + Decimal("0.8339"), 0)
    # the ended job's reservation (released on the grant at its end) is not raised again
    assert (job.reserved_gpu_hours, job.gpu_hours_lost) == (Decimal("1.9928"), Decimal("0.1667"))
    assert ledger_errors() == []


@pytest.mark.parametrize(
    "state, exit_code", [(JobState.COMPLETED, 0), (JobState.FAILED, 1), (JobState.FAILED, 42)]
)
def test_a_completed_or_failed_attempt_loses_nothing(settings, restarted, partition, state, exit_code):
    """A job's own failure is charged in full, even with an exit code it restarts on: else an
    attempt that ends with a chosen code would run free."""
    job, _ = restarted
    Job.objects.filter(pk=job.pk).update(restart_after=None, restart_exit_codes="42")
    jobs_admit(partition_id=partition.pk)
    job = run(Job.objects.get(pk=job.pk), started_at=whole_seconds_ago(H), backend_id="local-9")
    job = end(job, state, ran_s=1801, exit_code=exit_code)
    last = JobAttempt.objects.get(job=job, number=2)
    log_of(settings, last.token).write_text(f"PORTAL_CHECKPOINT {int(last.started_at.timestamp()) + 60}\n")
    reviewed = attempt_review(attempt_id=last.pk)
    assert (reviewed.reviewed, reviewed.checkpoint_at, reviewed.gpu_hours_lost) == (True, None, 0)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    used = Decimal("3.0078")  # both attempts in full
    # exit code 42 restarts it: the rest of its reservation stays for its third attempt
    reserved = Decimal("0.9922") if exit_code == 42 else 0
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (used, reserved)
    assert ledger_errors() == []


# --- A reclaimed job on the local cluster: warned, saved, reviewed


TRAPPING = """#!/bin/bash
trap 'echo "PORTAL_CHECKPOINT $(date +%s)"; exit 0' "$PORTAL_PREEMPT_SIGNAL"
echo "attempt=$PORTAL_ATTEMPT"
sleep 120 &
wait
"""


def wait_for(predicate, *, cluster_id: int, timeout_s: float = 20):
    """Poll the cluster as beat would until predicate() holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the local cluster never got there"
        jobs_poll(cluster_id=cluster_id)
        time.sleep(0.1)


def test_a_reclaimed_job_on_the_local_cluster_is_warned_saves_and_comes_back(
    broker_queue, member, climber, tenant, climate, catalog, partition, pool
):
    """Real processes: a borrowed job running on the local cluster, reclaimed; job_warn sends its
    scheduler the warning (SIGTERM: its trap prints a checkpoint and exits) and the stop for when
    its grace is out; the poll sees it end PREEMPTED, it is queued again, and the review of its
    attempt reads the checkpoint from its real log."""
    pool(lender_gpus=1, lending_limit=1, grace_s=30)
    request = job_request(
        tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=1, script=TRAPPING
    )
    job = submit_admitted(member, request)
    assert job.gpus_borrowed == 1
    try:
        assert jobs_dispatch(job_id=job.pk) == 1
        wait_for(
            lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, cluster_id=partition.cluster_id
        )
        time.sleep(1.2)  # a checkpoint's whole second falls within the attempt
        reclaimer = submit_admitted(climber, job_request(climate, partition, catalog, name="reclaim"))
        assert reclaimer.holds_gpus
        job_warn(job_id=job.pk)
        [(task, kwargs)] = sent_tasks()
        assert (task, kwargs) == ("jobs.tasks.stop_job", {"job_id": job.pk, "attempt": 1})
        wait_for(lambda: Job.objects.get(pk=job.pk).attempt == 2, cluster_id=partition.cluster_id)
    finally:  # no process of ours outlives the test
        backend = backend_of(partition.cluster)
        for backend_id in {
            *JobAttempt.objects.values_list("backend_id", flat=True),
            Job.objects.get(pk=job.pk).backend_id,
        }:
            if backend_id:
                backend.cancel(backend_id)
    (job,) = refreshed(job)
    assert (job.state, job.stop_at, job.holds_gpus) == (JobState.QUEUED, None, False)
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.end_state, attempt.exit_code) == (JobState.PREEMPTED, 0)
    reviewed = attempt_review(attempt_id=attempt.pk)
    assert reviewed.checkpoint_at is not None
    assert attempt.started_at <= reviewed.checkpoint_at <= attempt.ended_at
    assert 0 <= reviewed.gpu_hours_lost < Decimal("0.01")  # it saved as it was warned
    assert ledger_errors() == []
    job_stop(job_id=job.pk)  # the stop sent for the end of its grace, once it has come back: nothing
