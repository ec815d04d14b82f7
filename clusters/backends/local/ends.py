"""How a local job ended, and its status: read from its records, never by asking a process.

.portal/ended_by says why we killed it (or warned it: then it ends PREEMPTED, however it exits);
.portal/end.json is the final record, written once, under the lock, by whoever first sees the end.
"""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clusters.backends import base
from clusters.backends.base import JobStatus
from clusters.backends.local.records import alive, read_json, write_json

_KILLED_BY = {
    "cancelled": (base.JobState.CANCELLED, "CANCELLED", "cancelled"),
    "timeout": (base.JobState.TIMEOUT, "TIMEOUT", "walltime reached"),
    "preempted": (base.JobState.PREEMPTED, "PREEMPTED", "warned of preemption"),
}


def finish(meta: Path, state: str, raw: str, reason: str, exit_code: int | None = None, **times: Any) -> dict:
    end = {"state": state, "raw_state": raw, "reason": reason, "exit_code": exit_code}
    end |= {"started_at": None, "finished_at": time.time(), **times}
    write_json(meta / "end.json", end)
    return end


def _dt(timestamp: float | None) -> datetime | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, tz=UTC)


def end_record(meta: Path) -> dict[str, Any] | None:
    """The final record of a started job, written the first time it is seen ended; None while
    its wrapper runs."""
    if (end := read_json(meta / "end.json")) is not None:
        return end
    proc = read_json(meta / "proc.json")
    if proc is None:
        return finish(meta, base.JobState.FAILED, "LOST", "no process record: the worker died starting it")
    if alive(proc):
        return None
    try:  # read after the liveness check: the wrapper writes it before it exits
        exit_code = int((meta / "status").read_text())
        finished_at = (meta / "status").stat().st_mtime
    except (FileNotFoundError, ValueError):
        exit_code, finished_at = None, time.time()
    try:
        cause = (meta / "ended_by").read_text()
    except FileNotFoundError:
        cause = ""
    if cause in _KILLED_BY:
        state, raw, reason = _KILLED_BY[cause]
    elif exit_code == 0:
        state, raw, reason = base.JobState.COMPLETED, "COMPLETED", ""
    elif exit_code is not None:
        state, raw, reason = base.JobState.FAILED, "FAILED", f"exit code {exit_code}"
    else:
        state, raw, reason = (
            base.JobState.FAILED,
            "KILLED",
            "no exit status: killed, or the machine restarted",
        )
    times = {"started_at": proc["started_at"], "finished_at": finished_at}
    return finish(meta, state, raw, reason, exit_code, **times)


def status(backend_id: str, meta: Path, state: dict[str, Any]) -> JobStatus | None:
    """The job's status: its final record once it has ended, else RUNNING or PENDING as the
    allocation state has it; None for a job that the state does not know."""
    node = socket.gethostname()
    if (end := read_json(meta / "end.json")) is not None:
        started, finished = _dt(end.pop("started_at")), _dt(end.pop("finished_at"))
        node = node if started else ""
        return JobStatus(backend_id, **end, started_at=started, finished_at=finished, node_list=node)
    if (job := state["running"].get(backend_id)) is not None:
        started = _dt(job["started_at"])
        return JobStatus(backend_id, base.JobState.RUNNING, "RUNNING", started_at=started, node_list=node)
    if any(job["id"] == backend_id for job in state["queue"]):
        return JobStatus(backend_id, base.JobState.PENDING, "PENDING", reason="Resources")
    return None
