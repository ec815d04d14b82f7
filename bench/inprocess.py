"""CPU per request in a web process, the portal's API against the floor (bench/floor_views.py),
on the seeded site: what a request costs in Python, without the network and the queueing that
the open-loop load (bench/load.py) adds on top.

    eval "$(STACK_DIR=var/bench/stack STACK_DB=portal_bench_site STACK_REDIS_DB=4 scripts/stack env)"
    .venv/bin/python bench/inprocess.py --site var/bench/site.json [--rounds 5] [--requests 300]

Two child processes, each one web process as gunicorn runs it (the WSGI handler, every
middleware, the database connection kept between requests): one with the portal's settings,
one with the floor's (bench.floor_settings: the same settings and middleware, the floor's
views). The parent alternates them round by round, so that a noisy minute falls on both. In each
round a child answers --requests requests of each kind, after 50 untimed ones when it starts,
and reports each kind's thread CPU time per request (time.thread_time: the Python, the driver's
and the parsing's work, not the waiting for PostgreSQL or Redis) and wall time. The figures are
the median over the rounds of each round's P50.

Kinds: `get` GET /api/v1/jobs/{id}/, `page` GET /api/v1/jobs/?tenant=…&state=COMPLETED&page_size=50
(a full page: on the seeded site a tenant's waiting and running jobs are few or none, so that
bench/load.py's filters answer mostly empty pages),
`me` GET /api/v1/me/, and `submit` POST /api/v1/jobs/ (the floor's does the writes that
docs/architecture.md's flow asks of a submission by hand-written SQL, bench/floor_views.py; each
submitted job is cancelled when the child ends; the child's broker is its own Redis database, flushed at the end,
so that its messages reach no worker, though the stack's dispatch sweep may still send some of
the jobs to Slurm). The same users, tenants and jobs in both children.

After the rounds, each child profiles --requests more of each kind (cProfile on thread CPU time)
and the parent prints each kind's CPU per request by layer: what the frameworks (Django REST
framework, django-filter, the ORM's query building, Django's request handling), the database
driver and the portal's own code cost. Where a target fails, this is the profile that says why.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("get", "page", "me", "submit")
WARM = 50
CHILD_REDIS_DB = 12  # the submit's broker in the child: no worker reads it
# The targets of issue 18, in-process: portal ÷ floor per kind, and a submit ÷ a get.
TARGETS = {"get": 1.5, "page": 1.3, "me": 1.5, "submit": 3.0}


# ---------------------------------------------------------------- the child --
class Requests:
    """The same picks in both children: users with a tenant, a job of that tenant, a filter."""

    def __init__(self, site: dict, seed: int = 7) -> None:
        from jobs.models import Job

        self.rng = random.Random(seed)  # noqa: S311  (picks, not secrets)
        self.site = site
        users = [u for u in site["users"] if u.get("token") and u.get("tenants")]
        self.jobs = {}  # a tenant's newest jobs (up to 200), for tenants that have any
        for slug in sorted({t["slug"] for u in users for t in u["tenants"]}):
            ids = list(
                Job.objects.filter(tenant__slug=slug).order_by("-id").values_list("id", flat=True)[:200]
            )
            if ids:
                self.jobs[slug] = ids
        self.users = [u for u in users if any(t["slug"] in self.jobs for t in u["tenants"])]
        tenants = site.get("tenants") or {}
        self.tenants = {t["slug"]: t for t in tenants} if isinstance(tenants, list) else dict(tenants)
        self.submitters = [
            (u, t["slug"])
            for u in self.users
            for t in u["tenants"]
            if t.get("role") in {"owner", "manager", "member"}
            and all((self.tenants.get(t["slug"]) or {}).get(k) for k in ("scenario", "gpu_model"))
        ]

    def pick(self, kind: str) -> tuple[str, str, str, dict | None]:
        """(method, path, token, body) of one request of the kind."""
        if kind == "submit":
            user, slug = self.rng.choice(self.submitters)
            t = self.tenants[slug]
            body = {"tenant": slug, "scenario": t["scenario"], "gpu_model": t["gpu_model"], "gpus": 1}
            body |= {"cluster": self.site["cluster"], "walltime_minutes": 5, "name": "inprocess"}
            body |= {"script": "#!/bin/bash\ntrue\n"} | (
                {"partition": t["partition"]} if t.get("partition") else {}
            )
            return "POST", "/api/v1/jobs/", user["token"], body
        user = self.rng.choice(self.users)
        if kind == "me":
            return "GET", "/api/v1/me/", user["token"], None
        slug = self.rng.choice([t["slug"] for t in user["tenants"] if t["slug"] in self.jobs])
        if kind == "get":
            return "GET", f"/api/v1/jobs/{self.rng.choice(self.jobs[slug])}/", user["token"], None
        query = urlencode({"tenant": slug, "state": "COMPLETED", "page_size": 50})
        return "GET", f"/api/v1/jobs/?{query}", user["token"], None


def _environ(method: str, path: str, token: str, body: dict | None) -> dict:
    path, _, query = path.partition("?")
    raw = json.dumps(body).encode() if body is not None else b""
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_AUTHORIZATION": f"Token {token}",
        "HTTP_ACCEPT": "application/json",
        "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if body is not None:
        environ |= {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(raw))}
        environ["HTTP_IDEMPOTENCY_KEY"] = uuid.uuid4().hex
    return environ


def child(side: str, site_path: str, requests: int) -> int:
    """One web process: answers a round per line read on stdin, one JSON line per round."""
    # Both sides: _cancel flushes the child's Redis database, never the stack's.
    os.environ["REDIS_URL"] = _other_redis_db(os.environ["REDIS_URL"], CHILD_REDIS_DB)
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings" if side == "portal" else "bench.floor_settings"
    import django

    django.setup()
    from django.core.wsgi import get_wsgi_application

    app = get_wsgi_application()
    picks = Requests(json.loads(Path(site_path).read_text()))
    kinds = list(KINDS)
    submitted: list[int] = []

    def answer(kind: str) -> tuple[float, float]:
        status: list[str] = []
        environ = _environ(*picks.pick(kind))
        cpu, wall = time.thread_time(), time.perf_counter()
        result = app(environ, lambda s, h, *_: status.append(s))
        body = b"".join(result)
        result.close()  # request_finished: what gunicorn calls after the answer
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        if not status[0].startswith(("200", "201")):
            raise SystemExit(f"{side} {kind} {environ['PATH_INFO']}: {status[0]} {body[:300]!r}")
        if kind == "submit":
            submitted.append(json.loads(body)["id"])
        return cpu, wall

    for kind in kinds:
        for _ in range(WARM):
            answer(kind)
    print(json.dumps({"ready": side}), flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "profile":
                print(json.dumps({kind: _profiled(answer, kind, requests) for kind in kinds}), flush=True)
                continue
            out = {}
            for kind in kinds:
                timed = [answer(kind) for _ in range(requests)]
                out[kind] = {
                    "cpu_ms": statistics.median(c for c, _ in timed) * 1000,
                    "wall_ms": statistics.median(w for _, w in timed) * 1000,
                }
            print(json.dumps(out), flush=True)
    finally:
        if submitted:
            _cancel(submitted)
    return 0


# Layers by where a function lives, the first match of its file's path: (layer, path part).
LAYERS = (
    ("Django REST framework", "/rest_framework/"),
    ("django-filter", "/django_filters/"),
    ("the ORM (queries built, rows made)", "/django/db/models/"),
    ("the database driver", "/psycopg"),
    ("the database driver", "/django/db/backends/"),
    ("Django (request, middleware, answer)", "/django/"),
    ("the portal's own code", str(ROOT)),
)


def _layer(filename: str) -> str | None:
    """The layer of a function's file; None for Python's own and C built-ins (getattr, dict
    methods, a driver's C parts), whose time goes to the layers that call them."""
    if "site-packages" not in filename and not filename.startswith(str(ROOT)):
        return None
    for layer, part in LAYERS:
        if part in filename and (part != str(ROOT) or "site-packages" not in filename):
            return layer
    return "other libraries (redis, axes, whitenoise, orjson, …)"


def _profiled(answer, kind: str, requests: int) -> dict[str, float]:
    """CPU ms per request of the kind by layer: each function's own time (cProfile's tottime,
    on the thread's CPU clock) summed by the layer its file is in. A built-in's time is shared
    among its callers' layers by what each caller's calls of it took."""
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    for _ in range(requests):
        answer(kind)
    profile.disable()
    layers: dict[str, float] = {}

    def add(layer: str | None, seconds: float) -> None:
        layer = layer or "Python's own (called from Python's own)"
        layers[layer] = layers.get(layer, 0.0) + seconds * 1000 / requests

    for (filename, _, _), (_, _, tottime, _, callers) in pstats.Stats(profile).stats.items():
        layer = _layer(filename)
        if layer is not None or not callers:
            add(layer, tottime)
            continue
        by_caller = sum(caller[2] for caller in callers.values()) or 1.0
        for (caller_file, _, _), caller in callers.items():
            add(_layer(caller_file), tottime * caller[2] / by_caller)
    return layers


def _other_redis_db(url: str, db: int) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{db}"


def _cancel(ids: list[int]) -> None:
    """The child's submissions: cancelled through the portal's own service, its broker flushed."""
    import redis
    from django.conf import settings

    from clusters.backends.base import END_STATES
    from jobs.models import Job
    from jobs.services import job_cancel
    from portal.core.errors import Conflict

    for job in Job.objects.filter(id__in=ids).exclude(state__in=END_STATES).select_related("submitted_by"):
        with contextlib.suppress(Conflict):  # ended meanwhile (the stack's sweep may dispatch it)
            job_cancel(actor=job.submitted_by, job=job)
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


# --------------------------------------------------------------- the parent --
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default=str(ROOT / "var" / "bench" / "site.json"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300, help="per kind and round")
    parser.add_argument("--json", default="", help="also write the figures here")
    parser.add_argument("--child", choices=("portal", "floor"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.rounds <= 50 or not 10 <= args.requests <= 10_000:
        parser.error("--rounds 1..50, --requests 10..10000")
    if args.child:
        return child(args.child, args.site, args.requests)

    procs = {}
    for side in ("portal", "floor"):
        procs[side] = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                side,
                "--site",
                args.site,
                "--requests",
                str(args.requests),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    rounds: dict[str, list[dict]] = {"portal": [], "floor": []}
    try:
        for side, proc in procs.items():
            ready = proc.stdout.readline()
            if not ready:
                raise SystemExit(f"the {side} child ended before it was ready (its error is above)")
        for index in range(args.rounds):
            order = ("portal", "floor") if index % 2 == 0 else ("floor", "portal")
            for side in order:  # one at a time: the other child waits on its stdin
                procs[side].stdin.write("round\n")
                procs[side].stdin.flush()
                line = procs[side].stdout.readline()
                if not line:
                    raise SystemExit(f"the {side} child ended in round {index + 1} (its error is above)")
                rounds[side].append(json.loads(line))
        profiles = {}
        for side, proc in procs.items():
            proc.stdin.write("profile\n")
            proc.stdin.flush()
            profiles[side] = json.loads(proc.stdout.readline())
    finally:
        for proc in procs.values():
            proc.stdin.close()
        for proc in procs.values():
            proc.wait(timeout=600)
    figures = summarise(rounds)
    figures["profiles"] = profiles
    print_figures(figures, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "figures": figures}, indent=1))
    return 0


def summarise(rounds: dict[str, list[dict]]) -> dict:
    out: dict = {}
    for side, per_round in rounds.items():
        for kind in per_round[0]:
            cpu = [r[kind]["cpu_ms"] for r in per_round]
            wall = [r[kind]["wall_ms"] for r in per_round]
            out[f"{side} {kind}"] = {
                "cpu_ms": statistics.median(cpu),
                "cpu_range_ms": [min(cpu), max(cpu)],
                "wall_ms": statistics.median(wall),
            }
    ratios = {k: out[f"portal {k}"]["cpu_ms"] / out[f"floor {k}"]["cpu_ms"] for k in ("get", "page", "me")}
    ratios["submit"] = out["portal submit"]["cpu_ms"] / out["portal get"]["cpu_ms"]
    out["ratios"] = ratios
    # What the design's writes cost at the least: the floor's own submission against its get.
    out["floor submit ÷ floor get"] = out["floor submit"]["cpu_ms"] / out["floor get"]["cpu_ms"]
    out["portal submit ÷ floor submit"] = out["portal submit"]["cpu_ms"] / out["floor submit"]["cpu_ms"]
    return out


def print_figures(figures: dict, args) -> None:
    print(f"\nCPU per request in one web process, {args.rounds} rounds × {args.requests} requests per kind,")
    print("median of the rounds' P50s [range of the rounds]:")
    print(f"  {'request':<16} {'portal CPU ms':>22} {'floor CPU ms':>22} {'portal wall ms':>15}")
    for kind in KINDS:
        portal = figures[f"portal {kind}"]
        floor = figures.get(f"floor {kind}")
        cell = lambda f: f"{f['cpu_ms']:6.2f} [{f['cpu_range_ms'][0]:.2f}–{f['cpu_range_ms'][1]:.2f}]"  # noqa: E731
        print(
            f"  {kind:<16} {cell(portal):>22} {cell(floor) if floor else '—':>22} {portal['wall_ms']:15.2f}"
        )
    print("\nTargets (issue 18, in-process):")
    for kind, bound in TARGETS.items():
        ratio = figures["ratios"][kind]
        what = "portal submit ÷ portal get" if kind == "submit" else f"portal {kind} ÷ floor {kind}"
        print(f"  {what:<30} {ratio:5.2f} ×  (≤ {bound} ×)  {'PASS' if ratio <= bound else 'FAIL'}")
    print("For the submission's target, the floor's own (what the flow's writes cost at the least):")
    for what in ("floor submit ÷ floor get", "portal submit ÷ floor submit"):
        print(f"  {what:<30} {figures[what]:5.2f} ×")
    print_profiles(figures["profiles"], args.requests)


def print_profiles(profiles: dict, requests: int) -> None:
    """CPU ms per request by layer, portal beside floor (the profiler's own cost included)."""
    print(f"\nWhere the CPU goes, by layer (cProfile of {requests} requests per kind, ms per request,")
    print("portal / floor; the profiler adds its own cost to both):")
    layers = sorted({layer for side in profiles.values() for kind in side.values() for layer in kind})
    for kind in KINDS:
        portal, floor = profiles["portal"][kind], profiles["floor"][kind]
        total = f"{sum(portal.values()):.2f} / {sum(floor.values()):.2f}"
        print(f"  {kind}: {total} in all")
        for layer in sorted(layers, key=lambda name: -portal.get(name, 0.0)):
            mine, theirs = portal.get(layer, 0.0), floor.get(layer, 0.0)
            if mine >= 0.005 or theirs >= 0.005:
                print(f"    {layer:<52} {mine:6.2f} / {theirs:6.2f}")


if __name__ == "__main__":
    sys.exit(main())
