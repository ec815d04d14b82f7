"""The event streams over real HTTP: an ASGI server (uvicorn on portal.asgi) on the test
database, and a reader of Server-Sent Events that stops after what it was asked for."""

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import ROOT, VENV_BIN, database_url_of_test_db, die_with_parent, free_port, stop


@contextmanager
def asgi_server(log_path: Path, **env: str) -> Iterator[str]:
    """uvicorn serving the portal on loopback, sharing the test database; yields its base URL."""
    from django.conf import settings

    port = free_port()
    environ = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url_of_test_db(),
        "REDIS_URL": settings.REDIS_URL,
        **env,
    }
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(VENV_BIN / "uvicorn"), "portal.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--no-access-log", "--timeout-graceful-shutdown", "1"],
            cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{base}/healthz", timeout=1)
            break
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"uvicorn did not start:\n{log_path.read_text()[-3000:]}") from None
            time.sleep(0.2)
    try:
        yield base
    finally:
        stop(proc)


@dataclass
class Event:
    event: str
    id: str | None
    data: dict


def read_events(lines: Iterator[str], *, count: int, timeout_s: float, until: str = "") -> list[Event]:
    """Up to `count` events (comments skipped) from an SSE body's lines, or those that came in
    `timeout_s`, or up to the first of type `until`."""
    events, fields, deadline = [], {}, time.monotonic() + timeout_s
    for line in lines:
        if line == "":
            if "data" in fields:
                events.append(
                    Event(fields.get("event", "message"), fields.get("id"), json.loads(fields["data"]))
                )
                if len(events) >= count or events[-1].event == until:
                    break
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if time.monotonic() > deadline:
            break
    return events
