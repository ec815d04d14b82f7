"""Graceful overload (portal.core.overload): a request that waited longer than
SHED_QUEUED_AFTER_MS for a worker, by the proxy's X-Request-Start stamp, is refused at once with
503 and Retry-After, having done nothing; and behind the real nginx of deploy/nginx/portal.conf
the stamp is the proxy's, not the client's."""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jobs.models import Job
from portal.core import overload
from tests.api_support import assert_problem
from tests.conftest import ROOT, VENV_BIN, free_port, stop, wait_for_port
from tests.jobs_support import JOB


def stamp(ago_s: float) -> str:
    return f"t={time.time() - ago_s:.3f}"


@pytest.fixture(autouse=True)
def fresh_queue(monkeypatch):
    """Each test starts with no standing queue (the state is per process)."""
    monkeypatch.setattr(overload, "QUEUE", overload.StandingQueue())


def test_a_queue_stands_when_even_the_least_wait_of_an_interval_is_above_the_target():
    queue, target = overload.StandingQueue(), 0.05
    assert queue.observe(0.3, 100.0, target) is False  # nothing known before the first interval
    assert queue.observe(0.2, 100.3, target) is False
    assert queue.observe(0.3, 100.6, target) is True  # 100.0–100.5: least 0.2
    assert queue.observe(0.01, 100.7, target) is True  # as of the last whole interval
    assert queue.observe(0.3, 101.2, target) is False  # 100.6–101.1: least 0.01, a burst
    assert queue.observe(0.3, 101.3, target) is False
    assert queue.observe(0.3, 101.8, target) is True  # 101.2–101.7: least 0.3
    assert queue.observe(0.3, 105.0, target) is False  # idle since 102.3: no queue stands


@pytest.mark.django_db
def test_while_the_queue_stands_the_bound_is_two_fifths_of_itself(anon_client, settings):
    """500 ms: a burst that waited 300 ms is served; once every request of half a second has
    waited past 200 ms, a request that waited 300 ms is refused and one that waited 20 ms served,
    until half a second passes in which some request waited little."""
    settings.SHED_QUEUED_AFTER_MS = 500

    def status(waited_s: float) -> int:
        return anon_client.get("/api/v1/me/", HTTP_X_REQUEST_START=stamp(waited_s)).status_code

    assert status(0.3) == 401
    time.sleep(overload.StandingQueue.INTERVAL_S + 0.05)
    assert status(0.3) == 503
    assert status(0.02) == 401
    time.sleep(overload.StandingQueue.INTERVAL_S + 0.05)
    assert status(0.3) == 401


@pytest.mark.django_db
def test_a_request_that_waited_past_the_bound_is_refused_with_retry_after(anon_client, settings):
    settings.SHED_QUEUED_AFTER_MS = 500
    response = anon_client.get("/api/v1/me/", HTTP_X_REQUEST_START=stamp(0.8))
    body = assert_problem(response, 503, "unavailable")
    assert response["Retry-After"] == "1" and body["retry_after_s"] == 1
    assert "waited 8" in body["detail"]  # 800-odd ms, said in the answer
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db
def test_refusals_are_logged_once_a_second_not_once_each(anon_client, settings, caplog):
    """Under overload there are thousands: one warning a second says how many, and Django's own
    error line per 5xx is not written."""
    settings.SHED_QUEUED_AFTER_MS = 500
    with caplog.at_level("INFO"):
        for _ in range(20):
            assert anon_client.get("/api/v1/me/", HTTP_X_REQUEST_START=stamp(1)).status_code == 503
    shed = [r for r in caplog.records if r.name == "portal.core.overload"]
    assert len(shed) <= 1 and not [r for r in caplog.records if r.name == "django.request"]


@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "fresh", "t=not-a-time", "t=nan", "t=-5", "t=9999999999"])
def test_a_request_within_the_bound_or_without_a_usable_stamp_is_served(anon_client, settings, header):
    settings.SHED_QUEUED_AFTER_MS = 500
    extra = {} if header is None else {"HTTP_X_REQUEST_START": stamp(0.1) if header == "fresh" else header}
    assert_problem(anon_client.get("/api/v1/me/", **extra), 401, "not_authenticated")


@pytest.mark.django_db
def test_a_page_is_refused_in_plain_text_and_healthz_never(client, settings):
    settings.SHED_QUEUED_AFTER_MS = 500
    page = client.get("/login/", HTTP_X_REQUEST_START=stamp(2))
    assert page.status_code == 503 and page["Retry-After"] == "1"
    assert page["Content-Type"].startswith("text/plain") and b"overloaded" in page.content
    assert client.get("/healthz", HTTP_X_REQUEST_START=stamp(2)).status_code == 200


@pytest.mark.django_db
def test_zero_turns_shedding_off(anon_client, settings):
    settings.SHED_QUEUED_AFTER_MS = 0
    assert_problem(anon_client.get("/api/v1/me/", HTTP_X_REQUEST_START=stamp(30)), 401, "not_authenticated")


def test_a_refused_submission_stores_nothing_and_its_retry_is_taken(
    client_for, member, grant, local_partition, settings
):
    """Nothing accepted is lost: the refusal comes before the job exists, and the client's retry
    with the same Idempotency-Key is the one submission."""
    settings.SHED_QUEUED_AFTER_MS = 500
    api = client_for(member)
    headers = {"HTTP_IDEMPOTENCY_KEY": "retry-me"}
    refused = api.post("/api/v1/jobs/", JOB, format="json", HTTP_X_REQUEST_START=stamp(1), **headers)
    assert_problem(refused, 503, "unavailable")
    assert not Job.objects.exists()
    taken = api.post("/api/v1/jobs/", JOB, format="json", HTTP_X_REQUEST_START=stamp(0), **headers)
    assert taken.status_code == 201, taken.content
    again = api.post("/api/v1/jobs/", JOB, format="json", **headers)
    assert again.status_code == 200 and again.json()["id"] == taken.json()["id"]
    assert Job.objects.count() == 1


# --------------------------------------------------------- behind nginx --
def _get(port: int, headers: dict | None = None, path: str = "/api/v1/me/") -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310  (loopback)
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def _workers_of(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


@pytest.fixture
def behind_nginx(tmp_path):
    """(nginx's port, gunicorn's master): one sync worker behind the project's nginx config."""
    web_port, proxy_port = free_port(), free_port()
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "tests.settings", "SHED_QUEUED_AFTER_MS": "300"}
    web = subprocess.Popen(
        [str(VENV_BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{web_port}", "--workers", "1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    conf = subprocess.run(
        ["bash", "scripts/stack", "proxy-conf", f"127.0.0.1:{proxy_port}", f"127.0.0.1:{web_port}", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    (tmp_path / "nginx.conf").write_text(conf.stdout)
    proxy = subprocess.Popen(
        ["nginx", "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(web_port, timeout_s=30, proc=web)
        wait_for_port(proxy_port, timeout_s=30, proc=proxy)
        # The worker loads Django after the port is bound; what waits meanwhile is refused.
        deadline = time.monotonic() + 30
        while _get(proxy_port, path="/healthz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield proxy_port, web
    finally:
        stop(proxy)
        stop(web)


def test_behind_nginx_a_request_queued_behind_a_busy_worker_is_refused_then_served_again(behind_nginx):
    port, web = behind_nginx
    # A client's own stamp is replaced by nginx's: an ancient one does not get it refused.
    status, _, body = _get(port, {"X-Request-Start": "t=1"})
    assert (status, body["code"]) == (401, "not_authenticated")

    (worker,) = _workers_of(web.pid)
    answers: list = []
    os.kill(worker, signal.SIGSTOP)  # the only worker is busy: the request waits in the queue
    try:
        waiting = threading.Thread(target=lambda: answers.append(_get(port)))
        waiting.start()
        time.sleep(0.8)
    finally:
        os.kill(worker, signal.SIGCONT)
    waiting.join(timeout=30)
    status, headers, body = answers[0]
    assert (status, body["code"], headers["Retry-After"]) == (503, "unavailable", "1")
    assert headers["Content-Type"] == "application/problem+json"
    # Once the worker is free, the next request is served as before.
    status, _, body = _get(port)
    assert (status, body["code"]) == (401, "not_authenticated")


def test_behind_nginx_no_worker_at_all_is_a_problem_not_a_gateway_page(behind_nginx):
    port, web = behind_nginx
    stop(web)
    status, headers, body = _get(port)
    assert (status, body["code"], headers["Retry-After"]) == (503, "unavailable", "5")
    assert headers["Content-Type"] == "application/problem+json"


def test_behind_nginx_trace_and_oversized_bodies_are_answered_as_the_api_answers(behind_nginx):
    """nginx refuses TRACE and bodies over 4 MB itself; the config hands TRACE to the portal
    (its answer names the allowed methods) and answers the body's refusal in problem+json."""
    port, _ = behind_nginx
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/clusters/", method="TRACE")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)  # noqa: S310  (loopback)
    assert refused.value.code == 401 and refused.value.headers["Allow"] == "GET, HEAD, OPTIONS"
    assert json.loads(refused.value.read())["code"] == "not_authenticated"

    body = b"{" + b" " * (5 * 1024 * 1024) + b"}"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/jobs/",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)  # noqa: S310  (loopback)
    assert refused.value.code == 413 and refused.value.headers["Content-Type"] == "application/problem+json"
    assert json.loads(refused.value.read())["code"] == "invalid"
