"""The local cluster's state directory: where a job's files are, and the allocation file and its lock.

alloc.json, alloc.lock   devices in use and the FIFO queue; changed only under flock(alloc.lock)
ids/<backend id>         the job's token, so that poll and cancel find its directory
jobs/<token>/            the job's cwd: <token>.sh, <token>.out, and .portal/ with our records
scratch/<account>/       the tenant's jobs' shared scratch, unless scratch_root is absolute
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clusters.backends import base
from clusters.backends.base import BackendError, ClusterConfig
from clusters.backends.local.records import read_json, write_json

TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # a directory and file name: no "/", no ".."
_BACKEND_ID = re.compile(r"^local-[0-9]{1,18}$")
_LOCK_TIMEOUT_S = 30.0


def state_root(config: ClusterConfig) -> Path:
    if not config.state_dir:
        raise BackendError("the local cluster has no state_dir")
    return Path(config.state_dir)


def job_dir(root: Path, token: str) -> Path:
    return root / "jobs" / token


def token_of(root: Path, backend_id: str) -> str | None:
    if not _BACKEND_ID.match(backend_id):
        return None
    try:
        token = (root / "ids" / backend_id).read_text()
    except FileNotFoundError:
        return None
    return token if TOKEN.match(token) and job_dir(root, token).is_dir() else None


def scratch_dir(config: ClusterConfig, account: str) -> Path:
    """<scratch root>/<account>: the cluster's scratch_root if absolute, else under state_dir."""
    configured = config.scratch_root
    base_dir = (
        Path(configured) if configured.startswith("/") else state_root(config) / (configured or "scratch")
    )
    return base_dir / account


@contextlib.contextmanager
def locked(root: Path) -> Iterator[dict[str, Any]]:
    """The allocation state, saved on a normal exit. flock, not a thread lock: two workers (or
    two threads) submitting at once must not both take the same free GPU."""
    try:
        for sub in ("jobs", "ids"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        fd = os.open(root / "alloc.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise base.BackendUnavailable(f"local cluster state directory: {exc}") from exc
    try:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise base.BackendUnavailable("the allocation file stayed locked") from None
                time.sleep(0.01)
        state = read_json(root / "alloc.json") or {"next_id": 1, "running": {}, "queue": []}
        yield state
        save(root, state)
    finally:
        os.close(fd)  # also releases the flock


def save(root: Path, state: dict[str, Any]) -> None:
    write_json(root / "alloc.json", state)
