"""The open loop of bench/load.py: the portal's API over keep-alive HTTP, and requests sent at
Poisson arrival times whatever the earlier ones did, latency counted from the scheduled time
(no coordinated omission)."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor, wait

from bench import peers
from bench.figures import Recorder

DRAIN_S = 60.0  # after a phase's last arrival, how long its requests may still take


class ApiError(RuntimeError):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"HTTP {status} {code}".strip())


class Portal:
    """The portal's API over keep-alive HTTP (gunicorn's sync workers close after each answer)."""

    def __init__(self, base_url: str) -> None:
        self.http = peers.LoopbackHttp(base_url, timeout_s=60)

    def call(self, method: str, path: str, token: str, body: dict | None = None, key: str = ""):
        headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if key:
            headers["Idempotency-Key"] = key
        status, raw = self.http.request(method, path, headers, data)
        if status >= 400:
            try:
                code = json.loads(raw).get("code", "")
            except (ValueError, AttributeError):
                code = ""
            raise ApiError(status, code)
        return json.loads(raw) if raw else None


def run_open_loop(phase: str, streams: list[tuple], duration_s: float, senders: int, rec):
    """Send each stream's requests at Poisson arrival times for duration_s. A stream is (rate,
    pick), or (rate, pick, from_s, to_s) to send only in that part of the phase. Its pick() runs
    in a sender thread and returns (endpoint, call); call() raises on failure. Each stream has
    its own senders, so that a peer's requests never queue behind a saturated portal's."""
    rng = random.Random(f"{phase}-{duration_s}")  # noqa: S311  (arrival times, not secrets)
    plan = []
    for index, (rate, _, *window) in enumerate(streams):
        begin, end = window or (0.0, duration_s)
        t = begin + rng.expovariate(rate)
        while t < min(end, duration_s):
            plan.append((t, index))
            t += rng.expovariate(rate)
    plan.sort()
    pools = [
        ThreadPoolExecutor(max_workers=senders, thread_name_prefix=f"{phase}{i}") for i in range(len(streams))
    ]
    start = time.monotonic() + 0.1
    rec.started[phase] = start
    futures = []
    for offset, index in plan:
        delay = start + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        rec.loop_late(phase, max(0.0, -delay))
        futures.append(pools[index].submit(_send, phase, streams[index][1], start + offset, rec))
    _, late = wait(futures, timeout=DRAIN_S)
    for pool in pools:  # what has not even left by now never will: the next phase starts clean
        pool.shutdown(wait=True, cancel_futures=True)
    for _ in range(sum(1 for future in late if future.cancelled())):
        rec.add(phase, "(never sent: the senders were all busy)", DRAIN_S, "never sent")


def _send(phase: str, pick, due: float, rec: Recorder) -> None:
    wait_s = time.monotonic() - due
    endpoint, call = pick()
    error = ""
    try:
        call()
    except Exception as exc:  # every failure is a figure of the run, not a reason to stop it
        error = str(exc)[:60] if isinstance(exc, ApiError) else type(exc).__name__
    rec.add(phase, endpoint, time.monotonic() - due, error, wait_s, due)
