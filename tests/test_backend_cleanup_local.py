"""The local backend's cleanup: list_jobs, purge_scratch and delete_finished, with real processes
and a real scratch tree under tmp_path. build_scratch_tree() is the tree the Slurm test purges
too (tests/test_backend_cleanup_slurm.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
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

DAY_S = 86_400
PURGE_DAYS = 30
OLD_S = 40 * DAY_S


@dataclass(frozen=True)
class ScratchTree:
    root: Path  # the tenant's scratch directory
    outside: Path  # a directory beside it that the purge must never touch
    deleted: set[str]  # paths relative to root that a purge removes
    kept: set[str]  # paths relative to root that stay
    refused: set[str]  # symlinks leading out: reported, kept
    bytes_freed: int


def build_scratch_tree(root: Path, outside: Path) -> ScratchTree:
    """Old and recent files, names a shell would mangle, symlinks out of root (kept) and in it
    (an old link goes, its target stays), and a hard link to a file outside."""
    now = time.time()
    old: dict[str, int] = {
        "old.bin": 1000,
        "sub/deep/old-deep.dat": 500,
        " spaced name": 11,
        "quote'\"s `$(touch pwned)`": 7,
        "-leading-dash": 13,
        "new\nline": 17,
    }
    recent = {"new.txt": 10, "-recent dash": 3, "sub/fresh\nname": 5}
    for rel, size in {**old, **recent}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret").write_text("keep me")
    (outside / "hardfile").write_text("shared inode")
    os.link(outside / "hardfile", root / "hard-outside")  # same inode: deleting this name frees nothing
    os.symlink(outside / "secret", root / "escape")
    os.symlink(os.path.relpath(outside / "secret", root), root / "rel-escape")
    os.symlink(outside, root / "sub" / "escape-dir")
    os.symlink("new.txt", root / "inner-link")  # inside: an old link is removed, never new.txt
    for rel in [*old, "hard-outside"]:
        os.utime(root / rel, (now - OLD_S, now - OLD_S))
    for rel in ("escape", "rel-escape", "sub/escape-dir", "inner-link"):
        os.utime(root / rel, (now - OLD_S, now - OLD_S), follow_symlinks=False)
    os.utime(outside / "secret", (now - OLD_S, now - OLD_S))
    return ScratchTree(
        root=root,
        outside=outside,
        deleted={*old, "hard-outside", "inner-link"},
        kept={*recent},
        refused={"escape", "rel-escape", "sub/escape-dir"},
        bytes_freed=sum(old.values()),
    )


def assert_purged(tree: ScratchTree, report: PurgeReport) -> None:
    assert sorted(report.deleted) == sorted(tree.deleted)
    assert set(report.refused) == tree.refused
    assert all("outside" in reason for reason in report.refused.values())
    assert report.bytes_freed == tree.bytes_freed
    for rel in tree.deleted:
        assert not os.path.lexists(tree.root / rel), rel
    for rel in tree.kept | tree.refused:
        assert os.path.lexists(tree.root / rel), rel
    assert (tree.outside / "secret").read_text() == "keep me"
    assert (tree.outside / "hardfile").read_text() == "shared inode"
    assert os.path.isdir(tree.root / "sub" / "deep")  # directories stay


def assert_untouched(tree: ScratchTree, report: PurgeReport) -> None:
    """A dry run: the same report, nothing gone."""
    assert report.dry_run
    assert sorted(report.deleted) == sorted(tree.deleted)
    assert set(report.refused) == tree.refused
    assert report.bytes_freed == tree.bytes_freed
    for rel in tree.deleted | tree.kept | tree.refused:
        assert os.path.lexists(tree.root / rel), rel


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
