"""Open-loop load on the portal's API, with slurmrestd and sbatch over SSH measured in the same
run on the same machine, so that the ratios between them hold however noisy the machine is.

    .venv/bin/python bench/load.py --url http://127.0.0.1:8765 --site var/bench/site.json \\
        --stack-dir var/stack [--rate 100] [--duration 30] [--phases abcdefghiko] [--json out.json]

The site file is what `manage.py seed_site … --out` writes: the cluster, and users with their API
tokens and tenants (each tenant with a scenario, GPU model and partition a submit can use).

Open loop: each stream's arrivals are a Poisson process at --rate per second, and every request
leaves at its scheduled time whatever the earlier ones did (--senders threads per stream). Latency
runs from the scheduled time, so waiting for a free sender counts: a slow server shows in the
tail instead of slowing the load (no coordinated omission). Per phase it prints how late the
schedule loop handed requests over (P99 above 10 ms: the generator itself fell behind, and the
figures are partly its own) and how long requests waited for a free sender (the server's backlog:
every sender held by a request it has not answered).

Phases; each pits the portal against its peer in the same phase, interleaved:
  a  GET /api/v1/jobs/{id}/ vs slurmrestd GET /job/{id}, --rate each
  b  POST /api/v1/jobs/ (the API's answer; Celery dispatches into Slurm meanwhile) vs slurmrestd
     POST /job/submit, --submit-rate each (50/s)
  c  GET /api/v1/jobs/?tenant=…&state=…&page_size=50, --rate
  d  every active job of the tenant with the most, through the pages (page_size=200), vs
     slurmrestd GET /jobs (every job of the cluster, one answer), --repeat times each, alternating
  e  the mix below at --rate
  f  sbatch over the portal's SSH path in a loop for --sbatch-seconds: jobs/s
  g  phase a's requests to the floor (bench/floor_views.py: a bare Django view, hand-written SQL)
     vs slurmrestd, --rate each
  h  phase c's requests to the floor, --rate
  i  the mix at --sla-rate (150/s): the SLA's P99 of 200 ms must hold
  k  capacity: the mix at each of --capacity-rates for --step-seconds while its P99 stays within
     200 ms with no error (a rate fails when two runs of it in a row fail), then slurmrestd's get
     the same way: the highest rate that held
  o  overload: the mix at twice phase k's capacity for --duration, then at half of it for 20 s:
     how long any request waited before its answer (refusals, 503 `unavailable`, included), the
     answered ones' P99, how soon after the drop every second is back within the SLA, and how
     many submissions answered 201 the portal no longer knows afterwards (lost)
The floor runs in its own gunicorn (--floor-port, as many workers as the stack's; behind its own
nginx from the same config when the stack runs behind one), started for phases g and h and stopped after them: what Django on this machine answers at least, beside what
the portal answers and what slurmrestd answers, in the same run.
Mix of phase e, in % of requests: list jobs (state filter, page of 50) 35, get a job 30, list
quotas 10, me 10, submit 10, cancel a job the same user submitted earlier in the run 5 (its newest;
409 conflict, the job ended meanwhile, is the contract's answer and counts as success).

Before each open-loop phase the run waits, untimed and for at most 3 minutes, until no Celery task
of the stack waits in the queue or runs (kombu's unacked hash) and CPU pressure is below 20 %: a
phase's figures are then its own, not the dispatches left over from the phase before.

Every job this run submits is cancelled at the end (the peers' jobs never start: bench/peers.py).
RSS of the gunicorn and Celery processes (pid files in --stack-dir) is sampled every
--rss-interval seconds; a long --duration on phase e gives the "flat over 30 minutes" figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
import uuid
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import capacity, peers  # noqa: E402
from bench.figures import Recorder, print_summary, print_table, targets  # noqa: E402
from bench.floor_server import FloorServer  # noqa: E402
from bench.openloop import ApiError, Portal, run_open_loop  # noqa: E402
from bench.rss import (  # noqa: E402
    RssSampler,
    cpu_between,
    cpu_pressure,
    cpu_seconds_by_group,
    cpu_some_avg10,
)

SUBMIT_ROLES = {"owner", "manager", "member"}
ACTIVE_STATES = ("QUEUED", "SUBMITTING", "PENDING", "RUNNING", "CANCELLING")
LIST_FILTERS = (("QUEUED",), ("PENDING",), ("RUNNING",), ("COMPLETED",), ("PENDING", "RUNNING"))
MIX = (("list_jobs", 35), ("get_job", 30), ("list_quotas", 10), ("me", 10), ("submit", 10), ("cancel", 5))
SCRIPT = "#!/bin/bash\ntrue\n"
WARM_CALLS = 50  # untimed calls of each kind before the first phase
SETTLE_MAX_S = 180.0  # before a phase, how long to wait for the previous one's backlog to clear
UNACKED = "unacked"  # kombu's Redis transport: messages a worker holds, until it acks them
SETTLE_PRESSURE = 20.0  # "quiet": CPU pressure (PSI some avg10) below this, in %
RNG = random.Random(1)  # noqa: S311  (seeded: the same picks run after run; nothing secret)


# ---------------------------------------------------------------- the site --
class Site:
    """Users, tenants and what the run learns: job ids to read, jobs to cancel later."""

    def __init__(self, data: dict) -> None:
        self.cluster = data["cluster"]
        tenants = data.get("tenants") or {}
        self.tenants = {t["slug"]: t for t in tenants} if isinstance(tenants, list) else dict(tenants)
        self.users = [u for u in data["users"] if u.get("token") and u.get("tenants")]
        if not self.users:
            raise SystemExit("the site file names no user with a token and a tenant")
        self.submitters = [
            (u, t["slug"])
            for u in self.users
            for t in u["tenants"]
            if t.get("role") in SUBMIT_ROLES and self._submit_fields(t["slug"])
        ]
        self.jobs: dict[str, list[str]] = defaultdict(list)  # tenant → job ids
        self.own: dict[str, deque] = defaultdict(deque)  # username → ids it submitted (cancellable)
        self.submitted: list[tuple[str, str]] = []  # (token, job id) of every portal job of the run
        self.lock = threading.Lock()

    def _submit_fields(self, slug: str) -> bool:
        return all((self.tenants.get(slug) or {}).get(k) for k in ("scenario", "gpu_model"))

    def member_of(self, slug: str) -> dict:
        return next(u for u in self.users if any(t["slug"] == slug for t in u["tenants"]))

    def body(self, slug: str) -> dict:
        t = self.tenants[slug]
        body = {"tenant": slug, "scenario": t["scenario"], "gpu_model": t["gpu_model"], "gpus": 1}
        body |= {"cluster": self.cluster, "walltime_minutes": 5, "name": "loadbench", "script": SCRIPT}
        if t.get("partition"):
            body["partition"] = t["partition"]
        return body


class Load:
    def __init__(self, args, site: Site) -> None:
        self.args, self.site = args, site
        self.api = Portal(args.url)
        self.rec = Recorder()
        self.env = peers.read_env_file(Path(args.testbed_env))
        self.ssh_config = peers.ssh_config_from_env(self.env)
        lifespan = int(args.duration * 8 + args.sbatch_seconds + 3600)
        self.rest = peers.SlurmRestd.for_testbed(self.env, self.ssh_config, lifespan_s=lifespan)
        self.sbatch = peers.SbatchOverSsh.for_testbed(self.env, self.ssh_config)
        self.peer_ids: list[str] = []  # every peer job of the run, cancelled at the end
        # the stack's broker (scripts/stack env sets REDIS_URL): its queue length tells a backlog
        self.broker = redis.Redis.from_url(os.environ["REDIS_URL"]) if os.environ.get("REDIS_URL") else None
        self.run_id = uuid.uuid4().hex[:8]  # in the peers' job names, for a sweep by name at the end
        self.rest_name, self.ssh_name = f"lb-rest-{self.run_id}", f"lb-ssh-{self.run_id}"
        self.rest_get_ids: list[str] = []
        self.lock = threading.Lock()
        self.results: dict = {"phases": {}, "config": {k: v for k, v in vars(args).items() if k != "site"}}

    # ------------------------------------------------------------ requests --
    def portal_get_job(self, api: Portal | None = None, label: str = "portal GET job"):
        """A job of one of the user's tenants, from the portal (or from `api`, the floor)."""
        api = api or self.api
        user = RNG.choice(self.site.users)
        slugs = [t["slug"] for t in user["tenants"] if self.site.jobs.get(t["slug"])]
        if not slugs:
            return self.portal_me()
        job_id = RNG.choice(self.site.jobs[RNG.choice(slugs)])
        return label, lambda: api.call("GET", f"/api/v1/jobs/{job_id}/", user["token"])

    def portal_submit(self):
        user, slug = RNG.choice(self.site.submitters)

        def call():
            job = self.api.call(
                "POST", "/api/v1/jobs/", user["token"], self.site.body(slug), uuid.uuid4().hex
            )
            with self.site.lock:
                self.site.jobs[slug].append(job["id"])
                self.site.own[user["username"]].append(job["id"])
                self.site.submitted.append((user["token"], job["id"]))

        return "portal POST job", call

    def portal_list(self, api: Portal | None = None, label: str = "portal GET jobs (50, state)"):
        api = api or self.api
        user = RNG.choice(self.site.users)
        slug = RNG.choice(user["tenants"])["slug"]
        states = "".join(f"&state={s}" for s in RNG.choice(LIST_FILTERS))
        path = f"/api/v1/jobs/?tenant={slug}{states}&page_size=50"
        return label, lambda: api.call("GET", path, user["token"])

    def portal_quotas(self):
        user = RNG.choice(self.site.users)
        slug = RNG.choice(user["tenants"])["slug"]
        return "portal GET quotas", lambda: self.api.call(
            "GET", f"/api/v1/quotas/?tenant={slug}", user["token"]
        )

    def portal_me(self):
        user = RNG.choice(self.site.users)
        return "portal GET me", lambda: self.api.call("GET", "/api/v1/me/", user["token"])

    def portal_cancel(self):
        with self.site.lock:
            owners = [u for u in self.site.users if self.site.own.get(u["username"])]
            if not owners:
                return self.portal_get_job()
            user = RNG.choice(owners)
            job_id = self.site.own[user["username"]].pop()  # the newest: the likeliest still waiting

        def call():
            try:
                self.api.call("POST", f"/api/v1/jobs/{job_id}/cancel/", user["token"])
            except ApiError as exc:
                if str(exc) != "HTTP 409 conflict":  # ended meanwhile: the contract's answer, not a failure
                    raise

        return "portal POST cancel", call

    def rest_get_job(self):
        job_id = RNG.choice(self.rest_get_ids)
        return "slurmrestd GET job", lambda: self.rest.get_job(job_id)

    def rest_submit(self):
        def call():
            try:
                job_id = self.rest.submit(self.rest_name)
            except peers.PeerError as exc:
                if exc.job_id:  # created despite the error: cancelled at the end like the others
                    with self.lock:
                        self.peer_ids.append(exc.job_id)
                raise
            with self.lock:
                self.peer_ids.append(job_id)
                self.rest_get_ids.append(job_id)

        return "slurmrestd POST submit", call

    def mixed(self):
        kinds = {
            "list_jobs": self.portal_list,
            "get_job": self.portal_get_job,
            "list_quotas": self.portal_quotas,
            "me": self.portal_me,
            "submit": self.portal_submit,
            "cancel": self.portal_cancel,
        }
        kind = RNG.choices([k for k, _ in MIX], weights=[w for _, w in MIX])[0]
        return kinds[kind]()

    # --------------------------------------------------------------- setup --
    def check_headroom(self) -> None:
        """Refuse to start when the run's peer jobs could fill slurmctld's job table (MaxJobCount;
        ended jobs stay in it for MinJobAge): the testbed is shared, and a full table refuses
        everyone's submissions with "Resource temporarily unavailable"."""
        args = self.args
        planned = (
            20
            + ("b" in args.phases) * args.submit_rate * args.duration
            + ("f" in args.phases) * 200 * args.sbatch_seconds
        )
        limit = int(peers.slurm_config(self.ssh_config).get("MaxJobCount", "10000"))
        held = len(self.rest.list_jobs())
        if held + planned > 0.9 * limit:
            raise SystemExit(
                f"slurmctld holds {held} job records of MaxJobCount {limit}; this run adds up to {planned:.0f}. "
                "Wait for MinJobAge to purge ended jobs, or shorten --duration / --sbatch-seconds."
            )

    def setup(self) -> None:
        """Learn job ids to read, give slurmrestd jobs to read, warm every path (untimed)."""
        self.check_headroom()
        for slug in sorted({t["slug"] for u in self.site.users for t in u["tenants"]}):
            user = self.site.member_of(slug)
            page = self.api.call("GET", f"/api/v1/jobs/?tenant={slug}&page_size=200", user["token"])
            self.site.jobs[slug].extend(job["id"] for job in page["results"])
        if not any(self.site.jobs.values()) and self.site.submitters:
            for _ in range(10):
                self.portal_submit()[1]()
        for _ in range(20):
            self.rest_submit()[1]()
        for pick in (
            self.portal_get_job,
            self.portal_list,
            self.portal_quotas,
            self.portal_me,
            self.rest_get_job,
        ):
            for _ in range(WARM_CALLS):  # every web worker imports and connects before the clock
                pick()[1]()

    # -------------------------------------------------------------- phases --
    def settle(self, key: str) -> None:
        """Before a phase: wait (at most SETTLE_MAX_S) until no Celery task waits or runs and the CPU
        quiet, so that a phase's figures are its own and not the backlog of the one before (the
        dispatches of phase b's 3,000 jobs, say). Untimed; the wait is printed."""
        started = time.monotonic()
        queue = self.args.broker_queue
        while time.monotonic() - started < SETTLE_MAX_S:
            # waiting in the queue, or taken by a worker and not yet done (kombu's unacked hash)
            backlog = self.broker.llen(queue) + self.broker.hlen(UNACKED) if self.broker is not None else 0
            pressure = cpu_some_avg10()
            if not backlog and (pressure is None or pressure < SETTLE_PRESSURE):
                break
            time.sleep(1)
        else:
            print(f"\n  (phase {key}: still busy after {SETTLE_MAX_S:g} s; starting anyway)")
        print(
            f"\n  (phase {key} starts after {time.monotonic() - started:.0f} s of settling: {cpu_pressure()})"
        )

    def phase(self, key: str, title: str, streams) -> None:
        self.settle(key)
        cpu_before = cpu_seconds_by_group()
        run_open_loop(key, streams, self.args.duration, self.args.senders, self.rec)
        cpu = cpu_between(cpu_before, cpu_seconds_by_group())
        rows, lag, machine = self.rec.stats(key), self.rec.lag_stats(key), cpu_pressure()
        print_table(f"{key}: {title}", rows, lag)
        print(f"  {machine}")
        portal = sum(r["count"] for name, r in rows.items() if name.startswith(("portal", "floor")))
        per_request = {group: seconds * 1000 / portal for group, seconds in cpu.items()} if portal else {}
        if per_request:
            shares = ", ".join(f"{group} {ms:.2f}" for group, ms in per_request.items())
            print(f"  CPU ms per portal request (the peers' own included where they share a group): {shares}")
        self.results["phases"][key] = {
            "title": title, "endpoints": rows, "lag": lag, "machine": machine,
            "cpu_s": cpu, "cpu_ms_per_request": per_request,
        }  # fmt: skip

    def phase_all_active(self) -> None:
        """Time every active job of the busiest tenant through the pages against one slurmrestd
        list of every job, alternating, --repeat times each."""
        # untimed: which tenant has the most active jobs now (the run's own submits included)
        counts = {slug: len(self._all_active(slug)) for slug in sorted(self.site.jobs)[:300]}
        slug = max(counts, key=counts.get) if counts else None
        if slug is None:
            print("\n== d: no tenant with jobs; skipped")
            return
        pages = rest_jobs = None
        for _ in range(self.args.repeat):
            pages = self._timed(
                "d", f"portal all active ({slug})", lambda: self._all_active(slug, pages=True)
            )
            rest_jobs = self._timed("d", "slurmrestd GET jobs (all)", lambda: len(self.rest.list_jobs()))
        rows = self.rec.stats("d")
        print_table(
            f"d: every active job of {slug} ({counts[slug]} jobs, {pages} pages of 200) vs slurmrestd "
            f"({rest_jobs} jobs, one answer)",
            rows,
        )
        self.results["phases"]["d"] = {
            "tenant": slug,
            "portal_jobs": counts[slug],
            "portal_pages": pages,
            "slurmrestd_jobs": rest_jobs,
            "endpoints": rows,
        }

    def _timed(self, phase: str, endpoint: str, call):
        """call() timed once, closed loop (phase d measures elapsed time, not a rate)."""
        started = time.monotonic()
        try:
            result = call()
        except Exception as exc:  # a failure is a figure of the run
            self.rec.add(phase, endpoint, time.monotonic() - started, type(exc).__name__)
            return None
        self.rec.add(phase, endpoint, time.monotonic() - started)
        return result

    def _all_active(self, slug: str, pages: bool = False):
        user = self.site.member_of(slug)
        path = f"/api/v1/jobs/?tenant={slug}{''.join(f'&state={s}' for s in ACTIVE_STATES)}&page_size=200"
        ids, n = [], 0
        while path and n < 10_000:  # bounded: 2 million jobs at most
            page = self.api.call("GET", path, user["token"])
            ids.extend(job["id"] for job in page["results"])
            n += 1
            nxt = page.get("next")
            path = nxt[nxt.index("/api/") :] if nxt else None
        return n if pages else ids

    def phase_sbatch(self) -> None:
        deadline = time.monotonic() + self.args.sbatch_seconds
        started = time.monotonic()
        count = 0
        while time.monotonic() < deadline:
            t = time.monotonic()
            try:
                self.peer_ids.append(self.sbatch.submit(self.ssh_name))
                self.rec.add("f", "sbatch over SSH", time.monotonic() - t)
            except Exception as exc:
                self.rec.add("f", "sbatch over SSH", time.monotonic() - t, type(exc).__name__)
            count += 1
        rate = count / (time.monotonic() - started)
        rows = self.rec.stats("f")
        print_table(f"f: sbatch over SSH in a loop: {rate:.1f} jobs/s", rows)
        self.results["phases"]["f"] = {"jobs_per_s": rate, "endpoints": rows}

    def run(self, rss: RssSampler) -> None:
        rate, phases = self.args.rate, self.args.phases
        rss.start()
        try:
            self.setup()
            if "a" in phases:
                self.phase(
                    "a",
                    f"get a job, portal vs slurmrestd, {rate:g}/s each",
                    [(rate, self.portal_get_job), (rate, self.rest_get_job)],
                )
            if "b" in phases:
                submit_rate = self.args.submit_rate
                self.phase(
                    "b",
                    f"submit, portal vs slurmrestd, {submit_rate:g}/s each (the portal's dispatched meanwhile)",
                    [(submit_rate, self.portal_submit), (submit_rate, self.rest_submit)],
                )
            if "c" in phases:
                self.phase(
                    "c", f"a tenant's job list, page of 50, by state, {rate:g}/s", [(rate, self.portal_list)]
                )
            if "d" in phases:
                self.phase_all_active()
            if "e" in phases:
                mix = ", ".join(f"{k} {w}%" for k, w in MIX)
                self.phase("e", f"mixed load {rate:g}/s ({mix})", [(rate, self.mixed)])
            if "f" in phases:
                self.phase_sbatch()
            if "g" in phases or "h" in phases:
                self.phases_floor()
            if "i" in phases:
                sla = self.args.sla_rate
                self.phase("i", f"mixed load {sla:g}/s, the SLA's rate", [(sla, self.mixed)])
            if "k" in phases:
                capacity.phase_capacity(self)
            if "o" in phases:
                capacity.phase_overload(self)
        finally:
            rss.stop()
            if not self.args.keep_jobs:
                self.cleanup()
        self.results["rss"] = rss.summary()
        self.results["targets"] = targets(self.results)

    def phases_floor(self) -> None:
        """Phases g and h: a and c's requests to the floor's own gunicorn (bench/floor_views.py)."""
        rate, port = self.args.rate, self.args.floor_port
        with FloorServer(port, Path(self.args.stack_dir)) as url:
            floor = Portal(url)

            def floor_get():
                return self.portal_get_job(floor, "floor GET job")

            def floor_list():
                return self.portal_list(floor, "floor GET jobs (50, state)")

            for _ in range(WARM_CALLS):
                floor_get()[1]()
                floor_list()[1]()
            if "g" in self.args.phases:
                self.phase("g", f"get a job, the floor vs slurmrestd, {rate:g}/s each",
                           [(rate, floor_get), (rate, self.rest_get_job)])  # fmt: skip
            if "h" in self.args.phases:
                self.phase("h", f"a tenant's job list on the floor, page of 50, by state, {rate:g}/s",
                           [(rate, floor_list)])  # fmt: skip

    def cleanup(self) -> None:
        """Cancel the run's portal jobs (an ended one answers 409: fine) and its peer jobs."""
        with ThreadPoolExecutor(max_workers=8) as pool:
            for token, job_id in self.site.submitted:
                pool.submit(self._cancel_quietly, token, job_id)
        if self.peer_ids:
            self.sbatch.cancel(self.peer_ids)
        for name in (self.rest_name, self.ssh_name):  # submissions that timed out here yet reached Slurm
            self.sbatch.cancel_named(name)
        print(
            f"\ncancelled {len(self.site.submitted)} portal jobs and {len(self.peer_ids)} peer jobs of the run"
        )

    def _cancel_quietly(self, token: str, job_id: str) -> None:
        with contextlib.suppress(ApiError):
            self.api.call("POST", f"/api/v1/jobs/{job_id}/cancel/", token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SITE_URL", "http://127.0.0.1:8765"))
    parser.add_argument("--site", default=str(ROOT / "var" / "bench" / "site.json"))
    parser.add_argument("--stack-dir", default=os.environ.get("STACK_DIR", str(ROOT / "var" / "stack")))
    parser.add_argument("--testbed-env", default=str(ROOT / "var" / "testbed" / "testbed.env"))
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s per stream")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per open-loop phase")
    parser.add_argument("--phases", default="abcdefghiko")
    parser.add_argument("--submit-rate", type=float, default=50.0, help="phase b: submissions/s")
    parser.add_argument("--sla-rate", type=float, default=150.0, help="phase i: the mix's rate")
    parser.add_argument("--capacity-rates", default="100,150,200,250,300,350,400,500,600,800")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="phase k: seconds per rate")
    parser.add_argument(
        "--overload-rate", type=float, default=400.0, help="phase o's rate when phase k did not run"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds of phase d")
    parser.add_argument("--sbatch-seconds", type=float, default=5.0)
    parser.add_argument(
        "--senders", type=int, default=200, help="sender threads (the most requests in flight)"
    )
    parser.add_argument("--rss-interval", type=float, default=5.0)
    parser.add_argument(
        "--broker-queue", default="celery", help="the Celery queue whose backlog settle waits out"
    )
    parser.add_argument("--floor-port", type=int, default=8771, help="the floor's gunicorn (phases g, h)")
    parser.add_argument("--keep-jobs", action="store_true", help="do not cancel the run's jobs at the end")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    load = Load(args, Site(json.loads(Path(args.site).read_text())))
    load.run(RssSampler(Path(args.stack_dir), args.rss_interval))
    print_summary(load.results)
    if args.json:
        Path(args.json).write_text(json.dumps(load.results, indent=1, default=str))


if __name__ == "__main__":
    main()
