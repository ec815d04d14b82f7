"""A local job's output, jobs/<token>/<token>.out, read from its end, never through a link."""

from __future__ import annotations

import os

from clusters.backends import base
from clusters.backends.base import ClusterConfig, JobRef, LogTail
from clusters.backends.local import statedir


def log_tail(config: ClusterConfig, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
    """The last `lines` lines of the job's output, reading at most `max_bytes` from its end; a
    line cut by that bound is dropped. `truncated`: earlier output exists."""
    if not statedir.TOKEN.match(job.token) or lines <= 0 or max_bytes <= 0:
        return LogTail(lines=[], truncated=False)
    try:  # O_NOFOLLOW: a link there, however it came, is never followed by the portal
        path = statedir.job_dir(statedir.state_root(config), job.token) / f"{job.token}.out"
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(size - start)  # the job may still be writing: never read past the bound
    except FileNotFoundError:
        return LogTail(lines=[], truncated=False)
    except OSError as exc:  # a state directory gone bad (not a directory, unreadable, I/O error)
        raise base.BackendUnavailable(
            f"the output of {job.backend_id} cannot be read: {exc.strerror}"
        ) from None
    truncated = start > 0
    if truncated and b"\n" in data[:-1]:
        data = data[data.index(b"\n") + 1 :]
    text = data.decode(errors="replace").splitlines()
    if len(text) > lines:
        truncated, text = True, text[-lines:]
    return LogTail(lines=text, truncated=truncated)
