"""Starting local jobs: waiting jobs placed on free devices, FIFO within each pool, each started
through the wrapper (launch.py) in its own session and process group.

.portal/proc.json holds the wrapper's pid (= pgid), start time and boot id, so that any process can
tell the job's group from a later one that reused the pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

from clusters.backends import base
from clusters.backends.base import BackendError, ClusterConfig
from clusters.backends.local import launch, sandbox, statedir
from clusters.backends.local.allocation import Ask, device_env, place, refusal
from clusters.backends.local.devices import Machine
from clusters.backends.local.ends import end_record, finish
from clusters.backends.local.records import boot_id, read_json, start_ticks, write_json

# Wrappers this process started, polled so that a long-lived worker keeps no zombies.
_children: dict[int, subprocess.Popen] = {}
_children_lock = threading.Lock()


def reap() -> None:
    with _children_lock:
        for pid, child in list(_children.items()):
            if child.poll() is not None:
                del _children[pid]


def settle(
    state: dict[str, Any], *, config: ClusterConfig, machine: Machine, sandbox_config: sandbox.SandboxConfig
) -> None:
    """Under the lock: release the devices of ended jobs, then start waiting jobs that fit, in
    order within each pool (Ask.pool: a vendor's devices, or one MIG profile's devices), so that
    a big job is not starved by small ones behind it, nor held up by one that waits for other
    devices."""
    root = statedir.state_root(config)
    for backend_id, job in list(state["running"].items()):
        if end_record(statedir.job_dir(root, job["token"]) / ".portal") is not None:
            del state["running"][backend_id]
    # A waiting job that has a process record was started just before a crash that lost the
    # saved state: it holds its devices before any other job is placed.
    for job in list(state["queue"]):
        meta = statedir.job_dir(root, job["token"]) / ".portal"
        started = meta.is_dir() and not (meta / "end.json").exists() and read_json(meta / "proc.json")
        if started:
            state["queue"].remove(job)
            _running(state, job, started)
    waiting: set[tuple[str, str]] = set()  # the pools whose first job waits
    running = state["running"].values()  # a view: it sees each job started below
    for job in list(state["queue"]):
        ask = Ask.of_record(job)
        meta = statedir.job_dir(root, job["token"]) / ".portal"
        proc = None
        if not meta.is_dir() or (meta / "end.json").exists():
            pass
        elif (why := refusal(ask, machine)) is not None:  # the machine changed since submit
            finish(meta, base.JobState.REJECTED, "REJECTED", why)
        elif ask.pool in waiting or (grant := place(ask, machine, running)) is None:
            waiting.add(ask.pool)
            continue
        else:
            uids = state.setdefault("uids", {})
            proc = start(
                job["id"], job["token"], ask, grant, uids, config=config, sandbox_config=sandbox_config
            )
        state["queue"].remove(job)
        if proc is not None:
            _running(state, job, proc)


def _running(state: dict[str, Any], job: dict[str, Any], proc: dict[str, Any]) -> None:
    held = {key: proc[key] for key in ("gpus", "mig") if key in proc}  # what allocation.place gave
    state["running"][job["id"]] = {**job, **held, "started_at": proc["started_at"]}


def start(
    backend_id: str,
    token: str,
    ask: Ask,
    grant: dict[str, list],
    uids: dict[str, int],
    *,
    config: ClusterConfig,
    sandbox_config: sandbox.SandboxConfig,
) -> dict[str, Any] | None:
    """Under the lock: start the job's wrapper on its devices (`grant`: allocation.place), in
    the sandbox where one can be made."""
    job_dir = statedir.job_dir(statedir.state_root(config), token)
    meta = job_dir / ".portal"
    record = read_json(meta / "job.json")
    try:
        plan = launch.launch(
            backend_id=backend_id,
            token=token,
            record=record,
            devices_env=device_env(ask, grant),
            job_dir=job_dir,
            scratch_dir=statedir.scratch_dir(config, record["account"]) if record.get("account") else None,
            sandbox_config=sandbox_config if launch.probe(sandbox_config).ok else None,
            uids=uids,
        )
    except (OSError, BackendError) as exc:
        finish(meta, base.JobState.FAILED, "LAUNCH_FAILED", f"could not prepare the job: {exc}")
        return None
    write_json(meta / "env.json", plan["env"])  # the job's environment, as it got it
    write_json(meta / "launch.json", plan)
    paths = [meta / "launch.json", job_dir / f"{token}.out", meta / "status"]
    try:
        with open(meta / "wrapper.log", "ab") as log:
            child = subprocess.Popen(  # noqa: S603 - a constant program, paths as arguments
                [sys.executable, "-I", "-S", "-c", launch.WRAPPER, *map(str, paths)],
                cwd=job_dir,
                env={"PATH": os.defpath},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
    except OSError as exc:
        finish(meta, base.JobState.FAILED, "LAUNCH_FAILED", f"could not start the job: {exc}")
        return None
    with _children_lock:
        _children[child.pid] = child
    proc = {"pid": child.pid, "pgid": child.pid, "start_ticks": start_ticks(child.pid)}
    proc |= {"boot_id": boot_id(), "started_at": time.time(), **grant}
    write_json(meta / "proc.json", proc)
    return proc
