"""Following a job or a tenant through the event streams (docs/api.md, Live events), bounded.

A stream ends on its own after a while (EVENTS_STREAM_MAX_S, 300 s); each loop here reconnects,
the tenant's stream with Last-Event-ID so that nothing is missed, at most `max_reconnects` times
and never past `timeout_s`. A network failure or a 5xx waits the stream's `retry` (2 s) before
the next try; any other refusal (401, 404, 429…) ends the loop with its ApiError.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuportal.answers import END_STATES, Job
from gpuportal.client import Client
from gpuportal.errors import ApiError
from gpuportal.sse import StreamEvent

RETRY_S = 2.0
LOG_WINDOW = 200  # the log stream's first event holds the log's last 200 lines


class WaitTimeout(Exception):
    """The deadline passed first."""


class TooManyReconnects(Exception):
    """The stream was reconnected `max_reconnects` times and ended again."""

    def __init__(self, last_error: ApiError | None):
        self.last_error = last_error
        super().__init__(str(last_error) if last_error else "")


@dataclass
class Budget:
    """The deadline and the reconnects left to a follow loop."""

    timeout_s: float | None
    max_reconnects: int

    def __post_init__(self) -> None:
        self.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        self.reconnects = 0
        self.last_error: ApiError | None = None

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def check(self) -> None:
        left = self.left()
        if left is not None and left <= 0:
            raise WaitTimeout

    def read_timeout(self, default: float) -> float:
        left = self.left()
        return default if left is None else max(0.5, min(default, left + 0.5))

    def again(self, error: ApiError | None) -> None:
        """Before a reconnect: raise if none is left; after a failure wait a little."""
        self.check()
        if error is not None and not (error.status == 0 or error.status >= 500):
            raise error
        self.last_error = error or self.last_error
        if self.reconnects >= self.max_reconnects:
            raise TooManyReconnects(self.last_error)
        self.reconnects += 1
        if error is not None:
            left = self.left()
            time.sleep(RETRY_S if left is None else max(0.0, min(RETRY_S, left)))
            self.check()


def wait_for_end(client: Client, job: Job, budget: Budget, on_state: Callable[[dict[str, Any]], None]) -> Job:
    """The job once it has ended. The tenant's stream is opened first, then the job read, so a
    change between the two is not missed; each job event of this job is passed to `on_state`."""
    job_id, state, last_id = str(job["id"]), job["state"], None
    while True:
        error = None
        try:
            with client.event_stream(
                tenant=job["tenant"], last_event_id=last_id, read_timeout_s=budget.read_timeout(60)
            ) as events:
                current = client.job(job_id)
                if current["state"] != state:
                    on_state(
                        {
                            "job": job_id,
                            "from_state": state,
                            "to_state": current["state"],
                            "reason": current["reason"],
                            "at": "",
                        }
                    )
                    state = current["state"]
                if state in END_STATES:
                    return current
                for event in events:
                    budget.check()
                    if event.event != "job":
                        continue
                    last_id = event.id or last_id
                    if event.data.get("job") != job_id:
                        continue
                    on_state(event.data)
                    state = event.data.get("to_state", state)
                    if state in END_STATES:
                        return client.job(job_id)
        except ApiError as exc:
            error = exc
        budget.again(error)


def new_lines(before: list[str], now: list[str]) -> list[str]:
    """The lines of `now` after those of `before` (two tails of one growing log)."""
    if not before:
        return now
    for overlap in range(min(len(before), len(now)), 0, -1):
        if before[-overlap:] == now[:overlap]:
            return now[overlap:]
    return now


def follow_log(
    client: Client, job_id: str, budget: Budget, on_event: Callable[[StreamEvent, list[str]], None]
) -> dict[str, Any]:
    """Follow the job's log stream until its `end` event, whose data is returned. `on_event` gets
    each event, and for `log` events the lines not shown yet (a reconnect's first event repeats
    the log's tail: what was shown is left out)."""
    shown: list[str] = []
    while True:
        error = None
        try:
            with client.log_stream(job_id, read_timeout_s=budget.read_timeout(60)) as events:
                for event in events:
                    budget.check()
                    if event.event == "log":
                        lines = [str(line) for line in event.data.get("lines", [])]
                        fresh = new_lines(shown, lines) if event.data.get("whole") else lines
                        shown = (shown + fresh)[-LOG_WINDOW:]
                        on_event(event, fresh)
                    elif event.event in ("state", "unavailable"):
                        on_event(event, [])
                    elif event.event == "end":
                        on_event(event, [])
                        return event.data
        except ApiError as exc:
            error = exc
        budget.again(error)


def follow_events(
    client: Client,
    budget: Budget,
    on_event: Callable[[StreamEvent], None],
    *,
    tenant: str | None = None,
    job_id: str | None = None,
    since: str | None = None,
    on_open: Callable[[], None] | None = None,
) -> Job | None:
    """The tenant's (or every visible tenant's) job events, each passed to `on_event`, resumed
    with Last-Event-ID after each reconnect (and from the first, when `since` gives an event id);
    `on_open` is called once the first stream is open.
    With `job_id`, only that job's, until it ends (then the job is returned). Without it, until
    the budget ends it (WaitTimeout, TooManyReconnects)."""
    last_id = since
    while True:
        error = None
        try:
            with client.event_stream(
                tenant=tenant, last_event_id=last_id, read_timeout_s=budget.read_timeout(60)
            ) as events:
                if on_open is not None:
                    on_open()
                    on_open = None
                if job_id is not None:
                    current = client.job(job_id)
                    if current["state"] in END_STATES:
                        return current
                for event in events:
                    budget.check()
                    if event.event not in ("job", "reset"):
                        continue
                    if event.event == "job":
                        last_id = event.id or last_id
                        if job_id is not None and event.data.get("job") != job_id:
                            continue
                    on_event(event)
                    if job_id is not None and event.data.get("to_state") in END_STATES:
                        return client.job(job_id)
        except ApiError as exc:
            error = exc
        budget.again(error)
