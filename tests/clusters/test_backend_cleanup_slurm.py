"""SlurmBackend's cleanup against the real testbed (tests/testbed/testbed.sh): list_jobs through
squeue, purge_scratch through one find over SSH, run as the tenant's job identity through the
portal user's sudoers rule. The testbed's login node is this machine, so the scratch tree
(<scratch_root>/<identity>/<account>) is built here with Python, owned by the identity, under a
scratch_root made for each test; the jobs made here are cancelled in a finally."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters.backends import backend_for, base
from clusters.backends.base import BackendError, JobSpec, PurgeReport
from clusters.backends.slurm import SlurmBackend
from tests.scratch_support import (
    PURGE_DAYS,
    assert_purged,
    assert_untouched,
    build_scratch_tree,
)
from tests.testbed.env import testbed_config, testbed_env


def make_backend(**overrides) -> SlurmBackend:
    config = testbed_config(**overrides)
    backend = backend_for(config)
    assert isinstance(backend, SlurmBackend)
    return backend


@pytest.fixture
def account() -> str:
    return testbed_env()["SLURM_TESTBED_ACCOUNT"]


def ident() -> str:
    """The job identity of the testbed's first tenant account: its tree is <scratch_root>/<ident>."""
    return testbed_env()["SLURM_TESTBED_IDENTITY"]


@pytest.fixture
def scratch_root() -> Iterator[Path]:
    """A scratch root of the identity's, with a sibling directory "outside" of the same owner:
    had the purge followed a link there, nothing would have stopped it deleting."""
    user = pwd.getpwnam(ident())
    top = Path(tempfile.mkdtemp(prefix="portal-cleanup-"))
    os.chown(top, user.pw_uid, user.pw_gid)
    yield top / "scratch"
    shutil.rmtree(top, ignore_errors=True)


def hand_over(top: Path) -> None:
    """Everything under `top` to the job identity, links included (never their targets)."""
    user = pwd.getpwnam(ident())
    for path in [top, *top.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


# ---------------------------------------------------------------- list_jobs --
def test_list_jobs_finds_a_submitted_job_with_its_token(account):
    backend = make_backend()
    token = uuid.uuid4().hex
    spec = JobSpec(
        token=token,
        name="cleanup-list",
        account=account,
        qos="normal",
        priority="normal",
        partition="h100",
        gpu_type="h100",
        k8s_resource="",
        k8s_product="",
        gpus_per_node=1,
        nodes=1,
        walltime_minutes=2,
        script="#!/bin/bash\nsleep 60\n",
        env={},
        cpus_per_gpu=1,
        mem_per_gpu_mb=100,
        user=ident(),
    )
    job_id = backend.submit(spec)
    try:
        before = len(backend.commands)
        listed = {job.backend_id: job for job in backend.list_jobs([account, "no-such-account"])}
        assert listed[job_id].token == token and listed[job_id].account == account
        assert listed[job_id].user == ident()
        assert listed[job_id].state in (base.JobState.PENDING, base.JobState.RUNNING)
        (command,) = backend.commands[before:]  # one squeue, whatever the count
        assert command[0] == "squeue" and "-A" in command

        backend.cancel(job_id, user=ident())
        deadline = time.monotonic() + 30
        while job_id in {job.backend_id for job in backend.list_jobs([account])}:
            assert time.monotonic() < deadline, "a cancelled job is still listed"
            time.sleep(0.5)
    finally:
        backend.cancel(job_id, user=ident())


def test_list_jobs_checks_names_and_asks_nothing_for_no_accounts():
    backend = make_backend()
    assert backend.list_jobs([]) == [] and backend.commands == []
    with pytest.raises(BackendError, match="invalid account"):
        backend.list_jobs(["a,b"])  # a comma would widen squeue's -A list
    assert backend.commands == []


# ------------------------------------------------------------- purge_scratch --
def test_purge_scratch_over_ssh_dry_run_then_purge(account, scratch_root):
    tree = build_scratch_tree(scratch_root / ident() / account, scratch_root.parent / "outside")
    hand_over(scratch_root.parent)
    backend = make_backend(scratch_root=str(scratch_root))

    dry = backend.purge_scratch(account, older_than_days=PURGE_DAYS, dry_run=True, users=(ident(),))
    assert_untouched(tree, dry)
    assert "-delete" not in backend.commands[-1]

    report = backend.purge_scratch(account, older_than_days=PURGE_DAYS, dry_run=False, users=(ident(),))
    assert not report.dry_run
    assert_purged(tree, report)
    # one find each time; no name from the tree ever became an argument
    assert [command[:6] for command in backend.commands] == [["sudo", "-n", "-u", ident(), "--", "find"]] * 2
    assert all(str(scratch_root / ident() / account) == command[7] for command in backend.commands)
    assert not any("spaced" in arg or "line" in arg for command in backend.commands for arg in command)


def test_purge_scratch_keeps_files_younger_than_the_age(account, scratch_root):
    tree = build_scratch_tree(scratch_root / ident() / account, scratch_root.parent / "outside")
    hand_over(scratch_root.parent)
    backend = make_backend(scratch_root=str(scratch_root))
    report = backend.purge_scratch(
        account, older_than_days=50, dry_run=False, users=(ident(),)
    )  # the old ones are 40 days
    assert report.deleted == [] and report.bytes_freed == 0
    assert all(os.path.lexists(tree.root / rel) for rel in tree.deleted | tree.kept)


def test_purge_scratch_refuses_a_tenant_directory_that_is_a_symlink(account, scratch_root):
    outside = scratch_root.parent / "elsewhere"
    outside.mkdir()
    (outside / "precious").write_text("x")
    os.utime(outside / "precious", (time.time() - 40 * 86_400,) * 2)
    (scratch_root / ident()).mkdir(parents=True)
    os.symlink(outside, scratch_root / ident() / account)
    hand_over(scratch_root.parent)
    backend = make_backend(scratch_root=str(scratch_root))

    report = backend.purge_scratch(account, older_than_days=PURGE_DAYS, dry_run=False, users=(ident(),))
    assert report.deleted == [] and list(report.refused) == ["."]
    assert (outside / "precious").exists()


def test_purge_scratch_of_a_tenant_without_scratch_and_bad_input(account, scratch_root):
    backend = make_backend(scratch_root=str(scratch_root))
    empty = PurgeReport(deleted=[], refused={}, bytes_freed=0, dry_run=False)
    assert (
        backend.purge_scratch(account, older_than_days=PURGE_DAYS, dry_run=False, users=(ident(),)) == empty
    )
    backend.commands.clear()
    for bad in ("../portal", "a b", "-rf", ""):
        with pytest.raises(BackendError, match="invalid account"):
            backend.purge_scratch(bad, older_than_days=PURGE_DAYS, dry_run=False, users=(ident(),))
    with pytest.raises(BackendError, match="invalid purge age"):
        backend.purge_scratch(account, older_than_days=0, dry_run=False, users=(ident(),))
    assert backend.commands == []


def test_purge_scratch_reports_what_find_could_not_read(account, scratch_root):
    tree = build_scratch_tree(scratch_root / ident() / account, scratch_root.parent / "outside")
    locked = scratch_root / ident() / account / "locked"
    locked.mkdir()
    (locked / "old").write_text("x")
    os.utime(locked / "old", (time.time() - 40 * 86_400,) * 2)
    hand_over(scratch_root.parent)
    locked.chmod(0)  # the identity may not enter it; find goes on with the rest
    try:
        backend = make_backend(scratch_root=str(scratch_root))
        report = backend.purge_scratch(account, older_than_days=PURGE_DAYS, dry_run=False, users=(ident(),))
    finally:
        locked.chmod(0o755)
    assert sorted(report.deleted) == sorted(tree.deleted)
    assert "Permission denied" in report.refused["."]
    assert (locked / "old").exists()


# ------------------------------------------------------------ the others --
def job_logs(directory: Path, *, old: int) -> tuple[list[str], list[str]]:
    """Job logs (<token>.out) in a tenant directory: `old` of them 100 days old, one recent,
    and an old file that is not a job log. Returns (old log names, the rest)."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"{uuid.uuid4().hex}.out" for _ in range(old + 1)]
    for name in [*names, "notes.out"]:
        (directory / name).write_text("log\n")
    for name in [*names[:old], "notes.out"]:
        os.utime(directory / name, (time.time() - 100 * 86_400,) * 2)
    return names[:old], [names[old], "notes.out"]


def test_old_job_logs_go_with_the_retention_and_the_rest_stays(account, scratch_root):
    mine, kept = job_logs(scratch_root / ident() / account, old=2)
    other_old, other_kept = job_logs(scratch_root / ident() / "other-team", old=1)
    hand_over(scratch_root.parent)
    backend = make_backend(scratch_root=str(scratch_root))
    accounts = [account, "other-team", "not-made-yet"]
    users = {key: [ident()] for key in accounts}
    assert backend.delete_finished(accounts, older_than_s=90 * 86_400, dry_run=True, users=users) != []
    assert all(
        (scratch_root / ident() / account / name).exists() for name in mine
    )  # a dry run deletes nothing
    deleted = backend.delete_finished(accounts, older_than_s=90 * 86_400, dry_run=False, users=users)
    assert sorted(deleted) == sorted(
        [f"{account}/{n}" for n in mine] + [f"other-team/{n}" for n in other_old]
    )
    assert not any((scratch_root / ident() / account / name).exists() for name in mine)
    assert all((scratch_root / ident() / account / name).exists() for name in kept)
    assert all((scratch_root / ident() / "other-team" / name).exists() for name in other_kept)


def test_the_scratch_purge_leaves_job_logs_to_the_retention(account, scratch_root):
    logs, _rest = job_logs(scratch_root / ident() / account, old=1)
    hand_over(scratch_root.parent)
    report = make_backend(scratch_root=str(scratch_root)).purge_scratch(
        account, older_than_days=PURGE_DAYS, dry_run=False, users=(ident(),)
    )
    assert report.deleted == ["notes.out"]  # the old file that is not a job log
    assert (scratch_root / ident() / account / logs[0]).exists()


def test_gpu_utilization_asks_slurm_nothing():
    backend = make_backend()
    assert backend.gpu_utilization(["1"]) == {}
    assert backend.commands == []
