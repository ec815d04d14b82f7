"""End to end on the real Slurm testbed: the API, a real Celery worker on Redis, sbatch over SSH."""

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.backends.base import ClusterConfig
from clusters.backends.slurm import SlurmBackend
from clusters.services import cluster_config
from jobs.models import Job
from jobs.services.admission import jobs_admit_marked
from jobs.tasks import sweep_jobs
from portal.celery import app
from tenants.limits import tenant_apply
from tenants.models import QuotaGrant, Role, Tenant
from tests.conftest import ROOT, database_url_of_test_db, join, start_celery_worker, stop
from tests.factories import QuotaGrantFactory
from tests.jobs_support import api_submit
from tests.jobs_support import follow as follow_job

SCRIPT = "#!/bin/bash\necho gpus=$CUDA_VISIBLE_DEVICES\nsleep 2\n"


def run_on_cluster(config: ClusterConfig, argv: list[str]) -> str:
    backend = SlurmBackend(config)
    return backend.check(argv)  # the backend's own quoted SSH path


@pytest.fixture
def slurm_tenant(testbed, catalog):
    """A tenant of its own per test (Slurm accounts outlive the test database), applied to Slurm."""
    tenant = Tenant.objects.create(slug=f"e2e-{uuid.uuid4().hex[:8]}", name="E2E")
    user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
    QuotaGrantFactory(tenant=tenant, pair=catalog)
    tenant_apply(tenant_id=tenant.pk, cluster_id=testbed.pk)
    yield tenant, user
    config = cluster_config(testbed)
    for job in Job.objects.filter(tenant=tenant).exclude(backend_id=""):
        run_on_cluster(config, ["scancel", job.backend_id])
    run_on_cluster(config, ["sacctmgr", "-i", "delete", "account", tenant.slug])


def submit(client, tenant: Tenant, **fields) -> dict:
    on_testbed = {"tenant": tenant.slug, "cluster": "testbed", "name": "e2e", "script": SCRIPT}
    return api_submit(client, **on_testbed | fields)


def follow(client, job_id: str, cluster_id: int, until: set[str], timeout_s: float = 90) -> dict:
    return follow_job(client, job_id, cluster_id, until, timeout_s)


def test_submit_runs_to_completed_with_gpu_hours_charged(celery_worker, client_for, testbed, slurm_tenant):
    tenant, user = slurm_tenant
    client = client_for(user)
    job = submit(client, tenant)
    done = follow(client, job["id"], testbed.pk, {"COMPLETED", "FAILED", "REJECTED"})
    assert (done["state"], done["exit_code"]) == ("COMPLETED", 0), done
    assert done["backend_id"].isdigit()
    assert done["started_at"] and done["finished_at"] and done["gpu_hours"] > 0
    events = client.get(f"/api/v1/jobs/{job['id']}/events/").json()
    # RUNNING whether or not a poll saw it: at sacct's Start, in order
    assert [e["to_state"] for e in events][:3] == ["QUEUED", "SUBMITTING", "PENDING"]
    assert [e["to_state"] for e in events][-2:] == ["RUNNING", "COMPLETED"]
    assert events[-2]["at"] == done["started_at"]
    lines = client.get(f"/api/v1/jobs/{job['id']}/log/?tail=5").json()["lines"]
    assert len(lines[0].removeprefix("gpus=").split(",")) == 2  # Slurm gave it two GPUs
    grant = QuotaGrant.objects.get(tenant=tenant)
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)
    assert grant.gpu_hours_used > 0


def test_a_failing_script_ends_failed_with_its_exit_code(celery_worker, client_for, testbed, slurm_tenant):
    tenant, user = slurm_tenant
    client = client_for(user)
    job = submit(client, tenant, script="#!/bin/bash\nexit 3\n")
    done = follow(client, job["id"], testbed.pk, {"COMPLETED", "FAILED", "REJECTED"})
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)


def test_cancel_a_running_job(celery_worker, client_for, testbed, slurm_tenant):
    tenant, user = slurm_tenant
    client = client_for(user)
    job = submit(client, tenant, script="#!/bin/bash\nsleep 300\n")
    follow(client, job["id"], testbed.pk, {"RUNNING"})
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel/").status_code == 202
    done = follow(client, job["id"], testbed.pk, {"CANCELLED"}, timeout_s=60)
    assert done["finished_at"]


def test_slurms_own_limit_shows_as_the_pending_reason(celery_worker, client_for, testbed, slurm_tenant):
    """The site lowered the account's GrpTRES below the portal's grant: Slurm holds the job."""
    tenant, user = slurm_tenant
    config = cluster_config(testbed)
    run_on_cluster(config, ["sacctmgr", "-i", "modify", "account", tenant.slug, "set", "GrpTRES=gres/gpu=1"])
    client = client_for(user)
    job = submit(client, tenant, script="#!/bin/bash\nsleep 30\n")
    pending = follow(client, job["id"], testbed.pk, {"PENDING"})
    deadline = time.monotonic() + 30
    while not pending["reason"].startswith("AssocGrp") and time.monotonic() < deadline:
        pending = follow(client, job["id"], testbed.pk, {"PENDING"})
    assert pending["reason"].startswith("AssocGrp"), pending


def test_walltime_ends_in_timeout(celery_worker, client_for, testbed, slurm_tenant):
    tenant, user = slurm_tenant
    client = client_for(user)
    job = submit(client, tenant, walltime_minutes=1, script="#!/bin/bash\nsleep 600\n")
    done = follow(client, job["id"], testbed.pk, {"TIMEOUT", "COMPLETED", "FAILED"}, timeout_s=240)
    assert done["state"] == "TIMEOUT"


CRASH_AFTER_SBATCH = """
import os, signal, django
django.setup()
from clusters.services import backend_of
from jobs.services import job_claim, spec_of
job = job_claim({job_id})
backend_of(job.cluster).submit(spec_of(job))
os.kill(os.getpid(), signal.SIGKILL)  # dies after sbatch, before the id is saved
"""


def test_a_worker_killed_between_sbatch_and_saving_the_id_leaves_one_slurm_job(
    client_for, testbed, slurm_tenant, tmp_path
):
    tenant, user = slurm_tenant
    client = client_for(user)
    app.control.purge()
    job = submit(client, tenant, script="#!/bin/bash\nsleep 20\n")  # no worker yet
    jobs_admit_marked(partition_id=Job.objects.get(pk=job["id"]).partition_id)  # dispatch waits in Redis
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url_of_test_db()}
    crash = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_SBATCH.format(job_id=job["id"])],
        cwd=ROOT, env=env, timeout=60, capture_output=True, text=True,
    )  # fmt: skip
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    stored = Job.objects.get(pk=job["id"])
    assert (stored.state, stored.backend_id) == ("SUBMITTING", "")

    def in_slurm() -> list[str]:
        argv = ["squeue", "-h", "-t", "all", "-A", tenant.slug, "-o", "%i|%k"]
        return run_on_cluster(cluster_config(testbed), argv).split()

    assert len(in_slurm()) == 1
    # Recovery, once the dead dispatcher's lease has run out (as if JOB_DISPATCH_LEASE_S had
    # passed): the message still in the queue, or the sweep's, dispatches again, and
    # find(token) adopts the job that the dead worker submitted instead of submitting another.
    Job.objects.filter(pk=stored.pk).update(dispatch_lease_until=timezone.now() - timedelta(seconds=1))
    worker = start_celery_worker(tmp_path / "worker.log")
    try:
        sweep_jobs.delay().get(timeout=30)
        deadline = time.monotonic() + 60
        while Job.objects.get(pk=stored.pk).state == "SUBMITTING" and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        stop(worker)
    recovered = Job.objects.get(pk=stored.pk)
    assert recovered.state in ("PENDING", "RUNNING", "COMPLETED"), (tmp_path / "worker.log").read_text()[
        -2000:
    ]
    assert in_slurm() == [f"{recovered.backend_id}|{recovered.token}"]
