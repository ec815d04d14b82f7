"""The local backend's cleanup: list_jobs, purge_scratch and delete_finished, with real processes
and a real scratch tree under tmp_path (tests/scratch_support.py, which the Slurm test purges too)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clusters.backends.base import (
    END_STATES,
    BackendError,
    ClusterConfig,
    JobRef,
    JobSpec,
    JobState,
    PurgeReport,
    SchedulerJob,
)
from clusters.backends.local import LocalBackend
from tests.scratch_support import OLD_S, PURGE_DAYS, assert_purged, assert_untouched, build_scratch_tree


# ------------------------------------------------------------------ helpers --
def make_backend(state_dir: Path, *, gpus: int = 2, scratch_root: str = "") -> LocalBackend:
    config = ClusterConfig(
        slug="local", kind="local", local_gpus=gpus, state_dir=str(state_dir), scratch_root=scratch_root
    )
    return LocalBackend(config, grace_s=1)


def job_spec(token: str, script: str, account: str = "team-a") -> JobSpec:
    return JobSpec(
        token=token,
        name=f"job {token}",
        account=account,
        qos="portal-normal",
        priority="normal",
        partition="local",
        gpu_type="local",
        k8s_resource="",
        k8s_product="",
        gpus_per_node=1,
        nodes=1,
        walltime_minutes=60,
        script=script,
        env={},
    )


def wait_for_state(backend: LocalBackend, backend_id: str, states: set[str], timeout_s: float = 20):
    deadline = time.monotonic() + timeout_s
    while True:
        status = backend.poll([backend_id]).get(backend_id)
        if status is not None and status.state in states:
            return status
        assert time.monotonic() < deadline, f"{backend_id} is {status}, not in {states}"
        time.sleep(0.05)


@pytest.fixture
def backend(tmp_path):
    backend = make_backend(tmp_path / "state")
    yield backend
    for job in backend.list_jobs(["team-a", "team-b"]):
        backend.cancel(job.backend_id)


# ---------------------------------------------------------------- list_jobs --
def test_list_jobs_gives_running_and_waiting_jobs_of_the_accounts(backend, tmp_path):
    done = backend.submit(job_spec("done", "true\n"))
    wait_for_state(backend, done, END_STATES)
    running = backend.submit(
        job_spec("running", 'touch "$PORTAL_SCRATCH/mark"; echo "$PORTAL_SCRATCH"; sleep 60\n')
    )
    other = backend.submit(job_spec("other", "sleep 60\n", account="team-b"))
    waiting = backend.submit(job_spec("waiting", "sleep 60\n"))  # both GPUs are taken
    wait_for_state(backend, running, {JobState.RUNNING})

    assert sorted(backend.list_jobs(["team-a"]), key=lambda job: job.backend_id) == [
        SchedulerJob(running, "running", "team-a", JobState.RUNNING),
        SchedulerJob(waiting, "waiting", "team-a", JobState.PENDING),
    ]
    assert {job.backend_id for job in backend.list_jobs(["team-a", "team-b"])} == {running, other, waiting}
    assert backend.list_jobs([]) == []

    # the tenant's jobs share their scratch directory, created when a job starts
    scratch = tmp_path / "state" / "scratch" / "team-a"
    ref = JobRef(running, "running", "team-a")
    deadline = time.monotonic() + 10
    while not backend.log_tail(ref, lines=1, max_bytes=1000).lines and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.log_tail(ref, lines=1, max_bytes=1000).lines == ["/scratch"]  # as the sandbox shows it
    assert (scratch / "mark").is_file()


# ------------------------------------------------------------- purge_scratch --
def test_purge_scratch_dry_run_then_purge(backend, tmp_path):
    tree = build_scratch_tree(tmp_path / "state" / "scratch" / "team-a", tmp_path / "outside")

    dry = backend.purge_scratch("team-a", older_than_days=PURGE_DAYS, dry_run=True)
    assert_untouched(tree, dry)

    report = backend.purge_scratch("team-a", older_than_days=PURGE_DAYS, dry_run=False)
    assert not report.dry_run
    assert_purged(tree, report)

    again = backend.purge_scratch("team-a", older_than_days=PURGE_DAYS, dry_run=False)
    assert again.deleted == [] and again.bytes_freed == 0 and set(again.refused) == tree.refused


def test_purge_scratch_under_a_configured_root_touches_no_other_tenant(tmp_path):
    backend = make_backend(tmp_path / "state", scratch_root=str(tmp_path / "scratch"))
    tree = build_scratch_tree(tmp_path / "scratch" / "team-a", tmp_path / "outside")
    other = build_scratch_tree(tmp_path / "scratch" / "team-b", tmp_path / "outside-b")
    assert_purged(tree, backend.purge_scratch("team-a", older_than_days=PURGE_DAYS, dry_run=False))
    for rel in other.deleted | other.kept:
        assert os.path.lexists(other.root / rel), rel


def test_purge_scratch_keeps_files_younger_than_the_age(backend, tmp_path):
    tree = build_scratch_tree(tmp_path / "state" / "scratch" / "team-a", tmp_path / "outside")
    report = backend.purge_scratch("team-a", older_than_days=50, dry_run=False)  # the old ones are 40 days
    assert report.deleted == [] and report.bytes_freed == 0
    assert all(os.path.lexists(tree.root / rel) for rel in tree.deleted | tree.kept)


def test_purge_scratch_refuses_a_tenant_directory_that_is_a_symlink(backend, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious").write_text("x")
    os.utime(outside / "precious", (time.time() - OLD_S,) * 2)
    (tmp_path / "state" / "scratch").mkdir(parents=True)
    os.symlink(outside, tmp_path / "state" / "scratch" / "team-a")

    report = backend.purge_scratch("team-a", older_than_days=PURGE_DAYS, dry_run=False)
    assert report.deleted == [] and list(report.refused) == ["."]
    assert (outside / "precious").exists()


def test_purge_scratch_of_a_tenant_without_scratch_and_bad_input(backend):
    assert backend.purge_scratch("team-a", older_than_days=PURGE_DAYS, dry_run=False) == PurgeReport(
        deleted=[], refused={}, bytes_freed=0, dry_run=False
    )
    for account in ("../team-a", "team/a", "", ".."):
        with pytest.raises(BackendError, match="invalid account"):
            backend.purge_scratch(account, older_than_days=PURGE_DAYS, dry_run=False)
    with pytest.raises(BackendError, match="invalid purge age"):
        backend.purge_scratch("team-a", older_than_days=0, dry_run=False)


# ----------------------------------------------------------- delete_finished --
def test_delete_finished_prunes_the_files_of_jobs_ended_long_enough_ago(backend, tmp_path):
    state = tmp_path / "state"
    old = backend.submit(job_spec("old", "echo bye\n"))
    other = backend.submit(job_spec("other", "true\n", account="team-b"))
    wait_for_state(backend, old, {JobState.COMPLETED})
    wait_for_state(backend, other, {JobState.COMPLETED})
    time.sleep(2.5)
    recent = backend.submit(job_spec("recent", "true\n"))
    running = backend.submit(job_spec("running", "sleep 60\n"))
    wait_for_state(backend, recent, {JobState.COMPLETED})
    wait_for_state(backend, running, {JobState.RUNNING})

    assert backend.delete_finished(["team-a"], older_than_s=2, dry_run=True) == [old]
    assert (state / "jobs" / "old").is_dir() and backend.find("old") == old

    assert backend.delete_finished(["team-a"], older_than_s=2, dry_run=False) == [old]
    assert not (state / "jobs" / "old").exists() and not (state / "ids" / old).exists()
    assert backend.find("old") is None and backend.poll([old]) == {}
    assert not [path for path in (state / "jobs").iterdir() if path.name.startswith(".")]
    for token, backend_id in (("recent", recent), ("running", running), ("other", other)):
        assert backend.find(token) == backend_id
    assert backend.poll([recent])[recent].state == JobState.COMPLETED

    assert backend.delete_finished(["team-a"], older_than_s=2, dry_run=False) == []
    assert backend.delete_finished(["team-b"], older_than_s=0, dry_run=False) == [other]
    with pytest.raises(BackendError, match="invalid age"):
        backend.delete_finished(["team-a"], older_than_s=-5, dry_run=False)
