"""/metrics under several processes: gunicorn's workers and a Celery worker write their counts
to PROMETHEUS_MULTIPROC_DIR, and any worker's scrape adds them all up."""

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from portal.core.tasks import ping
from tests.conftest import (
    ROOT,
    VENV_BIN,
    database_url_of_test_db,
    free_port,
    start_celery_worker,
    stop,
    wait_for_port,
)
from tests.monitoring_support import TOKEN, value
from tests.wait_support import wait_until


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - loopback http
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def metrics_dir(tmp_path):
    path = tmp_path / "prometheus"
    path.mkdir()
    return path


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def test_what_gunicorn_workers_counted_adds_up_in_a_scrape_by_another_worker(transactional_db, metrics_dir):
    """Forty requests, then every worker that could have answered them is replaced: the new
    workers counted none of them, yet a scrape shows all forty, from the folder."""
    port = free_port()
    env = os.environ | {
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "METRICS_TOKEN": TOKEN,
        "DATABASE_URL": database_url_of_test_db(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    proc = subprocess.Popen(
        [str(VENV_BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, timeout_s=30, proc=proc)
        base = f"http://127.0.0.1:{port}"
        for _ in range(40):
            assert _get(f"{base}/healthz")[0] == 200
        first = wait_until(lambda: len(_children(proc.pid)) == 2 and _children(proc.pid), timeout_s=10)
        for pid in first:
            os.kill(pid, signal.SIGTERM)
        wait_until(
            lambda: len(_children(proc.pid) - first) == 2 and not (_children(proc.pid) & first),
            timeout_s=30, what="two new workers",
        )  # fmt: skip
        wait_for_port(port, timeout_s=30, proc=proc)
        _status, text = wait_until(
            lambda: (r := _get(f"{base}/metrics", TOKEN))[0] == 200 and r, timeout_s=30
        )
        key = {"route": "healthz", "method": "GET", "status": "200"}
        assert value(text, "portal_http_request_duration_seconds_count", **key) == 40
        assert _get(f"{base}/metrics")[0] == 401
    finally:
        stop(proc)


def test_celery_task_runs_failures_and_durations_reach_the_scrape(
    transactional_db, tmp_path, metrics_dir, client, settings
):
    from portal.celery import app

    settings.METRICS_TOKEN = TOKEN
    app.control.purge()
    worker = start_celery_worker(tmp_path / "worker.log", {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    try:
        for _ in range(3):
            assert ping.delay().get(timeout=30) == "pong"
        # sent by name: the caller's own argument check would refuse it before it left
        failed = app.send_task("portal.core.tasks.ping", kwargs={"no_such_argument": 1})
        with pytest.raises(TypeError):
            failed.get(timeout=30)
    finally:
        stop(worker)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # this process reads the worker's files
    try:
        text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    finally:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    task = "portal.core.tasks.ping"
    assert value(text, "portal_celery_task_runs_total", task=task, outcome="success") == 3
    assert value(text, "portal_celery_task_runs_total", task=task, outcome="failure") == 1
    assert value(text, "portal_celery_task_duration_seconds_count", task=task) == 4
