"""A cluster's circuit breaker and worker slots, held in the cache so that every worker process
(and every machine on the same Redis) sees the same (docs/architecture/cluster-stall.md).

Breaker: CLUSTER_BREAKER_FAILURES consecutive failures to reach a cluster open it for a
cool-off that doubles with each failed probe, up to CLUSTER_BREAKER_COOLOFF_MAX_S. While it is
open and cooling, dispatch, poll, sync, cancel and log reads skip the cluster at once; once the
cool-off is over, one caller (the probe lock) asks the backend's health(), and its answer
closes the breaker or opens it again for longer. Any answer from the cluster closes it.

Slots: at most CLUSTER_WORKER_SLOTS dispatches and polls of one cluster hold a worker at the
same time, so that a cluster that hangs takes that many workers before its breaker opens, never
all of them.

The cache is the right home: the state is short-lived, written on every failure, and losing it
(a flushed Redis) costs at most N more failed attempts. Redis makes add() and incr() atomic;
the embedded file cache does not, so there two processes may both probe or both take a last
slot: an extra call, never a lost job.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from clusters.backends.base import BackendUnavailable

HOST = socket.gethostname()  # a slot's owner: host, pid and a nonce

# Why a job waits while its cluster's breaker is open (Job.reason).
REASON_UNAVAILABLE = "cluster_unavailable"


class ClusterBusy(BackendUnavailable):
    """Every worker slot of the cluster is taken: try again shortly. Not a failure of the cluster."""


class ClusterUnavailable(BackendUnavailable):
    """The cluster's breaker is open: nothing was sent to it."""


@dataclass(frozen=True)
class BreakerState:
    failures: int  # consecutive, since the last answer
    open_until: float  # epoch seconds; 0: closed
    level: int  # failed probes since it opened: the cool-off is base × 2^level
    detail: str

    @property
    def open(self) -> bool:
        return self.open_until > 0

    @property
    def cooling(self) -> bool:
        """Open and its cool-off not over: skip the cluster without contact."""
        return self.open_until > time.time()


_CLOSED = BreakerState(failures=0, open_until=0.0, level=0, detail="")


def cache_key(cluster_id: int, part: str) -> str:
    return f"cluster-breaker:{cluster_id}:{part}"


def _keep_s() -> int:
    # The state outlives the longest cool-off, so that a reopened breaker remembers its level.
    return 2 * settings.CLUSTER_BREAKER_COOLOFF_MAX_S + 3600


def breaker_state(*, cluster_id: int) -> BreakerState:
    """The breaker of one cluster as the cache holds it."""
    values = cache.get_many([cache_key(cluster_id, "failures"), cache_key(cluster_id, "open")])
    opened = values.get(cache_key(cluster_id, "open"))
    failures = int(values.get(cache_key(cluster_id, "failures")) or 0)
    if not opened:
        return BreakerState(failures=failures, open_until=0.0, level=0, detail="")
    return BreakerState(failures=failures, **opened)


def breakers_cooling(*, cluster_ids: set[int]) -> set[int]:
    """Of these clusters, those whose breaker is open and cooling: one cache read for all."""
    keys = {cache_key(pk, "open"): pk for pk in cluster_ids}
    now = time.time()
    return {keys[key] for key, value in cache.get_many(list(keys)).items() if value["open_until"] > now}


def breaker_failure(*, cluster_id: int, detail: str) -> BreakerState:
    """One more failure to reach the cluster: opens the breaker at the threshold, and a failure
    while open (the probe's) opens it again with the cool-off doubled."""
    key = cache_key(cluster_id, "failures")
    cache.add(key, 0, timeout=_keep_s())
    try:
        failures = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, failures := 1, timeout=_keep_s())
    state = breaker_state(cluster_id=cluster_id)
    if state.open:
        if state.cooling:
            return state  # a call that began before it opened: the cool-off stands
        level = state.level + 1
    elif failures >= settings.CLUSTER_BREAKER_FAILURES:
        level = 0
    else:
        return state
    cooloff_s = min(settings.CLUSTER_BREAKER_COOLOFF_S * 2**level, settings.CLUSTER_BREAKER_COOLOFF_MAX_S)
    opened = {"open_until": time.time() + cooloff_s, "level": level, "detail": detail[:500]}
    cache.set(cache_key(cluster_id, "open"), opened, timeout=_keep_s())
    return BreakerState(failures=failures, **opened)


def breaker_success(*, cluster_id: int, known: BreakerState | None = None) -> bool:
    """The cluster answered: the breaker closes. True when it was open (the caller tells the
    jobs that wait). `known`: a state the caller read just before, which saves the read when closed."""
    state = known if known is not None else breaker_state(cluster_id=cluster_id)
    if state.failures == 0 and not state.open:
        return False
    cache.delete_many(
        [cache_key(cluster_id, "failures"), cache_key(cluster_id, "open"), cache_key(cluster_id, "probe")]
    )
    return state.open


def breaker_probe_claim(*, cluster_id: int, hold_s: float) -> bool:
    """The one half-open probe after a cool-off: True for the caller that may ask the cluster."""
    return cache.add(cache_key(cluster_id, "probe"), 1, timeout=max(1, int(hold_s)))


def breaker_probe_release(*, cluster_id: int) -> None:
    cache.delete(cache_key(cluster_id, "probe"))


@contextmanager
def cluster_slot(*, cluster_id: int, hold_s: float) -> Iterator[bool]:
    """One of the cluster's CLUSTER_WORKER_SLOTS for a dispatch or a poll: yields whether one
    was free. A slot outlives a worker killed while holding it by hold_s at most, which the
    caller sets to its task's hard limit; sooner when the killed worker ran on this machine: a
    slot whose owner's process is gone here is taken back (an OOM-killed worker must not hold
    the cluster's dispatch for minutes)."""
    owner = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex}"
    keys = [cache_key(cluster_id, f"slot{number}") for number in range(settings.CLUSTER_WORKER_SLOTS)]
    timeout = max(1, int(hold_s))
    taken = next((key for key in keys if cache.add(key, owner, timeout=timeout)), None)
    if taken is None and _reclaim_dead(keys):
        taken = next((key for key in keys if cache.add(key, owner, timeout=timeout)), None)
    try:
        yield taken is not None
    finally:
        # Only ours: past hold_s another caller may hold the same slot.
        if taken is not None and cache.get(taken) == owner:
            cache.delete(taken)


def _reclaim_dead(keys: list[str]) -> bool:
    """Free the slots held by a process of this machine that no longer exists; whether any was.
    (Between the read and the delete the slot may change hands: then one extra call, as with the
    file cache, never a lost job.)"""
    freed = False
    for key in keys:
        holder = cache.get(key)
        host, _sep, rest = str(holder or "").partition(":")
        pid = rest.partition(":")[0]
        if host == HOST and pid.isdigit() and not _alive(int(pid)) and cache.get(key) == holder:
            cache.delete(key)
            freed = True
    return freed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
