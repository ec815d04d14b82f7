"""Time from POST /api/v1/jobs/ to the job PENDING in Slurm on the testbed (median of N).

The real path: gunicorn on loopback, a Celery worker on Redis, sbatch over SSH to the testbed.
Uses its own PostgreSQL database (portal_bench) and Redis database 11; prints figures.

    .venv/bin/python bench/submit_to_pending.py [--jobs 20]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENV = os.environ | {
    "DJANGO_SETTINGS_MODULE": "portal.settings",
    "DATABASE_URL": os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal_bench"),
    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"),
    "VAR_DIR": str(ROOT / "var" / "bench"),
    "LOG_LEVEL": "WARNING",
    "JOB_POLL_INTERVAL_S": "2",  # finished jobs free their GPUs quickly between samples
    "API_THROTTLE_USER": "100000/min",  # the bench polls fast; throttling is not what it measures
}
os.environ.update(ENV)
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(method: str, url: str, token: str, body: dict | None = None) -> dict:
    assert url.startswith("http://127.0.0.1:")  # loopback only
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None)
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Token {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def setup() -> tuple[str, str]:
    """Database, tenant, grant, the testbed cluster and the tenant's Slurm account."""
    subprocess.run(
        ["bash", str(ROOT / "tests/testbed/testbed.sh"), "up"], check=True, stdout=subprocess.DEVNULL
    )
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", "DROP DATABASE IF EXISTS portal_bench"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", "CREATE DATABASE portal_bench"],
        check=True,
        capture_output=True,
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from clusters.models import Cluster, GpuModel, Scenario
    from portal.core.tokens import token_create
    from tenants.limits import tenant_apply
    from tenants.models import QuotaGrant, Role, Tenant
    from tenants.services import membership_add

    call_command("migrate", verbosity=0)
    call_command("register_testbed", stdout=open(os.devnull, "w"))  # noqa: SIM115
    tenant = Tenant.objects.create(slug=f"bench-{uuid.uuid4().hex[:6]}", name="Bench")
    user = get_user_model().objects.create_user("bench", password=uuid.uuid4().hex)
    membership_add(actor=None, tenant=tenant, user=user, role=Role.MEMBER)
    QuotaGrant.objects.create(
        tenant=tenant,
        scenario=Scenario.objects.get(slug="ai-training"),
        gpu_model=GpuModel.objects.get(slug="h100-80gb"),
        gpus=1000,
        gpu_hours=Decimal(100000),
        starts_on=timezone.localdate(),
        ends_on=timezone.localdate() + timedelta(days=1),
    )
    tenant_apply(tenant_id=tenant.pk, cluster_id=Cluster.objects.get(slug="testbed").pk)
    return tenant.slug, token_create(user=user, name="bench")[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    tenant, token = setup()
    port = free_port()
    procs = [
        subprocess.Popen(
            [str(BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2"],
            cwd=ROOT,
            env=ENV,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [str(BIN / "celery"), "-A", "portal", "beat", "--loglevel", "WARNING"],
            cwd=ROOT,
            env=ENV,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [str(BIN / "celery"), "-A", "portal", "worker", "--concurrency", "2", "--loglevel", "WARNING"],
            cwd=ROOT,
            env=ENV,
            stderr=subprocess.DEVNULL,
        ),
    ]
    api = f"http://127.0.0.1:{port}/api/v1"
    body = {
        "tenant": tenant,
        "scenario": "ai-training",
        "gpu_model": "h100-80gb",
        "gpus": 1,
        "cluster": "testbed",
        "walltime_minutes": 5,
        "name": "bench",
        "script": "#!/bin/bash\nsleep 1\n",
    }
    seconds, job_ids = [], []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        call("POST", f"{api}/jobs/", token, body)  # warm the worker's SSH connection and the web workers
        for _ in range(args.jobs):
            started = time.monotonic()
            job = call("POST", f"{api}/jobs/", token, body)
            job_ids.append(job["id"])
            while job["state"] in ("QUEUED", "SUBMITTING") and time.monotonic() - started < 60:
                time.sleep(0.01)
                job = call("GET", f"{api}/jobs/{job['id']}/", token)
            seconds.append(time.monotonic() - started)
            if job["state"] != "PENDING" and job["state"] not in ("RUNNING", "COMPLETED"):
                raise SystemExit(f"job {job['id']} ended {job['state']} ({job['reason']})")
            time.sleep(2.5)  # one at a time: the figure is latency, not throughput
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    ms = sorted(s * 1000 for s in seconds)
    print(
        f"submit → PENDING in Slurm, {len(ms)} jobs, one at a time, through gunicorn + Celery + sbatch over SSH:"
    )
    print(
        f"  median {statistics.median(ms):.0f} ms   min {ms[0]:.0f} ms   p90 {ms[int(len(ms) * 0.9) - 1]:.0f} ms   "
        f"max {ms[-1]:.0f} ms"
    )


if __name__ == "__main__":
    main()
