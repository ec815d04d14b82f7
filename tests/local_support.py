"""What the local backend's tests share: a backend whose state directory is the test's, a job spec
for it, the waits for a job's state, for a line of its log and for its process group to be gone.
Child processes that stand in for a Celery worker import this module too
(tests/clusters/test_backend_local.py)."""

import json
import time
from pathlib import Path

from clusters.backends.base import ClusterConfig, JobRef, JobSpec, JobStatus
from clusters.backends.local import LocalBackend

SLEEPER = 'echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 60\n'


def make_backend(state_dir: Path, *, gpus: int = 4, bwrap: str = "/usr/bin/bwrap", **kwargs) -> LocalBackend:
    """`bwrap`: a path where there is none makes the cluster run its jobs unsandboxed, for real."""
    config = ClusterConfig(
        slug="local", kind="local", local_gpus=gpus, state_dir=str(state_dir), local_sandbox_bwrap=bwrap
    )
    return LocalBackend(config, grace_s=kwargs.pop("grace_s", 2), **kwargs)


def job_spec(token: str, script: str, *, gpus: int = 1, **fields) -> JobSpec:
    values = {
        "token": token,
        "name": f"job {token}",
        "account": "team-a",
        "qos": "portal-normal",
        "priority": "normal",
        "partition": "local",
        "gpu_type": "local",
        "k8s_resource": "",
        "k8s_product": "",
        "gpus_per_node": gpus,
        "nodes": 1,
        "walltime_minutes": 60,
        "script": script,
        "env": {},
    }
    return JobSpec(**{**values, **fields})


def group_members(pgid: int, *, include_zombies: bool) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and (include_zombies or fields[0] != "Z"):
            members.append(int(entry.name))
    return members


def wait_until_gone(pgid: int, *, include_zombies: bool, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid, include_zombies=include_zombies):
        assert time.monotonic() < deadline, (
            f"process group {pgid} still has {group_members(pgid, include_zombies=True)}"
        )
        time.sleep(0.05)


def wait_for_state(
    backend: LocalBackend, backend_id: str, states: set[str], *, timeout_s: float = 20
) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = backend.poll([backend_id]).get(backend_id)
        if status is not None and status.state in states:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{backend_id} is {status}, not in {states} after {timeout_s}s")
        time.sleep(0.05)


def log_lines(backend: LocalBackend, backend_id: str, token: str, account: str = "team-a") -> list[str]:
    return backend.log_tail(JobRef(backend_id, token, account), lines=1000, max_bytes=100_000).lines


def wait_for_line(
    backend: LocalBackend, backend_id: str, token: str, prefix: str, *, timeout_s: float = 20
) -> str:
    """The first line of the job's log that starts with `prefix`, once it is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        backend.poll([backend_id])  # starts it, if it waits
        for line in log_lines(backend, backend_id, token):
            if line.startswith(prefix):
                return line
        time.sleep(0.05)
    raise AssertionError(f"{backend_id} printed no {prefix!r} within {timeout_s}s")


def pgid_of(state_dir: Path, token: str) -> int:
    return json.loads((state_dir / "jobs" / token / ".portal" / "proc.json").read_text())["pgid"]
