"""Smoke tests proving the local Slurm testbed (tests/testbed/testbed.sh) is real.

They talk to the cluster exactly like the portal does: paramiko over SSH as the
unprivileged portal user, host key verified against the testbed's known_hosts.
No Django needed.
"""

from __future__ import annotations

import re
import shlex
import time
import uuid
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.testbed.env import testbed_env as get_testbed_env
from tests.wait_support import wait_until

POLL_S = 0.5
JOB_TIMEOUT_S = 60
FAILED_STATES = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


# ------------------------------------------------------------------ helpers --
def connect(known_hosts: str | Path | None = None) -> paramiko.SSHClient:
    env = get_testbed_env()
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or env["SLURM_TESTBED_KNOWN_HOSTS"]))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            env["SLURM_TESTBED_HOST"],
            port=int(env["SLURM_TESTBED_PORT"]),
            username=env["SLURM_TESTBED_USER"],
            key_filename=env["SLURM_TESTBED_KEY_FILE"],
            look_for_keys=False,
            allow_agent=False,
            timeout=15,
            banner_timeout=15,
            auth_timeout=15,
        )
    except BaseException:
        client.close()
        raise
    return client


def run(
    client: paramiko.SSHClient, argv: list[str], stdin: str | None = None, timeout: float = 30
) -> tuple[int, str, str]:
    """Run argv remotely; every argument is shell-quoted, the script goes on stdin."""
    command = " ".join(shlex.quote(arg) for arg in argv)
    chan_in, chan_out, chan_err = client.exec_command(command, timeout=timeout)
    if stdin is not None:
        chan_in.write(stdin)
    chan_in.channel.shutdown_write()
    out = chan_out.read().decode()
    err = chan_err.read().decode()
    return chan_out.channel.recv_exit_status(), out, err


def check(client: paramiko.SSHClient, argv: list[str], stdin: str | None = None) -> str:
    rc, out, err = run(client, argv, stdin)
    assert rc == 0, f"{argv} failed (rc={rc}): {out}{err}"
    return out


def sbatch(client: paramiko.SSHClient, options: list[str], script: str, retry_s: float = 0) -> str:
    """Submit the script (on stdin) as the testbed's first job identity, through the portal user's
    sudoers rule (the portal user itself may submit nothing); return the job id. Retries while a
    new association propagates."""
    deadline = time.monotonic() + retry_s
    as_identity = ["sudo", "-n", "-u", get_testbed_env()["SLURM_TESTBED_IDENTITY"], "--"]
    while True:
        rc, out, err = run(client, [*as_identity, "sbatch", "--parsable", *options], stdin=script)
        if rc == 0:
            job_id = out.strip().split(";")[0]
            assert job_id.isdigit(), f"unexpected sbatch output {out!r}"
            return job_id
        if time.monotonic() >= deadline:
            raise AssertionError(f"sbatch {options} failed (rc={rc}): {out}{err}")
        time.sleep(POLL_S)


def sacct_state(client: paramiko.SSHClient, job_id: str) -> str:
    out = check(client, ["sacct", "-P", "-n", "-X", "-j", job_id, "-o", "State"])
    return out.strip().split()[0] if out.strip() else ""


def squeue_field(client: paramiko.SSHClient, job_id: str, fmt: str) -> str:
    return check(client, ["squeue", "-h", "-o", fmt, "-j", job_id]).strip()


def job_script(body: str) -> str:
    return "#!/bin/bash\nset -eu\n" + body.strip() + "\n"


# -------------------------------------------------------------------- tests --
def test_typed_gpu_job_gets_two_devices():
    env = get_testbed_env()
    token = f"testbed-{uuid.uuid4().hex}"
    output_name = f"{token}.out"
    client = connect()
    try:
        assert check(client, ["id", "-un"]).strip() == env["SLURM_TESTBED_USER"]
        job_id = sbatch(
            client,
            [
                "--gres=gpu:a100:2",
                "--partition=a100",
                f"--account={env['SLURM_TESTBED_ACCOUNT']}",
                "--time=1",
                f"--comment={token}",
                "--chdir=/tmp",
                f"--output={output_name}",
            ],
            job_script(f'echo "TOKEN={token}"\necho "CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES:-unset}}"'),
        )

        def finished():
            state = sacct_state(client, job_id)
            assert state not in FAILED_STATES, f"job {job_id} ended {state}"
            return state == "COMPLETED"

        wait_until(finished, timeout_s=JOB_TIMEOUT_S, interval_s=POLL_S, what=f"job {job_id} to complete")

        job = check(client, ["scontrol", "show", "job", "-o", job_id])
        assert f"Comment={token}" in job
        assert "Partition=a100" in job
        alloc = check(client, ["sacct", "-P", "-n", "-X", "-j", job_id, "-o", "AllocTRES"])
        assert "gres/gpu:a100=2" in alloc, alloc

        # the identity's file, read here as root (the testbed is this machine)
        path = Path("/tmp") / output_name
        output = path.read_text()
        path.unlink()
    finally:
        client.close()

    assert f"TOKEN={token}" in output, output
    match = re.search(r"^CUDA_VISIBLE_DEVICES=(.*)$", output, re.M)
    assert match, output
    devices = match.group(1).split(",")
    assert len(devices) == 2 and len(set(devices)) == 2, output
    assert all(d.isdigit() for d in devices), output


def test_wrong_or_unknown_host_key_is_refused(tmp_path):
    env = get_testbed_env()
    hostname = f"[{env['SLURM_TESTBED_HOST']}]:{env['SLURM_TESTBED_PORT']}"

    # the real known_hosts works
    client = connect()
    client.close()
    real_key = paramiko.HostKeys(env["SLURM_TESTBED_KNOWN_HOSTS"]).lookup(hostname)["ssh-ed25519"]

    # a different key of the same type for the same host: man-in-the-middle
    other = Ed25519PrivateKey.generate().public_key()
    other_line = other.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{hostname} {other_line}\n")
    with pytest.raises(paramiko.BadHostKeyException) as excinfo:
        connect(wrong)
    assert excinfo.value.key.asbytes() == real_key.asbytes()
    assert excinfo.value.expected_key.asbytes() != real_key.asbytes()

    # host not known at all: RejectPolicy refuses
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException) as excinfo:
        connect(empty)
    assert not isinstance(excinfo.value, paramiko.BadHostKeyException)
    assert "not found in known_hosts" in str(excinfo.value)


def test_server_offers_public_key_authentication_only():
    env = get_testbed_env()
    with paramiko.Transport((env["SLURM_TESTBED_HOST"], int(env["SLURM_TESTBED_PORT"]))) as transport:
        transport.start_client(timeout=15)
        with pytest.raises(paramiko.BadAuthenticationType) as excinfo:
            transport.auth_none(env["SLURM_TESTBED_USER"])
        assert excinfo.value.allowed_types == ["publickey"]


def test_account_gpu_limit_is_enforced():
    env = get_testbed_env()
    user = env["SLURM_TESTBED_IDENTITY"]
    parent = env["SLURM_TESTBED_PARENT_ACCOUNT"]
    account = f"tb{uuid.uuid4().hex[:10]}"
    job_ids: list[str] = []
    client = connect()
    try:
        # as the unprivileged portal user: works only because it is a Slurm operator
        check(
            client,
            [
                "sacctmgr",
                "-i",
                "add",
                "account",
                account,
                f"parent={parent}",
                f"cluster={env['SLURM_TESTBED_CLUSTER']}",
                "GrpTRES=gres/gpu=2",
            ],
        )
        check(
            client,
            [
                "sacctmgr",
                "-i",
                "add",
                "user",
                user,
                f"account={account}",
                f"cluster={env['SLURM_TESTBED_CLUSTER']}",
            ],
        )
        limits = check(
            client, ["sacctmgr", "-n", "-P", "show", "assoc", f"account={account}", "user=", "format=GrpTRES"]
        )
        assert "gres/gpu=2" in limits, limits

        options = [
            f"--account={account}",
            "--partition=h100",
            "--gres=gpu:h100:2",
            "--time=2",
            "--output=/dev/null",
            "--chdir=/tmp",
        ]
        script = job_script("sleep 30")
        job_ids.append(sbatch(client, options, script, retry_s=20))
        wait_until(
            lambda: squeue_field(client, job_ids[0], "%T") == "RUNNING",
            timeout_s=JOB_TIMEOUT_S,
            interval_s=POLL_S,
            what=f"job {job_ids[0]} to run",
        )

        job_ids.append(sbatch(client, options, script, retry_s=20))
        reason = wait_until(
            lambda: (squeue_field(client, job_ids[1], "%T %r") == "PENDING AssocGrpGRES") and "AssocGrpGRES",
            timeout_s=30,
            interval_s=POLL_S,
            what=f"job {job_ids[1]} to pend on the account's GPU limit",
        )
        assert reason == "AssocGrpGRES"
        assert squeue_field(client, job_ids[0], "%T") == "RUNNING"
    finally:
        try:
            if job_ids:
                run(client, ["scancel", *job_ids])
                wait_until(
                    lambda: not check(client, ["squeue", "-h", "-o", "%i", "-A", account]).strip(),
                    timeout_s=30,
                    interval_s=POLL_S,
                    what="cancelled jobs to leave the queue",
                )

            def deleted():
                rc, _out, _err = run(client, ["sacctmgr", "-i", "delete", "account", account])
                return rc == 0

            wait_until(deleted, timeout_s=30, interval_s=POLL_S, what=f"account {account} to be deleted")
            assert not check(
                client, ["sacctmgr", "-n", "-P", "list", "account", account, "format=account"]
            ).strip()
        finally:
            client.close()
