"""`make run` as a newcomer meets it: SQLite, no broker server, three real processes."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT, free_port, wait_for_port
from tests.stream_support import read_events


def http(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict | str]:
    assert url.startswith("http://127.0.0.1:")  # loopback only
    data = json.dumps(body).encode() if body else None
    request = urllib.request.Request(url, method=method, data=data)  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Token {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  (loopback only)
            text = response.read().decode()
            return response.status, json.loads(text) if "json" in response.headers["Content-Type"] else text
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode())


@pytest.fixture(scope="module")
def embedded_portal(tmp_path_factory):
    """One portal for the module; the last test stops it with Ctrl-C."""
    tmp_path = tmp_path_factory.mktemp("embedded")
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {"VAR_DIR": str(tmp_path), "PORT": str(port), "WORKER_CONCURRENCY": "1", "WEB_CONCURRENCY": "1"}
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115  (closed below)
    started = time.monotonic()
    proc = subprocess.Popen(
        ["scripts/run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for_port(port, timeout_s=60, proc=proc)
        yield {
            "url": f"http://127.0.0.1:{port}",
            "var": tmp_path,
            "env": env,
            "proc": proc,
            "ready_s": time.monotonic() - started,
        }
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
            proc.wait(timeout=30)
        log.close()


def test_make_run_serves_the_portal_and_a_demo_user_can_use_the_api(embedded_portal):
    url = embedded_portal["url"]
    print(f"embedded portal served /healthz {embedded_portal['ready_s']:.1f}s after start")
    assert embedded_portal["ready_s"] < 60
    assert http("GET", f"{url}/healthz") == (200, {"status": "ok"})
    status, page = http("GET", f"{url}/accounts/login/")
    assert status == 200 and 'name="password"' in page
    ready_status, ready = http("GET", f"{url}/readyz")
    assert ready_status == 200 and ready["checks"] == {"database": "ok", "broker": "ok"}

    logins = json.loads((embedded_portal["var"] / "demo-logins.txt").read_text())
    assert (embedded_portal["var"] / "demo-logins.txt").stat().st_mode & 0o777 == 0o600
    status, created = http(
        "POST", f"{url}/api/v1/auth/token/", {"username": "carol", "password": logins["carol"]}
    )
    assert status == 201
    status, me = http("GET", f"{url}/api/v1/me/", token=created["token"])
    assert status == 200
    assert me["tenants"] == [{"slug": "protein-lab", "name": "Protein Folding Lab", "role": "member"}]
    # The event stream from the same port (ASGI): a job's first event, replayed from the start.
    job = {"tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 1,
           "walltime_minutes": 5, "name": "hello", "script": "#!/bin/bash\necho hi\n"}  # fmt: skip
    status, submitted = http("POST", f"{url}/api/v1/jobs/", job, token=created["token"])
    assert status == 201, submitted
    stream = urllib.request.Request(f"{url}/api/v1/events/stream/", headers={  # noqa: S310
        "Authorization": f"Token {created['token']}", "Last-Event-ID": "0"})  # fmt: skip
    with urllib.request.urlopen(stream, timeout=10) as response:  # noqa: S310  (loopback only)
        assert response.headers["Content-Type"] == "text/event-stream"
        events = read_events((line.decode().rstrip("\n") for line in response), count=1, timeout_s=10)
    assert events and events[0].event == "job"
    assert (events[0].data["job"], events[0].data["to_state"]) == (submitted["id"], "QUEUED")


def test_the_worker_is_a_separate_process_on_the_serverless_broker(embedded_portal):
    code = "from portal.core.tasks import ping; print(ping.delay().get(timeout=40))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=embedded_portal["env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "pong", result.stderr[-2000:]
    assert list((embedded_portal["var"] / "celery" / "results").iterdir())


def test_ctrl_c_stops_all_three_processes(embedded_portal):
    proc = embedded_portal["proc"]
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"still running after Ctrl-C: {alive}"
