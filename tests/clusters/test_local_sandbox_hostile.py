"""A hostile tenant's job on the local cluster, judged by effect from outside.

Tenant A's job tries what a job run as the portal's own user could do before the sandbox: read
the signing key through `../../../../secret_key`, the settings and the repository, write into
VAR_DIR, read and overwrite tenant B's output, read the worker's environment and other processes
through /proc, kill a process of the portal's user, forge the portal's records of its own job,
turn its log into a link to the secret key, and reach the broker on the loopback. Every attempt
prints what it got; the test then reads A's log, B's files, VAR_DIR, Redis and the victim
process from outside. The backend is configured exactly as the portal configures it
(clusters.services.cluster_config), so its state lives under the real VAR_DIR.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from clusters.backends.base import END_STATES, JobRef, JobSpec, JobState
from clusters.backends.local import LocalBackend
from clusters.models import Cluster
from clusters.services import cluster_config
from tests.local_support import wait_until_gone

A, B = "tenant-a", "tenant-b"


def spec(token: str, account: str, script: str) -> JobSpec:
    return JobSpec(
        token=token, name=f"job {token}", account=account, qos="portal-normal", priority="normal",
        partition="local", gpu_type="local", k8s_resource="", k8s_product="", gpus_per_node=1, nodes=1,
        walltime_minutes=5, script=script, env={"JOB_OWN": "fine"},
    )  # fmt: skip


def wait_end(backend: LocalBackend, backend_id: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = backend.poll([backend_id]).get(backend_id)
        if status is not None and status.state in END_STATES:
            return status
        time.sleep(0.1)
    raise AssertionError(f"{backend_id} did not end in {timeout_s}s")


def log_of(backend: LocalBackend, backend_id: str, token: str, account: str) -> str:
    tail = backend.log_tail(JobRef(backend_id, token, account), lines=10_000, max_bytes=1_000_000)
    return "\n".join(tail.lines)


@pytest.fixture
def backend():
    """The local cluster as the portal configures it: state under VAR_DIR/local-cluster/<slug>."""
    slug = f"hostile-{secrets.token_hex(4)}"
    backend = LocalBackend(
        cluster_config(Cluster(slug=slug, name=slug, kind="local", local_gpus=4)), grace_s=1
    )
    yield backend
    for job in backend.list_jobs([A, B]):
        backend.cancel(job.backend_id)
    shutil.rmtree(settings.VAR_DIR / "local-cluster" / slug, ignore_errors=True)


@pytest.fixture
def victim():
    """A process of the portal's own user that a job must not be able to signal."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def canary():
    """A secret in the worker's environment (this process stands in for the Celery worker)."""
    value = f"canary-{secrets.token_hex(16)}"
    os.environ["PORTAL_HOSTILE_CANARY"] = value
    yield value
    del os.environ["PORTAL_HOSTILE_CANARY"]


def hostile_script(*, b_dir: Path, b_token: str, token: str, planted: Path, victim_pid: int) -> str:
    """Each attack prints what it read, or says it failed; none stops the script."""
    var_dir, repo = settings.VAR_DIR, settings.BASE_DIR
    redis_port = int(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15").rsplit(":", 1)[1].split("/")[0])
    return f"""#!/bin/bash
echo HOSTILE-START uid=$(id -u) cwd=$PWD
echo "== secret key"
cat ../../../../secret_key {var_dir}/secret_key 2>&1
echo "== settings and repository"
cat {repo}/portal/settings.py {repo}/tests/settings.py 2>&1 | head -50
ls {repo} {var_dir} / 2>&1
echo "== write into VAR_DIR"
echo pwned > {planted} 2>&1 || echo write-planted-failed
echo pwned > {var_dir}/pwned 2>&1 || echo write-var-failed
echo pwned > ../../../../pwned 2>&1 || echo write-relative-failed
echo "== tenant B's output"
cat {b_dir}/result.txt {b_dir}/{b_token}.out ../{b_token}/result.txt 2>&1
find / -name result.txt -not -path '/proc/*' 2>/dev/null | xargs -r cat
echo overwritten > {b_dir}/result.txt 2>&1 || echo overwrite-b-failed
echo overwritten > ../{b_token}/result.txt 2>&1 || echo overwrite-b-relative-failed
echo "== environment and processes"
env
cat /proc/1/environ /proc/{os.getpid()}/environ 2>&1 | tr '\\0' '\\n'
for p in /proc/[0-9]*; do echo "proc $(basename $p): $(tr '\\0' ' ' < $p/cmdline 2>/dev/null)"; done
kill -KILL {victim_pid} 2>&1 || echo kill-victim-failed
echo "== the portal's records and the log"
ls -la /job/.portal 2>&1
echo '{{"pid": 1, "pgid": 1}}' > /job/.portal/proc.json 2>&1 || echo forge-failed
mv /job/.portal /job/moved 2>&1 || echo move-records-failed
rm -f /job/{token}.out 2>&1 || echo unlink-log-failed
ln -sf {var_dir}/secret_key /job/{token}.out 2>&1 || echo link-log-failed
for fd in /proc/self/fd/*; do ls "$fd/.portal" 2>/dev/null; done
echo "== the broker on the loopback"
(exec 3<>/dev/tcp/127.0.0.1/{redis_port} && printf 'SET hostile-{token} pwned\\r\\n' >&3 && echo broker-reached) 2>&1
echo HOSTILE-END
exit 0
"""


def test_a_hostile_job_reaches_nothing_of_the_portal_nor_of_another_tenant(backend, victim, canary):
    assert backend.sandbox.ok, backend.sandbox.detail  # CI installs bubblewrap: no sandbox is a failure
    b_secret = f"b-secret-{secrets.token_hex(8)}"
    b_id = backend.submit(spec("b-job", B, f"echo {b_secret} > result.txt\necho {b_secret}\nsleep 60\n"))
    b_dir = Path(backend.config.state_dir) / "jobs" / "b-job"
    deadline = time.monotonic() + 20
    while not (b_dir / "result.txt").exists():
        assert time.monotonic() < deadline, "tenant B's job never wrote its result"
        time.sleep(0.05)
    planted = settings.VAR_DIR / f"planted-{secrets.token_hex(4)}.sqlite3"
    planted.write_text("the portal's database")
    key_file = settings.VAR_DIR / "secret_key"
    key = key_file.read_text().strip()
    settings_text = (settings.BASE_DIR / "portal" / "settings" / "base.py").read_text()
    broker = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
    try:
        script = hostile_script(
            b_dir=b_dir, b_token="b-job", token="a-job", planted=planted, victim_pid=victim.pid
        )
        a_id = backend.submit(spec("a-job", A, script))
        status = wait_end(backend, a_id)
        log = log_of(backend, a_id, "a-job", A)

        # It ran, to its end, and its records are the portal's: the state and exit code are right.
        assert "HOSTILE-START" in log and "HOSTILE-END" in log, log
        assert (status.state, status.exit_code) == (JobState.COMPLETED, 0)
        # Nothing of the portal's reached its log.
        for secret in (key, settings.SECRET_KEY, canary, b_secret, os.environ.get("DATABASE_URL", "")):
            assert secret and secret not in log
        assert "def _secret_key()" in settings_text and "def _secret_key()" not in log  # the settings
        assert "pytest" not in log  # no process of the host is visible
        assert "JOB_OWN=fine" in log  # its own environment, and nothing else of the worker's
        assert "DJANGO_SETTINGS_MODULE" not in log and "REDIS_URL" not in log
        # Nothing of the portal's or of tenant B's changed.
        assert planted.read_text() == "the portal's database"
        assert not (settings.VAR_DIR / "pwned").exists()
        assert key_file.read_text().strip() == key
        assert (b_dir / "result.txt").read_text().strip() == b_secret
        assert victim.poll() is None  # still running
        assert broker.get("hostile-a-job") is None
        assert "broker-reached" not in log
        a_dir = Path(backend.config.state_dir) / "jobs" / "a-job"
        assert (a_dir / ".portal" / "job.json").is_file() and not (a_dir / "moved").exists()
        assert not (a_dir / "a-job.out").is_symlink()
        assert backend.find("a-job") == a_id
        # B's job, still running, was not touched either.
        assert backend.poll([b_id])[b_id].state == "RUNNING"
        assert b_secret in log_of(backend, b_id, "b-job", B)
    finally:
        planted.unlink()
        backend.cancel(b_id)


def test_as_root_each_tenant_runs_as_a_uid_of_its_own(backend):
    assert backend.sandbox.ok, backend.sandbox.detail
    ids = {}
    for token, account in (("a-1", A), ("a-2", A), ("b-1", B)):
        ids[token] = backend.submit(spec(token, account, "id -u\nid -G\ntouch made-here\n"))
    for backend_id in ids.values():
        assert wait_end(backend, backend_id).state == JobState.COMPLETED
    jobs = Path(backend.config.state_dir) / "jobs"
    owners = {token: (jobs / token / "made-here").stat().st_uid for token in ids}
    printed = {token: log_of(backend, ids[token], token, A).splitlines() for token in ids}

    for token, uid in owners.items():
        assert printed[token][0] == str(uid)  # as the job saw itself, as the host sees its files
    if os.geteuid() == 0:
        assert owners["a-1"] == owners["a-2"]  # a tenant's uid is kept
        assert owners["b-1"] != owners["a-1"]
        assert 0 not in owners.values()
        assert all(uid >= settings.LOCAL_SANDBOX_UID_BASE for uid in owners.values())
        assert all(line[1] == printed[token][0] for token, line in printed.items())  # no other group
    else:  # without root there is no uid to give: the portal's own, inside the sandbox
        assert set(owners.values()) == {os.geteuid()}


def test_a_cancelled_job_gets_sigterm_inside_the_sandbox(backend):
    script = "trap 'echo got-term; exit 9' TERM\necho started\nsleep 300 &\nwait\n"
    backend_id = backend.submit(spec("term", A, script))
    deadline = time.monotonic() + 20
    while "started" not in log_of(backend, backend_id, "term", A):
        assert time.monotonic() < deadline
        time.sleep(0.05)

    started = time.monotonic()
    backend.cancel(backend_id)

    assert time.monotonic() - started < 1.5  # no wait for the grace period: the job obeyed at once
    assert log_of(backend, backend_id, "term", A).splitlines()[-1] == "got-term"
    status = backend.poll([backend_id])[backend_id]
    assert (status.state, status.exit_code) == ("CANCELLED", 9)


def test_a_job_that_ignores_sigterm_is_killed_with_its_whole_sandbox(backend):
    backend_id = backend.submit(spec("stubborn", A, "trap '' TERM\necho started\nsleep 300 &\nwait\n"))
    deadline = time.monotonic() + 20
    while "started" not in log_of(backend, backend_id, "stubborn", A):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc = json.loads(
        (Path(backend.config.state_dir) / "jobs" / "stubborn" / ".portal" / "proc.json").read_text()
    )

    backend.cancel(backend_id)

    assert backend.poll([backend_id])[backend_id].state == "CANCELLED"
    wait_until_gone(proc["pgid"], include_zombies=False)  # bwrap, its init, bash and sleep


def test_a_site_path_shown_read_only_never_shows_the_portals_state_or_other_tenants_scratch():
    """LOCAL_SANDBOX_RO_PATHS showing a tree that also holds the scratch root and the cluster's
    state: the job reads the tree, writes nothing there, and sees neither of those."""
    site = Path(tempfile.mkdtemp(prefix="portal-site-", dir="/var/tmp"))  # bwrap must traverse it
    try:
        site.chmod(0o755)
        (site / "dataset.txt").write_text("shared data\n")
        slug = f"site-{secrets.token_hex(4)}"
        config = cluster_config(Cluster(slug=slug, name=slug, kind="local", local_gpus=2))
        config = dataclasses.replace(
            config,
            state_dir=str(site / "state"),
            scratch_root=str(site / "scratch"),
            local_sandbox_ro_paths=(str(site),),
        )
        backend = LocalBackend(config, grace_s=1)
        other = site / "scratch" / B / "results.txt"
        other.parent.mkdir(parents=True)
        other.write_text("tenant B's results\n")
        script = (
            f"cat {site}/dataset.txt\n"
            f"cat {other} 2>&1; ls {site}/scratch {site}/state 2>&1\n"
            f"echo changed > {site}/dataset.txt 2>&1 || echo write-failed\n"
            "echo DONE\n"
        )
        backend_id = backend.submit(spec("reader", A, script))
        status = wait_end(backend, backend_id)
        log = log_of(backend, backend_id, "reader", A)

        assert status.state == JobState.COMPLETED and log.endswith("DONE"), log
        assert "shared data" in log and "write-failed" in log
        assert "tenant B's results" not in log
        assert "alloc.json" not in log and "\nids\n" not in log  # the state directory's entries
        assert (site / "dataset.txt").read_text() == "shared data\n"
    finally:
        shutil.rmtree(site, ignore_errors=True)


def test_the_issues_attack_through_the_api_prints_no_signing_key(
    celery_worker, client_for, member, local_partition, grant
):
    """The attack as reported: a job printed the signing key through the log API."""
    from tests.jobs_support import api_submit, follow

    client = client_for(member)
    key = (settings.VAR_DIR / "secret_key").read_text().strip()
    script = "#!/bin/bash\necho MARK-1\ncat ../../../../secret_key\ntr '\\0' '\\n' < /proc/1/environ\necho MARK-2\n"
    job = api_submit(client, script=script)
    done = follow(client, job["id"], local_partition.cluster_id, {"COMPLETED", "FAILED"})
    lines = client.get(f"/api/v1/jobs/{job['id']}/log/?tail=50").json()["lines"]

    assert done["state"] == "COMPLETED"  # cat's failure is not the script's last word
    assert lines[0] == "MARK-1" and lines[-1] == "MARK-2", lines
    assert not any(key in line or settings.SECRET_KEY in line for line in lines)
    assert not any("DATABASE_URL" in line or "REDIS_URL" in line for line in lines)
