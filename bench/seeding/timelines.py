"""The jobs of a seeded site (bench/seeding/site.py): what each job asked for, its timeline of state
moves, and what it left on its grant's ledger, drawn from a seeded random generator.

Every timeline is a path through jobs.states.ALLOWED (checked by check_paths before a seed), at
the times the real flow would take: admission and dispatch within seconds, a wait in the
scheduler's queue, a run no longer than the walltime. A job's GPU-hours are computed as
job_finish computes them, and its reservation as job_submit does, so that the grants built
from these sums agree with what the services would have written."""

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal

from django.conf import settings

from jobs.models import JobState as S
from jobs.states import check_move

HISTORY_DAYS = 90
# Slurm hands out job ids up to MaxJobId (67,043,328 by default): ids from here on are never
# the testbed's own, so a seeded job can never be mistaken for, or cancel, a real one.
FAKE_BACKEND_ID_BASE = 90_000_000
WALLTIMES_MIN = (30, 60, 120, 240, 480, 720, 1440)
HOURS_4 = Decimal("0.0001")
HOURS_2 = Decimal("0.01")

_RUN = (S.SUBMITTING, S.PENDING, S.RUNNING)
# kind: (weight, states after QUEUED, exit code). Most jobs take the whole way to an end.
FINISHED_KINDS: dict[str, tuple[float, tuple[str, ...], int | None]] = {
    "completed": (73, (*_RUN, S.COMPLETED), 0),
    "failed": (9, (*_RUN, S.FAILED), 1),
    "timeout": (4, (*_RUN, S.TIMEOUT), None),
    "oom": (2, (*_RUN, S.OUT_OF_MEMORY), 137),
    "node_fail": (0.5, (*_RUN, S.NODE_FAIL), None),
    "preempted": (0.5, (*_RUN, S.PREEMPTED), None),
    "lost": (1, (*_RUN, S.LOST), None),
    "cancel_running": (6, (*_RUN, S.CANCELLING, S.CANCELLED), None),
    "cancel_pending": (2, (S.SUBMITTING, S.PENDING, S.CANCELLING, S.CANCELLED), None),
    "cancel_queued": (1, (S.CANCELLED,), None),
    "rejected": (1, (S.SUBMITTING, S.REJECTED), None),
}
ACTIVE_KINDS: dict[str, tuple[float, tuple[str, ...]]] = {
    "pending": (35, (S.SUBMITTING, S.PENDING)),
    "running": (65, _RUN),
}
# The end's reason and raw state as the Slurm poll reports them.
END_DETAIL = {
    S.COMPLETED: ("", "COMPLETED"),
    S.FAILED: ("NonZeroExitCode", "FAILED"),
    S.TIMEOUT: ("TimeLimit", "TIMEOUT"),
    S.OUT_OF_MEMORY: ("OutOfMemory", "OUT_OF_MEMORY"),
    S.NODE_FAIL: ("NodeDown", "NODE_FAIL"),
    S.PREEMPTED: ("", "PREEMPTED"),
    S.LOST: ("unknown to the scheduler", ""),
    S.REJECTED: ("sbatch: error: Batch job submission failed: Invalid account or partition", ""),
}
# The share of the walltime a run takes, by how it ends.
RUN_SHARE = {
    S.COMPLETED: (0.05, 0.95),
    S.FAILED: (0.001, 0.5),
    S.OUT_OF_MEMORY: (0.01, 0.6),
    S.NODE_FAIL: (0.01, 0.9),
    S.PREEMPTED: (0.01, 0.9),
    S.LOST: (0.01, 0.9),
    S.CANCELLING: (0.01, 0.8),
}
SCRIPTS = {
    "ai-training": "torchrun --nproc_per_node=$SLURM_GPUS_ON_NODE train.py --config configs/run-{n}.yaml",
    "molecular-dynamics": "gmx mdrun -deffnm run-{n} -nb gpu -pme gpu",
    "cfd": "simpleFoam -parallel -case case-{n}",
}
NAME_PREFIX = {"ai-training": "train", "molecular-dynamics": "md", "cfd": "cfd"}


def check_paths() -> None:
    """Every seeded path is one the state table allows: a changed table fails the seed, not
    the API that later reads the events."""
    paths = [path for _w, path, _c in FINISHED_KINDS.values()] + [p for _w, p in ACTIVE_KINDS.values()]
    for path in paths:
        before = S.QUEUED
        for state in path:
            check_move(before, state)
            before = state


def reserved_hours(gpus: int, walltime_minutes: int) -> Decimal:
    """What job_submit reserves: GPUs × walltime, rounded up to the hundredth."""
    return (Decimal(gpus * walltime_minutes) / 60).quantize(HOURS_2, ROUND_CEILING)


def used_hours(gpus: int, started: datetime | None, finished: datetime) -> Decimal:
    """What job_finish charges: elapsed × GPUs, to the ten-thousandth (0 if it never started)."""
    if started is None:
        return Decimal(0)
    elapsed_h = Decimal(max(0.0, (finished - started).total_seconds()) / 3600)
    return (elapsed_h * gpus).quantize(HOURS_4)


@dataclass
class Timeline:
    """A job's moves as (state, at, reason, raw_state), QUEUED first, and what it records."""

    moves: list[tuple[str, datetime, str, str]] = field(default_factory=list)
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    cancelled_from: str = ""  # the state a cancel found the job in ("" if not cancelled)
    # What the last poll said without a move (a PENDING job's "Priority"), as the poll
    # (jobs.services.poll.jobs_apply_statuses) keeps it on the job and not in an event.
    polled: tuple[str, str] | None = None

    @property
    def created(self) -> datetime:
        return self.moves[0][1]

    @property
    def state(self) -> str:
        return self.moves[-1][0]

    @property
    def reason(self) -> str:
        return self.polled[0] if self.polled else self.moves[-1][2]

    @property
    def raw_state(self) -> str:
        if self.polled:
            return self.polled[1]
        # job_move keeps the last raw state when a move brings none
        return next((raw for *_rest, raw in reversed(self.moves) if raw), "")


def _offsets(path: tuple[str, ...], walltime_s: int, rng: random.Random, canceller: str) -> list:
    """(state, seconds after submission, reason, raw_state) for each state of the path."""
    t, before, moves = 0.0, S.QUEUED, [(S.QUEUED, 0.0, "submitted", "")]
    started = None
    for state in path:
        if state == S.SUBMITTING:
            t += rng.uniform(0.05, 2.0)  # admitted at once, picked up by a worker
            moves.append((state, t, "", ""))
        elif state == S.PENDING:
            t += rng.uniform(0.3, 3.0)  # sbatch over SSH; the dispatcher's move, no raw state
            moves.append((state, t, "submitted", ""))
        elif state == S.RUNNING:
            t += min(rng.expovariate(1 / 1200), 2 * 86400)  # the scheduler's queue
            started = t
            moves.append((state, t, "", "RUNNING"))
        elif state == S.CANCELLING:
            low, high = RUN_SHARE[S.CANCELLING]
            t += walltime_s * rng.uniform(low, high) if before == S.RUNNING else rng.uniform(5, 3600)
            moves.append((state, t, f"cancelled by {canceller}", ""))
        elif state == S.CANCELLED:
            if before == S.QUEUED:  # cancelled while waiting for quota or capacity
                t += rng.uniform(10, 3600)
                moves.append((state, t, f"cancelled by {canceller}", ""))
            else:
                t += rng.uniform(2, 30)
                moves.append((state, t, "", "CANCELLED by 1000"))
        elif state == S.REJECTED:
            t += rng.uniform(0.3, 3.0)
            moves.append((state, t, *END_DETAIL[state]))
        else:  # a scheduler end after RUNNING
            if state == S.TIMEOUT:
                t = started + walltime_s
            else:
                low, high = RUN_SHARE[state]
                t += walltime_s * rng.uniform(low, high)
                if state == S.LOST:
                    t += settings.JOB_LOST_GRACE_S  # the poll waits this long before LOST
            moves.append((state, t, *END_DETAIL[state]))
        before = state
    return moves


def _timeline(moves: list, created: datetime, exit_code: int | None) -> Timeline:
    timeline = Timeline(exit_code=exit_code)
    for i, (state, offset, reason, raw) in enumerate(moves):
        at = created + timedelta(seconds=offset)
        timeline.moves.append((state, at, reason, raw))
        if state == S.PENDING and timeline.submitted_at is None:
            timeline.submitted_at = at
        elif state == S.RUNNING:
            timeline.started_at = at
        if state == S.CANCELLING or (state == S.CANCELLED and moves[i - 1][0] == S.QUEUED):
            timeline.cancelled_from = moves[i - 1][0]
    if timeline.state not in (S.PENDING, S.RUNNING):
        timeline.finished_at = timeline.moves[-1][1]
    return timeline


def finished_timeline(
    kind: str, *, walltime_minutes: int, now: datetime, rng: random.Random, canceller: str
) -> Timeline:
    """An ended job, submitted within the last HISTORY_DAYS and over at least a minute ago."""
    _weight, path, exit_code = FINISHED_KINDS[kind]
    if exit_code == 1:
        exit_code = rng.choice((1, 1, 1, 2, 127, 139))
    moves = _offsets(path, walltime_minutes * 60, rng, canceller)
    span = moves[-1][1]
    window = max(0.0, HISTORY_DAYS * 86400 - span - 60)
    created = now - timedelta(seconds=60 + span + rng.uniform(0, window))
    return _timeline(moves, created, exit_code)


def active_timeline(kind: str, *, walltime_minutes: int, now: datetime, rng: random.Random) -> Timeline:
    """A PENDING job submitted in the last hours, or a RUNNING one within its walltime."""
    _weight, path = ACTIVE_KINDS[kind]
    moves = _offsets(path, walltime_minutes * 60, rng, canceller="")
    if kind == "running":
        ran = rng.uniform(60, walltime_minutes * 60 * 0.9)
        return _timeline(moves, now - timedelta(seconds=moves[-1][1] + ran), None)
    waited = rng.uniform(60, 6 * 3600)
    timeline = _timeline(moves, now - timedelta(seconds=moves[-1][1] + waited), None)
    timeline.polled = (rng.choice(("Priority", "Resources")), "PENDING")
    return timeline


def job_shapes(gpus_per_node: int, nodes: int) -> list[tuple[int, int, float]]:
    """(GPUs, nodes, weight) that fit the partition: mostly one node, a few spanning two."""
    shapes = {(1, 1): 45.0}
    if gpus_per_node >= 2:
        shapes[(2, 1)] = 25.0
    if gpus_per_node > 2:
        shapes[(gpus_per_node, 1)] = 20.0
    if nodes >= 2:
        shapes[(gpus_per_node * 2, 2)] = 10.0
    return [(gpus, n, weight) for (gpus, n), weight in shapes.items()]


def node_list(nodes: int) -> str:
    return "gpu-n001" if nodes == 1 else f"gpu-n[001-{nodes:03d}]"


def script_for(scenario_slug: str, n: int) -> str:
    command = SCRIPTS.get(scenario_slug, "./run.sh {n}").format(n=n)
    return f"#!/bin/bash\nset -euo pipefail\nsrun {command}\n"


def name_for(scenario_slug: str, n: int) -> str:
    return f"{NAME_PREFIX.get(scenario_slug, 'job')}-{n:06d}"
