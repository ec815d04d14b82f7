"""The allowed moves between job states (docs/architecture.md, job states): one table, and a
move outside it is a bug that raises. The states themselves, and which of them are ends, are
clusters.backends.base's JobState and END_STATES: the one list that jobs and backends share."""

from clusters.backends.base import END_STATES
from clusters.backends.base import JobState as S

__all__ = ["ACTIVE_IN_SCHEDULER", "ALLOWED", "END_STATES", "InvalidTransition", "check_move"]
ACTIVE_IN_SCHEDULER = frozenset({S.SUBMITTING, S.PENDING, S.RUNNING, S.CANCELLING})

_SCHEDULER_ENDS = END_STATES - {S.REJECTED}
ALLOWED: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.SUBMITTING, S.CANCELLED, S.REJECTED}),
    # A short job can be over before the first poll sees it: straight to its end.
    # → QUEUED: the attempt ended PREEMPTED, NODE_FAIL (or FAILED with an exit code to restart
    # on) and the portal queues the job's next attempt (jobs/services/finish.py).
    S.SUBMITTING: frozenset({S.QUEUED, S.PENDING, S.RUNNING, S.CANCELLING, S.REJECTED} | _SCHEDULER_ENDS),
    S.PENDING: frozenset({S.QUEUED, S.RUNNING, S.CANCELLING} | _SCHEDULER_ENDS),
    # RUNNING → PENDING: the scheduler requeued it (preemption with requeue, node failure).
    S.RUNNING: frozenset({S.QUEUED, S.PENDING, S.CANCELLING} | _SCHEDULER_ENDS),
    S.CANCELLING: frozenset(_SCHEDULER_ENDS),
    **{end: frozenset() for end in END_STATES},
}


class InvalidTransition(RuntimeError):
    pass


def check_move(from_state: str, to_state: str) -> None:
    if to_state not in ALLOWED[from_state]:
        raise InvalidTransition(f"a job cannot move from {from_state} to {to_state}")
