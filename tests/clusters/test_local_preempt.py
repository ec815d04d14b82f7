"""Preemption on the local cluster: warn() and the checkpoint directory, with real processes.

A preemptible job traps $PORTAL_PREEMPT_SIGNAL, saves into $PORTAL_CHECKPOINT_DIR and exits; the
next attempt (a new submission with the same checkpoint key) finds what it saved. Each test runs
in the bubblewrap sandbox (as root here: as its tenant's uid) and without one (bwrap pointed at
nothing, as on a machine without bubblewrap), and judges from outside: the files in the tenant's
scratch, the job's log, its polled state.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clusters.backends.base import BackendError, JobState
from clusters.backends.local import LocalBackend
from tests.local_support import (
    SLEEPER,
    job_spec,
    log_lines,
    make_backend,
    pgid_of,
    wait_for_line,
    wait_for_state,
    wait_until_gone,
)

KEY = "job-42.ckpt"
CHECKPOINTING = """save() {
    echo step-7 > "$PORTAL_CHECKPOINT_DIR/state"
    echo "PORTAL_CHECKPOINT $(date +%s)"
    exit 0
}
trap save "$PORTAL_PREEMPT_SIGNAL"
echo "attempt=$PORTAL_ATTEMPT dir=$PORTAL_CHECKPOINT_DIR signal=$PORTAL_PREEMPT_SIGNAL"
sleep 300 &
wait
"""
RESUMING = """saved=$(cat "$PORTAL_CHECKPOINT_DIR/state")
echo "attempt=$PORTAL_ATTEMPT dir=$PORTAL_CHECKPOINT_DIR resumed=$saved"
"""


@pytest.fixture(params=["sandboxed", "unsandboxed"])
def backend(request, tmp_path):
    bwrap = "/usr/bin/bwrap" if request.param == "sandboxed" else str(tmp_path / "no-bwrap")
    backend = make_backend(tmp_path, bwrap=bwrap, grace_s=1)
    # CI installs bubblewrap: a sandbox that cannot be made is a failure, not a skip.
    assert backend.sandbox.ok == (request.param == "sandboxed"), backend.sandbox.detail
    yield backend
    for job in backend.list_jobs(["team-a"]):
        backend.cancel(job.backend_id)


def checkpoint_dir_seen(backend: LocalBackend, tmp_path: Path) -> str:
    """PORTAL_CHECKPOINT_DIR as the job sees it: under /scratch in the sandbox, else the host path."""
    if backend.sandbox.ok:
        return f"/scratch/checkpoints/{KEY}"
    return str(tmp_path / "scratch" / "team-a" / "checkpoints" / KEY)


def test_a_warned_job_checkpoints_ends_preempted_and_the_next_attempt_resumes(backend, tmp_path):
    first = backend.submit(job_spec("try-1", CHECKPOINTING, preemptible=True, grace_s=30, checkpoint_key=KEY))
    seen = checkpoint_dir_seen(backend, tmp_path)
    assert wait_for_line(backend, first, "try-1", "attempt=") == f"attempt=1 dir={seen} signal=TERM"
    pgid = pgid_of(tmp_path, "try-1")
    warned_at = time.time()

    backend.warn(first, grace_s=30)

    status = wait_for_state(backend, first, {JobState.PREEMPTED, JobState.COMPLETED, JobState.FAILED})
    assert (status.state, status.raw_state, status.exit_code) == (JobState.PREEMPTED, "PREEMPTED", 0)
    assert time.time() - warned_at < 10  # it checkpointed and left at once, no wait for the grace
    # The checkpoint, as the host sees it: in the tenant's scratch, the job's own.
    saved = tmp_path / "scratch" / "team-a" / "checkpoints" / KEY
    assert (saved / "state").read_text() == "step-7\n"
    assert saved.stat().st_uid == saved.parent.stat().st_uid == (saved / "state").stat().st_uid
    assert oct(saved.stat().st_mode & 0o777) == "0o700"
    if backend.sandbox.ok and os.geteuid() == 0:
        assert saved.stat().st_uid >= backend.config.local_sandbox_uid_base  # the tenant's uid, not root
    marker = [line for line in log_lines(backend, first, "try-1") if line.startswith("PORTAL_CHECKPOINT ")]
    assert len(marker) == 1 and int(warned_at) <= int(marker[0].split()[1]) <= time.time()
    wait_until_gone(pgid, include_zombies=False)
    backend.cancel(first)  # the portal's cancel once the grace is out: the job has ended, nothing to do
    assert backend.poll([first])[first].state == JobState.PREEMPTED

    second = backend.submit(job_spec("try-2", RESUMING, preemptible=True, attempt=2, checkpoint_key=KEY))

    assert wait_for_state(backend, second, {JobState.COMPLETED, JobState.FAILED}).state == JobState.COMPLETED
    assert log_lines(backend, second, "try-2") == [f"attempt=2 dir={seen} resumed=step-7"]


def test_warn_kills_nothing_and_the_cancel_after_the_grace_ends_the_job_preempted(backend, tmp_path):
    script = "trap 'echo warned' TERM\necho started\nfor i in $(seq 1 1500); do sleep 0.2; done\n"
    backend_id = backend.submit(job_spec("stays", script, preemptible=True, checkpoint_key=KEY))
    wait_for_line(backend, backend_id, "stays", "started")
    pgid = pgid_of(tmp_path, "stays")

    backend.warn(backend_id, grace_s=1)

    wait_for_line(backend, backend_id, "stays", "warned")
    time.sleep(backend.grace_s + 1)  # longer than both the grace asked for and the backend's own
    assert backend.poll([backend_id])[backend_id].state == JobState.RUNNING

    backend.cancel(backend_id)  # SIGTERM, which it ignores, then SIGKILL

    status = backend.poll([backend_id])[backend_id]
    assert (status.state, status.raw_state) == (JobState.PREEMPTED, "PREEMPTED")
    wait_until_gone(pgid, include_zombies=False)


def test_warn_leaves_waiting_finished_and_unknown_jobs_alone(backend, tmp_path):
    done = backend.submit(job_spec("done", "exit 0\n"))
    assert wait_for_state(backend, done, {JobState.COMPLETED, JobState.FAILED}).state == JobState.COMPLETED
    holder = backend.submit(job_spec("holder", SLEEPER, gpus=3))
    # A caller from before checkpoint keys: attempt 1, the signal, and no checkpoint directory.
    script = 'echo "attempt=$PORTAL_ATTEMPT signal=$PORTAL_PREEMPT_SIGNAL ${PORTAL_CHECKPOINT_DIR-unset}"\n'
    waiting = backend.submit(job_spec("waiter", script, gpus=2))
    assert backend.poll([waiting])[waiting].state == JobState.PENDING

    for backend_id in (done, waiting, "local-999", "nonsense"):
        backend.warn(backend_id, grace_s=5)

    assert backend.poll([done])[done].state == JobState.COMPLETED
    assert backend.poll([waiting])[waiting].state == JobState.PENDING
    backend.cancel(holder)
    status = wait_for_state(backend, waiting, {JobState.COMPLETED, JobState.FAILED, JobState.PREEMPTED})
    assert status.state == JobState.COMPLETED  # the warning left no mark on it
    assert log_lines(backend, waiting, "waiter") == ["attempt=1 signal=TERM unset"]
    assert not (tmp_path / "scratch" / "team-a" / "checkpoints").exists()


@pytest.mark.parametrize("link_at", ["checkpoints", f"checkpoints/{KEY}"])
def test_a_link_left_in_the_scratch_is_never_followed(backend, tmp_path, link_at):
    """A tenant's job may leave a symlink where its checkpoint directory goes: followed as root,
    it would make or chown a directory anywhere. The job fails, saying why; nothing moves there."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    before = outside.stat()
    link = tmp_path / "scratch" / "team-a" / link_at
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)

    backend_id = backend.submit(job_spec("linked", "echo ran\n", checkpoint_key=KEY))

    status = wait_for_state(backend, backend_id, {JobState.COMPLETED, JobState.FAILED})
    assert (status.state, status.raw_state) == (JobState.FAILED, "LAUNCH_FAILED")
    assert f"checkpoints/{KEY} cannot be made" in status.reason and str(tmp_path) not in status.reason
    assert list(outside.iterdir()) == []
    after = outside.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    assert link.is_symlink()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"checkpoint_key": "../up"}, "invalid checkpoint key '../up'"),
        ({"checkpoint_key": "a/b"}, "invalid checkpoint key"),
        ({"checkpoint_key": ".."}, "invalid checkpoint key"),
        ({"checkpoint_key": "."}, "invalid checkpoint key"),
        ({"checkpoint_key": "a..b"}, "invalid checkpoint key"),
        ({"checkpoint_key": "a b"}, "invalid checkpoint key"),
        ({"checkpoint_key": "x" * 129}, "invalid checkpoint key"),
        ({"attempt": 0}, "invalid attempt 0"),
        ({"attempt": True}, "invalid attempt True"),
    ],
)
def test_submit_refuses_a_bad_checkpoint_key_or_attempt(tmp_path, fields, message):
    backend = make_backend(tmp_path)

    with pytest.raises(BackendError, match=message):
        backend.submit(job_spec("bad", "true\n", **fields))

    assert backend.find("bad") is None
    assert not (tmp_path / "scratch").exists()
