"""Submitting to the local cluster: the spec checked, then the job's directory and queue entry made."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from clusters.backends.base import BackendError, JobSpec
from clusters.backends.local import cleanup, launch, statedir
from clusters.backends.local.allocation import Ask, refusal
from clusters.backends.local.devices import Machine
from clusters.backends.local.records import write_json

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_spec(spec: JobSpec, machine: Machine) -> Ask:
    """The share the job asks for; BackendError, saying why, for a spec this cluster refuses: more
    than one node, a share this machine can never give, a bad token, account, checkpoint key,
    attempt or environment variable."""
    if spec.nodes != 1:
        raise BackendError("the local cluster has one node")
    ask = Ask.of_spec(spec)
    if (why := refusal(ask, machine)) is not None:
        raise BackendError(why)
    if not statedir.TOKEN.match(spec.token):
        raise BackendError(f"invalid job token {spec.token!r}")
    cleanup.check_account(spec.account)  # it names a directory and, sandboxed as root, a uid
    if spec.checkpoint_key and not launch.CHECKPOINT_KEY.fullmatch(spec.checkpoint_key):
        raise BackendError(
            f"invalid checkpoint key {spec.checkpoint_key[:140]!r}: letters, digits, '_', '.', '-' "
            "only, and no '..'"
        )
    if isinstance(spec.attempt, bool) or not isinstance(spec.attempt, int) or spec.attempt < 1:
        raise BackendError(f"invalid attempt {spec.attempt!r}: a count from 1")
    for name, value in [*spec.env.items(), ("PORTAL_JOB_NAME", spec.name)]:
        if not _ENV_NAME.match(name) or "\0" in value:
            raise BackendError(f"invalid environment variable {name!r}: a bad name, or a NUL in its value")
    return ask


def enqueue(state: dict[str, Any], spec: JobSpec, ask: Ask, *, root: Path) -> str:
    """Under the lock: the job's new id, its directory (script and records) and its place at the
    end of the queue, the state saved."""
    backend_id = f"local-{state['next_id']}"
    state["next_id"] += 1
    tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=root / "jobs"))
    try:
        (tmp / f"{spec.token}.sh").write_text(spec.script)
        (tmp / ".portal").mkdir()
        record = {"id": backend_id, "token": spec.token, "name": spec.name, "env": dict(spec.env)}
        record |= {"account": spec.account, "attempt": spec.attempt}
        record["checkpoint_key"] = spec.checkpoint_key
        state["accounts"] = sorted({*state["accounts"], spec.account})
        write_json(tmp / ".portal" / "job.json", {**record, "submitted_at": time.time()})
        (root / "ids" / backend_id).write_text(spec.token)
        state["queue"].append(
            dict(
                id=backend_id,
                token=spec.token,
                **ask.record(),
                walltime=spec.walltime_minutes,
                account=spec.account,
            )
        )
        # Saved before the directory appears: a crash in between leaves a queue entry with no
        # directory (dropped later; find() says None, so the portal submits again), never a
        # directory that find() reports but that no queue holds.
        statedir.save(root, state)
        os.rename(tmp, statedir.job_dir(root, spec.token))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return backend_id
