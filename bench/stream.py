"""The job event stream under many watchers, and what a conditional GET saves.

1. Stream: one uvicorn process (portal.asgi, as scripts/stack runs it) on a fresh PostgreSQL
   database; W watchers (500 by default: 50 members of one tenant with 10 streams each) open
   GET /api/v1/events/stream/ over loopback from one asyncio client in this process. Once all
   are held, the bench moves a job of the tenant E times (one JobEvent each, 1 s apart) and
   every watcher records when each event reached it. Printed: watchers held, the server's
   resident memory before and with them, and the delay from the event's commit to each
   watcher's receipt (p50, p95, max over W × E receipts). The machine's cores are shared by
   server and client; EVENTS_POLL_MS (500 by default) bounds what the delay can be.
2. Conditional GET: in this process, through Django's WSGI handler, a page of 50 jobs and one
   job asked R times with no tag and R times with the tag of the last answer: mean time and
   bytes of the 200 and of the 304.

Own database (BENCH_DATABASE_URL, default portal_bench_stream) and Redis database 12; prints
figures, asserts nothing about time.

    .venv/bin/python bench/stream.py [--watchers 500] [--events 10] [--repeat 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.dispatch import fresh_database  # noqa: E402 - once ROOT is on the path (it sets its own env first)
from bench.procs import stop_all  # noqa: E402
from bench.rss import rss_mb  # noqa: E402

DB_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal_bench_stream")
os.environ.update(
    DJANGO_SETTINGS_MODULE="portal.settings",
    DATABASE_URL=DB_URL,
    REDIS_URL="redis://127.0.0.1:6379/12",
    VAR_DIR=os.environ.get("BENCH_VAR_DIR", str(ROOT / "var" / "bench")),
    LOG_LEVEL="WARNING",
)
PORT = int(os.environ.get("BENCH_STREAM_PORT", "8779"))
STREAMS_PER_USER = 10
CONNECT_TIMEOUT_S = 120  # every bound of a wait below


def setup(watchers: int):
    import django

    fresh_database(DB_URL)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from portal.core.tokens import token_create
    from tenants.models import Role, Tenant
    from tenants.services import membership_add

    tenant = Tenant.objects.create(slug=f"stream-{uuid.uuid4().hex[:6]}", name="Stream bench")
    keys = []
    for n in range((watchers + STREAMS_PER_USER - 1) // STREAMS_PER_USER):
        user = get_user_model().objects.create_user(f"watcher{n}", password=uuid.uuid4().hex)
        membership_add(actor=None, tenant=tenant, user=user, role=Role.MEMBER)
        keys.append(token_create(user=user)[1])
    return tenant, keys


def a_job(tenant):
    """A QUEUED job of the tenant, straight into the database (what the stream reads is events)."""
    from decimal import Decimal

    from django.utils import timezone

    from clusters.models import Cluster, ClusterKind, GpuModel, Partition, Scenario
    from jobs.models import Job
    from tenants.models import QuotaGrant

    scenario, gpu_model = Scenario.objects.get(slug="ai-training"), GpuModel.objects.get(slug="h100-80gb")
    cluster = Cluster.objects.create(slug="bench-local", name="Bench", kind=ClusterKind.LOCAL, local_gpus=8)
    partition = Partition.objects.create(
        cluster=cluster,
        name="local",
        gpu_model=gpu_model,
        gpus_per_node=8,
        nodes=1,
        max_walltime_minutes=60,
        max_cpus_per_gpu=1,
        max_mem_per_gpu_mb=1000,
    )
    grant = QuotaGrant.objects.create(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=8, gpu_hours=Decimal(1000),
        starts_on=timezone.localdate(), ends_on=timezone.localdate(),
    )  # fmt: skip
    return Job.objects.create(
        tenant=tenant, name="watched", scenario=scenario, gpu_model=gpu_model, grant=grant, cluster=cluster,
        partition=partition, gpus=1, walltime_minutes=60, cpus_per_gpu=1, mem_per_gpu_mb=1000,
        script="#!/bin/sh\n", reserved_gpu_hours=Decimal(1),
    )  # fmt: skip


def move(job, state: str) -> None:
    from jobs.services.common import job_move

    job_move(job, state, reason="bench")
    job.save(update_fields=["state", "reason", "raw_state"])


async def watch(client, key: str, opened: asyncio.Event, held: list, receipts: list, want: int) -> None:
    import orjson

    headers = {"Authorization": f"Token {key}"}
    async with client.stream("GET", "/api/v1/events/stream/", headers=headers) as response:
        if response.status_code != 200:
            held.append(f"HTTP {response.status_code}")
            return
        held.append("ok")
        if len(held) >= opened.target:  # type: ignore[attr-defined]
            opened.set()
        got = 0
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                at = datetime.fromisoformat(orjson.loads(line[6:])["at"])
                receipts.append((datetime.now(UTC) - at).total_seconds())
                got += 1
                if got >= want:
                    return


async def stream_run(watchers: int, events: int, keys: list[str], job, server_pid: int) -> None:
    import httpx
    from asgiref.sync import sync_to_async

    limits = httpx.Limits(max_connections=watchers + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=CONNECT_TIMEOUT_S)
    rss_idle = rss_mb(server_pid)
    opened, held, receipts = asyncio.Event(), [], []
    opened.target = watchers  # type: ignore[attr-defined]
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{PORT}", limits=limits, timeout=timeout
    ) as client:
        tasks = [
            asyncio.create_task(watch(client, keys[i // STREAMS_PER_USER], opened, held, receipts, events))
            for i in range(watchers)
        ]
        started = time.monotonic()
        await asyncio.wait_for(opened.wait(), CONNECT_TIMEOUT_S)
        print(f"watchers held: {held.count('ok')} of {watchers} in {time.monotonic() - started:.1f} s")
        await asyncio.sleep(2)
        rss_held = rss_mb(server_pid)
        states = ["SUBMITTING", "PENDING", "RUNNING"]
        for n in range(events):
            # SUBMITTING, PENDING, then RUNNING ↔ PENDING (a requeue) as often as asked
            state = states[n] if n < 3 else ("PENDING" if n % 2 else "RUNNING")
            await sync_to_async(move)(job, state)
            await asyncio.sleep(1)
        await asyncio.wait_for(asyncio.gather(*tasks), CONNECT_TIMEOUT_S)
    receipts.sort()
    print(f"server memory: {rss_idle:.0f} MB idle, {rss_held:.0f} MB with {held.count('ok')} watchers "
          f"({(rss_held - rss_idle) * 1024 / max(1, held.count('ok')):.0f} KB a watcher)")  # fmt: skip
    print(f"delivered: {len(receipts)} of {watchers * events} (events × watchers)")
    ms = [r * 1000 for r in receipts]
    print(f"delay from the event to the watcher: p50 {statistics.median(ms):.0f} ms, "
          f"p95 {ms[int(0.95 * (len(ms) - 1))]:.0f} ms, max {ms[-1]:.0f} ms")  # fmt: skip


def conditional(tenant, repeat: int) -> None:
    """The 200 and the 304 of the same answers, through Django's WSGI handler in this process."""
    from django.test import Client

    from jobs.models import Job

    template = Job.objects.filter(tenant=tenant).first()
    Job.objects.bulk_create([
        Job(**{f.attname: getattr(template, f.attname) for f in Job._meta.concrete_fields
               if f.attname not in ("id", "token")}) for _ in range(60)
    ])  # fmt: skip
    user = tenant.memberships.first().user
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    for name, url in (
        ("job list, 50 jobs", "/api/v1/jobs/?page_size=50"),
        ("one job", f"/api/v1/jobs/{template.pk}/"),
    ):
        first = client.get(url)
        etag = first["ETag"]
        timings = {}
        for label, extra in (("200", {}), ("304", {"HTTP_IF_NONE_MATCH": etag})):
            for _ in range(10):
                client.get(url, **extra)  # warm
            began = time.perf_counter()
            for _ in range(repeat):
                response = client.get(url, **extra)
            timings[label] = (
                (time.perf_counter() - began) / repeat * 1000,
                len(response.content),
                response.status_code,
            )
        full, same = timings["200"], timings["304"]
        print(f"{name}: 200 {full[0]:.2f} ms / {full[1]} bytes; 304 {same[0]:.2f} ms / {same[1]} bytes "
              f"(status {same[2]}; {100 * (1 - same[0] / full[0]):.0f} % less time in the web process)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--watchers", type=int, default=500)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    tenant, keys = setup(args.watchers)
    job = a_job(tenant)
    log = open(ROOT / "var" / "bench" / "stream-server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "uvicorn"), "portal.asgi:application", "--host", "127.0.0.1",
         "--port", str(PORT), "--no-access-log", "--backlog", "2048"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        import httpx

        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{PORT}/healthz", timeout=1)
                break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("uvicorn did not start; var/bench/stream-server.log") from None
                time.sleep(0.2)
        print(f"{os.cpu_count()} cores; one uvicorn process; EVENTS_POLL_MS "
              f"{os.environ.get('EVENTS_POLL_MS', '500')}")  # fmt: skip
        asyncio.run(stream_run(args.watchers, args.events, keys, job, server.pid))
    finally:
        stop_all([server])
        log.close()
    conditional(tenant, args.repeat)


if __name__ == "__main__":
    main()
