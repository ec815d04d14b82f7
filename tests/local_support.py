"""What the local backend's tests share: a backend whose state directory is the test's, a job spec
for it, and the wait for a job's process group to be gone. Child processes that stand in for a
Celery worker import this module too (tests/clusters/test_backend_local.py)."""

import time
from pathlib import Path

from clusters.backends.base import ClusterConfig, JobSpec
from clusters.backends.local import LocalBackend

SLEEPER = 'echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 60\n'


def make_backend(state_dir: Path, *, gpus: int = 4, **kwargs) -> LocalBackend:
    config = ClusterConfig(slug="local", kind="local", local_gpus=gpus, state_dir=str(state_dir))
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
