"""Job statuses: squeue's live word and sacct's record of each job, merged (SlurmBackend.poll)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusters.backends import base
from clusters.backends.base import JobStatus
from clusters.backends.slurm import ssh
from clusters.backends.slurm.parse import (
    NO_VALUE,
    SLURM_END_STATES,
    check_job_id,
    portal_state,
    sacct_exit_code,
    slurm_time,
    split_rows,
    wait_status_exit_code,
)

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend

# Ids per squeue and per sacct: 10,000 ids of 8 digits make a command line of 90 kB, below the
# 128 kB that Linux allows the one argument (`$SHELL -c <command>`) through which sshd runs it.
POLL_CHUNK = 10_000
# squeue and sacct print times in the login node's local zone, without an offset: run them in UTC.
UTC_ENV = ["env", "TZ=UTC"]
SQUEUE_FIELDS = "JobID:|,State:|,Reason:|,NodeList:|,StartTime:|,EndTime:|,exit_code:|"
SACCT_FIELDS = "JobID,State,ExitCode,Start,End,NodeList,Reason"


@dataclass(frozen=True)
class _Record:
    raw_state: str
    reason: str
    node_list: str
    start: str
    end: str
    exit_code: int | None


def poll(backend: SlurmBackend, backend_ids: list[str]) -> dict[str, JobStatus]:
    """One squeue and one sacct per POLL_CHUNK ids (two calls up to 10,000 jobs). squeue has
    the live state and the pending reason; sacct has jobs slurmctld forgot, exit codes and times."""
    ids = sorted({check_job_id(backend_id) for backend_id in backend_ids}, key=int)
    chunks = [",".join(ids[start : start + POLL_CHUNK]) for start in range(0, len(ids), POLL_CHUNK)]
    live: dict[str, _Record] = {}
    accounted: dict[str, _Record] = {}
    for chunk in chunks:
        live.update(_squeue(backend, chunk))
    for chunk in chunks:
        accounted.update(_sacct(backend, chunk))
    statuses: dict[str, JobStatus] = {}
    for job_id in ids:
        status = _merge(job_id, live.get(job_id), accounted.get(job_id))
        if status is not None:
            statuses[job_id] = status
    return statuses


def _squeue(backend: SlurmBackend, ids: str) -> dict[str, _Record]:
    result = backend.run([*UTC_ENV, "squeue", "-h", "-t", "all", "-j", ids, "-O", SQUEUE_FIELDS])
    if result.rc != 0:
        if "Invalid job id specified" in result.stderr:
            return {}  # none of the ids is known to slurmctld any more
        raise ssh.failure(result)
    records = {}
    for job_id, state, reason, nodes, start, end, code, *_rest in split_rows(result.stdout, 8):
        records[job_id] = _Record(state, reason, nodes, start, end, wait_status_exit_code(code))
    return records


def _sacct(backend: SlurmBackend, ids: str) -> dict[str, _Record]:
    stdout = backend.check([*UTC_ENV, "sacct", "-X", "-P", "-n", "-j", ids, "-o", SACCT_FIELDS])
    records = {}
    for job_id, state, code, start, end, nodes, reason in split_rows(stdout, 7):
        records[job_id] = _Record(state, reason, nodes, start, end, sacct_exit_code(code))
    return records


def _merge(job_id: str, live: _Record | None, accounted: _Record | None) -> JobStatus | None:
    """slurmctld leads and slurmdbd follows: squeue's word wins while it knows the job, and
    sacct fills in what squeue lacks. sacct alone once slurmctld has forgotten the job."""
    if live is None and accounted is None:
        return None
    if live is None or (accounted is not None and _ended(live) and _ended(accounted)):
        record, reason = accounted, (live or accounted).reason  # type: ignore[union-attr]
    else:
        record, reason = live, live.reason
    assert record is not None
    raw_state = record.raw_state.strip()
    started = slurm_time(record.start)
    state = portal_state(raw_state, started is not None)
    running = state not in (base.JobState.PENDING,)
    ended = state in base.END_STATES
    return JobStatus(
        backend_id=job_id,
        state=state,
        raw_state=raw_state,
        reason="" if reason.strip() in NO_VALUE else reason.strip(),
        exit_code=record.exit_code if ended else None,
        started_at=started if running else None,  # squeue's start of a pending job is a guess
        finished_at=slurm_time(record.end) if ended else None,
        node_list="" if record.node_list.strip() in NO_VALUE else record.node_list.strip(),
    )


def _ended(record: _Record) -> bool:
    words = record.raw_state.split()
    return bool(words) and words[0].rstrip("+") in SLURM_END_STATES
