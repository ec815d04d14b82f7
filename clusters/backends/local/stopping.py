"""Ending local jobs: the reason recorded first (.portal/ended_by), then signals to the job's process
group, only while its leader is the job's wrapper (records.alive), so never to a reused pgid."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from clusters.backends.local import statedir
from clusters.backends.local.processes import reap
from clusters.backends.local.records import alive, read_json

_KILL_WAIT_S = 3.0


def mark(meta: Path, cause: str) -> None:
    # Written before any signal, so that a worker dying mid-kill still leaves the reason behind.
    if not (meta / "ended_by").exists():
        (meta / "ended_by").write_text(cause)


def mark_overdue(state: dict[str, Any], *, root: Path, minute_s: float) -> list[dict[str, Any]]:
    """Under the lock: the process records of running jobs past their walltime, each marked "timeout"."""
    overdue = []
    for job in state["running"].values():
        if job["walltime"] > 0 and time.time() - job["started_at"] > job["walltime"] * minute_s:
            meta = statedir.job_dir(root, job["token"]) / ".portal"
            mark(meta, "timeout")
            overdue.append(read_json(meta / "proc.json"))
    return [proc for proc in overdue if proc is not None]


def terminate(procs: list[dict[str, Any]], *, grace_s: float) -> None:
    """SIGTERM each job's process group, SIGKILL those still there after grace_s; bounded."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, _KILL_WAIT_S)):
        live = [proc for proc in procs if alive(proc)]
        for proc in live:
            # Only while its leader is ours (checked just above), so never a reused pgid.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc["pgid"], sig)
        deadline = time.monotonic() + wait_s
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            reap()
            live = [proc for proc in live if alive(proc)]
        if not live:
            return


def warn_group(proc: dict[str, Any] | None) -> None:
    """SIGTERM to the job's process group, now. Only while its leader is ours, so never a reused
    pgid. The wrapper and bwrap ignore SIGTERM (launch.py): it reaches the job's own processes alone."""
    if proc is not None and alive(proc):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc["pgid"], signal.SIGTERM)
