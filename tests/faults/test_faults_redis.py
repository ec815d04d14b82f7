"""Fault: Redis (broker and cache) stopped for 30 s while clients submit.

The portal runs as it does in production: gunicorn and a Celery worker in their own processes,
both on a Redis of this test's own (a free loopback port; the machine's Redis is never touched),
sharing the test database. Redis stops; two clients keep submitting through the API; the API
must answer each with 201 and the job QUEUED (dispatch is enqueued after commit, and a broker
that is down must not turn a committed job into an error), and /readyz 503 naming the broker.
Redis comes back empty, as after a restart without persistence: the messages of the outage are
gone, and one sweep must hand every job to Slurm, each exactly once (counted by token)."""

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
from celery import Celery

from clusters.models import Partition
from jobs.models import Job, JobState
from portal.core.tokens import token_create
from tests.conftest import (
    ROOT,
    VENV_BIN,
    database_url_of_test_db,
    die_with_parent,
    free_port,
    stop,
    wait_for_port,
)
from tests.faults_support import start_worker, tally
from tests.slurm_support import GPU_MODEL, SCRIPT, slurm_tenant
from tests.testbed.env import registered_testbed
from tests.wait_support import wait_until

OUTAGE_S = 30
CLIENTS = 2
CLIENT_PAUSE_S = 0.5


def _redis(port: int, folder) -> subprocess.Popen:
    proc = subprocess.Popen(
        [shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
         "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent,
    )  # fmt: skip
    wait_for_port(port, timeout_s=10, proc=proc)
    return proc


def _gunicorn(port: int, redis_url: str, log_path) -> subprocess.Popen:
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url_of_test_db(),
        "REDIS_URL": redis_url,
        "READYZ_TIMEOUT_S": "1",
    }
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(VENV_BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2",
             "--timeout", "60"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )  # fmt: skip
    wait_for_port(port, timeout_s=30, proc=proc)
    return proc


@dataclass
class Answer:
    status: int
    body: dict
    elapsed_s: float


def _call(base: str, path: str, *, token: str = "", body: dict | None = None) -> Answer:
    assert base.startswith("http://127.0.0.1:")
    request = urllib.request.Request(base + path, data=json.dumps(body).encode() if body else None)  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Token {token}")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310  (loopback only)
            status, text = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = {"text": text.decode(errors="replace")[:300]}
    return Answer(status, parsed, time.monotonic() - started)


@pytest.mark.django_db(transaction=True)
def test_redis_down_30s_submissions_are_queued_and_one_sweep_drains_them(tmp_path, catalog, redis_server):
    cluster = registered_testbed()
    Partition.objects.filter(cluster=cluster, name="a100").update(nodes=100)  # as many in flight as submitted
    bed = slurm_tenant(cluster, gpus=400)
    _, token = token_create(user=bed.user, name="faults")
    redis_port = int(redis_server["url"].rsplit(":", 1)[1].split("/")[0])
    redis_url = f"redis://127.0.0.1:{redis_port}/1"  # tests.settings puts the cache on the db below
    web_port = free_port()
    base = f"http://127.0.0.1:{web_port}"
    body = {
        "tenant": bed.tenant.slug, "scenario": "ai-training", "gpu_model": GPU_MODEL, "gpus": 1, "cluster": "testbed",
        "walltime_minutes": 1, "name": "fault", "script": SCRIPT,
    }  # fmt: skip
    web = _gunicorn(web_port, redis_url, tmp_path / "web.log")
    worker = start_worker(tmp_path / "worker.log", redis_url=redis_url)
    redis = redis_server["proc"]
    answers: list[Answer] = []
    readyz: list[Answer] = []
    try:
        before = _call(base, "/api/v1/jobs/", token=token, body=body)
        assert before.status == 201, before
        wait_until(lambda: Job.objects.get(pk=before.body["id"]).state == JobState.PENDING, timeout_s=30)

        stop(redis)
        outage_ends = time.monotonic() + OUTAGE_S

        def client() -> None:
            while time.monotonic() < outage_ends - 1:
                answers.append(_call(base, "/api/v1/jobs/", token=token, body=body))
                time.sleep(CLIENT_PAUSE_S)

        clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for thread in clients:
            thread.start()
        reads: list[Answer] = []
        while time.monotonic() < outage_ends - 1:
            readyz.append(_call(base, "/readyz"))
            reads.append(_call(base, f"/api/v1/jobs/{before.body['id']}/", token=token))
            time.sleep(2)
        for thread in clients:
            thread.join(timeout=35)
        time.sleep(max(0.0, outage_ends - time.monotonic()))
        redis = _redis(redis_port, tmp_path)

        outage_ids = [answer.body.get("id") for answer in answers]
        assert answers and all(answer.status == 201 for answer in answers), [
            (a.status, a.body) for a in answers if a.status != 201
        ][:3]
        assert {answer.body["state"] for answer in answers} == {JobState.QUEUED}
        assert all(a.status == 503 and a.body["checks"]["broker"].startswith("failed") for a in readyz), (
            readyz
        )
        assert readyz[0].body["detail"] == "Not ready: broker unreachable."
        assert {answer.status for answer in reads} == {200}  # reading goes on as well
        assert readyz[0].body["checks"]["database"] == "ok"
        # Redis came back empty: nothing but a sweep knows of these jobs.
        assert set(Job.objects.filter(pk__in=outage_ids).values_list("state", flat=True)) == {JobState.QUEUED}
        wait_until(lambda: _call(base, "/readyz").status == 200, timeout_s=15, what="/readyz 200")

        sweep = Celery("faults", broker=redis_url, set_as_current=False)  # current_app stays the portal's
        sweep.send_task("jobs.tasks.sweep_jobs", ignore_result=True)
        wait_until(
            lambda: not Job.objects.filter(pk__in=outage_ids).exclude(state=JobState.PENDING).exists(),
            timeout_s=60, interval_s=0.5, what="the outage's jobs PENDING after one sweep",
        )  # fmt: skip
        figures = tally([int(before.body["id"]), *map(int, outage_ids)], bed.slurm_jobs())
    finally:
        stop(worker)
        stop(web)
        stop(redis)
        bed.cleanup()
    slowest = max(answer.elapsed_s for answer in answers)
    print(
        f"\n[faults] redis down {OUTAGE_S}s: runs={len(answers)} submissions (all 201 QUEUED, slowest "
        f"{slowest:.2f}s), readyz 503 x{len(readyz)}, lost={len(figures.lost)} doubled={len(figures.doubled)} "
        f"states={figures.states}"
    )
    assert figures.lost == [] and figures.doubled == [], figures
    assert slowest < 5, slowest  # a broker that is down costs a bounded wait, not a hung request
