"""SlurmBackend against the real testbed (tests/testbed/testbed.sh): SSH as the portal user,
sbatch/scancel/tail as a job identity through the sudoers rule, squeue/sacct/sacctmgr as the
operator, no mocks. Every job and account made here is removed in a finally, and every wait has
a deadline. The testbed runs on this machine, so a test reads Slurm's own records (scontrol)
and removes the identities' files as root, from outside the portal's path."""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clusters.backends import backend_for, base
from clusters.backends.base import (
    BackendError,
    BackendUnavailable,
    JobRef,
    JobSpec,
    TenantLimits,
)
from clusters.backends.slurm import SlurmBackend, ssh
from clusters.backends.slurm.accounts import TIERS
from tests.slurm_support import (
    JOB_TIMEOUT_S,
    POLL_S,
    delete_account,
    job_spec,
    remove_local,
    status_of,
    wait_for_end,
)
from tests.testbed.env import testbed_config as make_config
from tests.testbed.env import testbed_env
from tests.wait_support import wait_until


# ------------------------------------------------------------------ helpers --
def scontrol_job(job_id: str) -> dict[str, str]:
    """Slurm's own record of the job (scontrol as root on this machine): what sbatch was given."""
    text = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def remote_exists(backend: SlurmBackend, path: str) -> bool:
    result = backend.run(["test", "-e", path])
    assert result.rc in (0, 1), result
    return result.rc == 0


def read_assoc(backend: SlurmBackend, account: str) -> list[str]:
    fields = "Account,User,ParentName,GrpTRES,GrpTRESMins,QOS,DefaultQOS"
    return sorted(
        backend.check(
            ["sacctmgr", "-P", "-n", "show", "assoc", "where", f"account={account}", f"format={fields}"]
        )
        .strip()
        .splitlines()
    )


# ----------------------------------------------------------------- fixtures --
@pytest.fixture
def backend() -> SlurmBackend:
    return SlurmBackend(make_config())


@pytest.fixture
def jobs(backend: SlurmBackend) -> Iterator[list[tuple[str, JobSpec]]]:
    """(job id, spec) of the jobs a test submits: cancelled and their output removed afterwards."""
    submitted: list[tuple[str, JobSpec]] = []
    yield submitted
    cleaner = SlurmBackend(make_config())
    for job_id, spec in submitted:
        cleaner.cancel(job_id, user=spec.user)
        remove_local(f"{cleaner.job_dir(spec.account, spec.user)}/{spec.token}.out")


@pytest.fixture(scope="module")
def portal_tiers() -> None:
    """The tier QOS. Creating a QOS needs a Slurm Administrator and the portal's user is an
    Operator, so the site's admin creates them once; on the testbed, testbed.sh does."""
    testbed_env()
    shown = subprocess.run(
        ["sacctmgr", "-P", "-n", "show", "qos", "format=Name,Priority"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    existing = dict(line.split("|", 1) for line in shown.split())
    assert {name: existing.get(name) for name in TIERS} == {name: str(p) for name, p in TIERS.items()}


# -------------------------------------------------------------------- tests --
def test_registry_builds_the_slurm_backend():
    assert isinstance(backend_for(make_config()), SlurmBackend)


def test_typed_gpu_job_is_found_polled_to_completion_and_logged(backend, jobs):
    spec = job_spec(
        'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\nsleep 3', partition="a100", gpu_type="a100"
    )
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    assert job_id.isdigit()
    assert backend.find(spec.token, account=spec.account, user=spec.user) == job_id
    # the same token under another account or identity is not this job
    assert (
        backend.find(spec.token, account=testbed_env()["SLURM_TESTBED_OTHER_ACCOUNT"], user=spec.user) is None
    )
    assert (
        backend.find(spec.token, account=spec.account, user=testbed_env()["SLURM_TESTBED_OTHER_IDENTITY"])
        is None
    )

    seen: list[str] = []

    def completed():
        status = status_of(backend, job_id)
        assert status is not None
        seen.append(status.state)
        assert status.state in (base.JobState.PENDING, base.JobState.RUNNING, base.JobState.COMPLETED), status
        return status if status.state == base.JobState.COMPLETED else None

    status = wait_until(
        completed, timeout_s=JOB_TIMEOUT_S, interval_s=POLL_S, what=f"job {job_id} to complete"
    )
    assert seen[0] in (base.JobState.PENDING, base.JobState.RUNNING), seen
    assert status.raw_state == "COMPLETED" and status.exit_code == 0
    assert status.node_list
    now = datetime.now(UTC)
    assert status.started_at is not None and status.finished_at is not None
    assert status.started_at.tzinfo is not None
    assert now - timedelta(minutes=5) < status.started_at <= status.finished_at <= now + timedelta(seconds=5)

    record = scontrol_job(job_id)
    assert record["TresPerNode"] == "gres:gpu:a100:1" and record["Comment"] == spec.token
    assert record["UserId"].startswith(f"{spec.user}(") and record["Account"] == spec.account
    tail = backend.log_tail(JobRef(job_id, spec.token, spec.account, spec.user), lines=10, max_bytes=4096)
    assert not tail.truncated
    devices = [line for line in tail.lines if line.startswith("CUDA_VISIBLE_DEVICES=")]
    assert len(devices) == 1 and re.fullmatch(r"CUDA_VISIBLE_DEVICES=[4-7]", devices[0]), tail.lines


def test_find_in_accounting_matches_the_submit_line(backend, jobs):
    # slurmctld forgets an ended job after MinJobAge (5 min here): find() then has only sacct,
    # whose Comment is empty without AccountingStoreFlags=job_comment. Rather than wait that
    # long, slurmctld's copy of the comment is changed (scontrol, as root): squeue no longer
    # knows the token, and only the submit line that slurmdbd keeps can find the job.
    spec = job_spec("sleep 120")
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", "Comment=elsewhere"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert scontrol_job(job_id)["Comment"] == "elsewhere"

    def find() -> str | None:
        return backend.find(spec.token, account=spec.account, user=spec.user)

    assert (
        wait_until(find, timeout_s=JOB_TIMEOUT_S, interval_s=POLL_S, what="slurmdbd to record the job")
        == job_id
    )
    before = len(backend.commands)
    assert find() == job_id
    assert [argv[0] for argv in backend.commands[before:]] == ["squeue", "sacct"]

    before = len(backend.commands)
    assert backend.find(uuid.uuid4().hex, account=spec.account, user=spec.user) is None
    searched = backend.commands[before:]
    assert [argv[0] for argv in searched] == ["squeue", "sacct"]
    assert "now-7days" in searched[1]


def test_failing_script_ends_failed_with_its_exit_code(backend, jobs):
    spec = job_spec("echo about to fail\nexit 3")
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    status = wait_for_end(backend, job_id)
    assert (status.state, status.raw_state, status.exit_code) == (base.JobState.FAILED, "FAILED", 3)
    assert status.finished_at is not None


def test_cancelled_job_ends_cancelled_and_cancel_again_is_harmless(backend, jobs):
    spec = job_spec("sleep 120")
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    wait_until(
        lambda: status_of(backend, job_id).state == base.JobState.RUNNING,
        timeout_s=JOB_TIMEOUT_S,
        interval_s=POLL_S,
        what=f"job {job_id} to run",
    )
    backend.cancel(job_id, user=spec.user)
    assert backend.commands[-1][:6] == ["sudo", "-n", "-u", spec.user, "--", "scancel"]
    status = wait_for_end(backend, job_id, timeout=30)
    assert status.state == base.JobState.CANCELLED and status.raw_state.startswith("CANCELLED"), status
    backend.cancel(job_id, user=spec.user)  # already finished: not an error


def test_job_past_its_walltime_ends_timeout(backend, jobs):
    spec = job_spec("sleep 150", walltime_minutes=1)
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    assert scontrol_job(job_id)["TimeLimit"] == "00:01:00"
    status = wait_for_end(backend, job_id, timeout=170)
    assert (status.state, status.raw_state) == (base.JobState.TIMEOUT, "TIMEOUT"), status
    assert status.finished_at - status.started_at < timedelta(seconds=150)


def test_poll_of_200_jobs_runs_one_squeue_and_one_sacct(backend):
    account, identity = testbed_env()["SLURM_TESTBED_ACCOUNT"], testbed_env()["SLURM_TESTBED_IDENTITY"]
    options = [
        f"--account={account}",
        "--partition=h100",
        "--gres=gpu:h100:1",
        "--time=1",
        "--output=/dev/null",
        "--chdir=/tmp",
    ]
    ids: list[str] = []
    try:
        started = time.monotonic()
        for _ in range(200):
            argv = backend.as_identity(identity, ["sbatch", "--parsable", "--hold", *options])
            out = backend.check(argv, stdin="#!/bin/sh\ntrue\n")
            ids.append(out.strip().split(";")[0])
        submit_s = time.monotonic() - started
        assert len(set(ids)) == 200, submit_s

        before = len(backend.commands)
        statuses = backend.poll(ids)
        polled = backend.commands[before:]
        assert len(polled) == 2, polled
        assert sum("squeue" in argv for argv in polled) == 1
        assert sum("sacct" in argv for argv in polled) == 1
        assert set(statuses) == set(ids)
        assert {(s.state, s.reason) for s in statuses.values()} == {(base.JobState.PENDING, "JobHeldUser")}
    finally:
        if ids:
            backend.run(["scancel", *ids])


# Every GPU type and shard the testbed tracks gets a limit, 0 where nothing is granted: its MIG
# profiles (typed GRES of the share node) come first in sacctmgr's order.
UNGRANTED_MIG = "gres/gpu:1g.18gb=0,gres/gpu:3g.71gb=0,"


def test_tenant_gpu_limit_holds_the_second_job(backend, portal_tiers):
    account = f"pt{uuid.uuid4().hex[:10]}"
    user = testbed_env()["SLURM_TESTBED_IDENTITY"]
    limits = TenantLimits(account, "portal-normal", [user], {"a100": 2}, gpu_minutes=600)
    try:
        backend.apply_tenant(limits)
        rows = read_assoc(backend, account)
        assert rows == [
            f"{account}|{user}||||portal-borrow,portal-normal|portal-normal",
            f"{account}||portal|{UNGRANTED_MIG}gres/gpu:a100=2,gres/gpu:h100=0,gres/gpu:h200=0,gres/gpu=2,gres/shard=0"
            "|gres/gpu=600|portal-borrow,portal-normal|portal-normal",
        ]

        spec = job_spec(
            "sleep 60", account=account, user=user, qos="portal-normal", partition="a100", gpu_type="a100"
        )
        first = backend.submit(replace(spec, gpus_per_node=2))  # usable at once: no retry
        wait_until(
            lambda: status_of(backend, first).state == base.JobState.RUNNING,
            timeout_s=JOB_TIMEOUT_S,
            interval_s=POLL_S,
            what=f"job {first} to run",
        )
        second = backend.submit(replace(spec, token=uuid.uuid4().hex, gpus_per_node=2))

        def held_by_limit():
            status = status_of(backend, second)
            return status if status.reason.startswith("AssocGrp") else None

        status = wait_until(
            held_by_limit,
            timeout_s=30,
            interval_s=POLL_S,
            what=f"job {second} to wait on the account's limit",
        )
        assert (status.state, status.reason) == (base.JobState.PENDING, "AssocGrpGRES"), status
        assert status_of(backend, first).state == base.JobState.RUNNING
    finally:
        delete_account(backend, account)
        remove_local(backend.job_dir(account, user))


def test_apply_tenant_twice_writes_nothing_the_second_time(backend, portal_tiers):
    account = f"pt{uuid.uuid4().hex[:10]}"
    user = testbed_env()["SLURM_TESTBED_IDENTITY"]
    limits = TenantLimits(account, "portal-high", [user], {"a100": 2, "h100": 1}, gpu_minutes=1200)
    try:
        backend.apply_tenant(limits)
        first = read_assoc(backend, account)
        assert (
            f"{account}||portal|{UNGRANTED_MIG}gres/gpu:a100=2,gres/gpu:h100=1,gres/gpu:h200=0,gres/gpu=3,"
            "gres/shard=0|gres/gpu=1200|portal-borrow,portal-high|portal-high" in first
        )

        before = len(backend.commands)
        backend.apply_tenant(limits)
        second_run = backend.commands[before:]
        assert [argv[:5] for argv in second_run] == [
            ["sacctmgr", "-P", "-n", "show", "qos"],
            ["sacctmgr", "-P", "-n", "show", "tres"],
            ["sacctmgr", "-P", "-n", "show", "assoc"],
        ]
        assert read_assoc(backend, account) == first

        # a grant taken away lowers the limit to 0 rather than leaving it behind
        backend.apply_tenant(replace(limits, gpus_by_type={"a100": 2}, qos="portal-low", gpu_minutes=60))
        assert read_assoc(backend, account) == [
            f"{account}|{user}||||portal-borrow,portal-low|portal-low",
            f"{account}||portal|{UNGRANTED_MIG}gres/gpu:a100=2,gres/gpu:h100=0,gres/gpu:h200=0,gres/gpu=2,gres/shard=0"
            "|gres/gpu=60|portal-borrow,portal-low|portal-low",
        ]
    finally:
        delete_account(backend, account)


def test_apply_tenant_refuses_bad_names_and_untracked_gpu_types(backend, portal_tiers):
    with pytest.raises(BackendError, match="invalid account"):
        backend.apply_tenant(TenantLimits("x where name=root", "portal-normal", [], {}, 0))
    with pytest.raises(BackendError, match="parent account"):
        backend.apply_tenant(TenantLimits("portal", "portal-normal", [], {}, 0))
    assert backend.commands == []
    with pytest.raises(BackendError, match="QOS 'portal-nosuch' does not exist"):
        backend.apply_tenant(TenantLimits(f"pt{uuid.uuid4().hex[:10]}", "portal-nosuch", [], {}, 0))
    with pytest.raises(BackendError, match="not tracked"):
        backend.apply_tenant(TenantLimits(f"pt{uuid.uuid4().hex[:10]}", "portal-normal", [], {"mi300": 1}, 0))
    assert not any(argv[2] in ("add", "modify", "delete") for argv in backend.commands)


def test_injection_in_names_and_environment_is_refused_or_inert(backend, jobs):
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    payloads = [
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"'; touch {marker}; echo '",
        f'"; touch {marker}; "',
    ]
    env = {
        f"INJ_{n}": value for n, value in enumerate([*payloads, f"two\nlines; touch {marker}", "$HOME \\ %s"])
    }
    script = "\n".join(f'printf "{name}=%s\\n" "$(printf %s "${name}" | base64 -w0)"' for name in env)
    spec = job_spec(script, name=f"x; touch {marker}; $(touch {marker}) `touch {marker}` '\"", env=env)
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    assert wait_for_end(backend, job_id).state == base.JobState.COMPLETED

    assert backend.check(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%j"]).rstrip("\n") == spec.name
    tail = backend.log_tail(JobRef(job_id, spec.token, spec.account, spec.user), lines=50, max_bytes=65536)
    printed = dict(line.split("=", 1) for line in tail.lines)
    assert {name: base64.b64decode(value).decode() for name, value in printed.items()} == env

    refused = [
        job_spec("true", env={f"A;touch {marker}": "x"}),
        job_spec("true", env={f"$(touch {marker})": "x"}),
        job_spec("true", env={"A B": "x"}),
        job_spec("true", env={"A=B": "x"}),
        job_spec("true", env={"1A": "x"}),
        job_spec("true", env={"A\nB": "x"}),
        job_spec("true", env={"A": "nul\0byte"}),
        job_spec("true", name=f"two\nlines; touch {marker}"),
        job_spec("true", account=f"portal;touch {marker}"),
        job_spec("true", gpu_type="h100:1,gpu:a100"),
        job_spec("true", token="../../.bashrc"),
    ]
    checker = SlurmBackend(make_config())
    for bad in refused:
        with pytest.raises(BackendError):
            checker.submit(bad)
    for call in (lambda: checker.cancel("--user=gpuportal"), lambda: checker.poll(["1;id"])):
        with pytest.raises(BackendError):
            call()
    assert checker.commands == []  # refused before anything ran
    assert not remote_exists(backend, marker)


def test_log_tail_reads_a_bounded_tail(backend, jobs):
    spec = job_spec('for i in $(seq 1 200); do echo "line $i"; done')
    job_id = backend.submit(spec)
    jobs.append((job_id, spec))
    assert wait_for_end(backend, job_id).state == base.JobState.COMPLETED
    ref = JobRef(job_id, spec.token, spec.account, spec.user)

    whole = backend.log_tail(ref, lines=1000, max_bytes=1_000_000)
    assert (len(whole.lines), whole.truncated) == (200, False)
    last = backend.log_tail(ref, lines=5, max_bytes=1_000_000)
    assert last.lines == [f"line {i}" for i in range(196, 201)] and last.truncated
    small = backend.log_tail(ref, lines=1000, max_bytes=30)
    assert small.truncated and small.lines == ["line 198", "line 199", "line 200"]
    missing = backend.log_tail(
        JobRef(job_id, uuid.uuid4().hex, spec.account, spec.user), lines=10, max_bytes=100
    )
    assert missing == base.LogTail(lines=[], truncated=False)


def test_inventory_lists_gpu_partitions(backend):
    partitions = {info.name: info for info in backend.inventory()}
    assert set(partitions) >= {"h100", "a100"}
    for name in ("h100", "a100"):
        info = partitions[name]
        assert (info.gpu_type, info.gpus_per_node, info.nodes) == (name, 4, 2)
        assert 0 <= info.gpus_free <= 8
        assert info.max_walltime_minutes is None  # MaxTime=INFINITE


def test_health_and_the_pooled_connection(backend):
    health = backend.health()
    assert health.healthy and "is UP" in health.detail, health
    other = SlurmBackend(make_config())
    other.run(["true"])
    entry = ssh.POOL[make_config().slug]
    transport = entry.client.get_transport()
    assert other.run(["true"]).rc == 0 and entry.client.get_transport() is transport  # reused

    transport.close()  # the connection dies between two uses: reconnect once
    assert other.run(["id", "-un"]).stdout.strip() == testbed_env()["SLURM_TESTBED_USER"]
    assert entry.client.get_transport() is not transport


def test_wrong_or_unknown_host_key_runs_nothing(tmp_path):
    env = testbed_env()
    host = f"[{env['SLURM_TESTBED_HOST']}]:{env['SLURM_TESTBED_PORT']}"
    other = Ed25519PrivateKey.generate().public_key()
    line = other.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    for known_hosts, message in (
        (f"{host} {line}\n", "does not match known_hosts"),
        ("", "not found in known_hosts"),
    ):
        backend = SlurmBackend(make_config(slug=f"mitm-{uuid.uuid4().hex[:6]}", ssh_known_hosts=known_hosts))
        with pytest.raises(BackendUnavailable, match=message):
            backend.submit(job_spec("true"))
        health = backend.health()
        assert not health.healthy and message in health.detail
        assert backend.commands == []


def test_hung_sshd_and_hung_command_time_out():
    with socket.socket() as listener:  # accepts TCP connections, never says a word
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        backend = SlurmBackend(make_config(slug="hung", ssh_port=port), connect_timeout_s=1)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            backend.run(["true"])
        assert not backend.health().healthy
        assert time.monotonic() - started < 6
        assert backend.commands == []

    backend = SlurmBackend(make_config(), command_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="did not finish within 1s"):
        backend.run(["sleep", "10"])
    assert time.monotonic() - started < 3
    assert backend.run(["true"]).rc == 0  # the pooled connection survives a timed-out command


def test_refusals_are_backend_errors_with_slurms_message(backend):
    account = f"nosuch{uuid.uuid4().hex[:6]}"
    try:
        with pytest.raises(BackendError, match="Invalid account") as excinfo:
            backend.submit(job_spec("true", account=account))
        assert not isinstance(excinfo.value, BackendUnavailable)
    finally:
        remove_local(backend.job_dir(account, testbed_env()["SLURM_TESTBED_IDENTITY"]))
    with pytest.raises(BackendError, match="Invalid qos specification") as excinfo:
        backend.submit(job_spec("true", qos=f"nosuch{uuid.uuid4().hex[:6]}"))
    assert not isinstance(excinfo.value, BackendUnavailable)
    with pytest.raises(BackendError, match="Requested node configuration is not available") as excinfo:
        backend.submit(job_spec("true", gpu_type="v100"))  # a GPU type no node of the partition has
    assert not isinstance(excinfo.value, BackendUnavailable)
