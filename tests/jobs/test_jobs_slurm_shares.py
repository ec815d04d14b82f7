"""Shares of a GPU on the real Slurm testbed (issue [Share]): its node whose H200s are split into
MIG instances (typed GRES, as AutoDetect=nvml names them) and shards (gres/shard). Jobs go
through the API, a real Celery worker and sbatch over SSH; Slurm's own limits are read back
with sacctmgr and judged by what Slurm does with a job over them."""

import uuid
from decimal import Decimal

import pytest

from clusters.backends.slurm import SlurmBackend
from clusters.models import GpuModel, Scenario
from clusters.services import cluster_config
from jobs.models import Job
from tenants.limits import tenant_apply
from tenants.models import QuotaGrant, Role, Tenant
from tests.conftest import join
from tests.factories import QuotaGrantFactory
from tests.jobs_support import api_submit, follow
from tests.slurm_support import job_spec
from tests.testbed.env import testbed_env
from tests.wait_support import wait_until

PRINT_SHARE = "#!/bin/bash\necho gres=$SLURM_JOB_GPUS shards=${SLURM_SHARDS_ON_NODE:-0} gpus=$SLURM_GPUS_ON_NODE\nsleep 2\n"


@pytest.fixture
def share_tenant(testbed):
    """A tenant of its own (Slurm accounts outlive the test database) with a grant of one MIG
    3g.71gb instance, one of two shards and one of slices (which Slurm does not give), on the
    testbed's H200 node; applied to Slurm."""
    tenant = Tenant.objects.create(slug=f"share-{uuid.uuid4().hex[:8]}", name="Shares")
    user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
    pair = (Scenario.objects.get(slug="ai-training"), GpuModel.objects.get(slug="h200"))
    QuotaGrantFactory(tenant=tenant, pair=pair, share="mig", mig_profile="3g.71gb", gpus=1, gpu_hours=10)
    QuotaGrantFactory(tenant=tenant, pair=pair, share="shard", gpus=2, gpu_hours=10)
    QuotaGrantFactory(tenant=tenant, pair=pair, share="slice", gpus=5, gpu_hours=10)  # Kubernetes' alone
    tenant_apply(tenant_id=tenant.pk, cluster_id=testbed.pk)
    yield tenant, user
    backend = SlurmBackend(cluster_config(testbed))
    for job in Job.objects.filter(tenant=tenant).exclude(backend_id=""):
        backend.check(["scancel", job.backend_id])
    backend.check(["scancel", "--account", tenant.slug])
    backend.check(["sacctmgr", "-i", "delete", "account", tenant.slug])


def submit(client, tenant: Tenant, **fields) -> dict:
    share_partition = testbed_env()["SLURM_TESTBED_SHARE_PARTITION"]
    on_testbed = {
        "tenant": tenant.slug, "cluster": "testbed", "partition": share_partition, "gpu_model": "h200",
        "name": "share", "script": PRINT_SHARE, "gpus": 1,
    }  # fmt: skip
    return api_submit(client, **on_testbed | fields)


def test_slurm_holds_the_tenants_typed_mig_and_shard_limits(testbed, share_tenant):
    tenant, _user = share_tenant
    backend = SlurmBackend(cluster_config(testbed))
    rows = backend.check(
        ["sacctmgr", "-P", "-n", "show", "assoc", "where", f"account={tenant.slug}", "format=User,GrpTRES"]
    )
    account_tres = next(
        tres for user, _bar, tres in (r.partition("|") for r in rows.splitlines()) if not user
    )
    limits = dict(item.split("=") for item in account_tres.split(","))
    assert limits["gres/gpu:3g.71gb"] == "1"
    assert limits["gres/shard"] == "2"
    assert limits["gres/gpu:1g.18gb"] == "0" and limits["gres/gpu:h200"] == "0"  # not granted: none
    assert limits["gres/gpu"] == "1"  # the MIG instance; the slices are no Slurm GPUs


def test_a_mig_job_gets_its_instance_and_is_charged_half_a_device(
    celery_worker, client_for, testbed, share_tenant
):
    tenant, user = share_tenant
    client = client_for(user)
    job = submit(client, tenant, share="mig", mig_profile="3g.71gb")
    assert job["device_fraction"] == 0.5
    assert job["gpu_hours_reserved"] == 0.05  # 1 instance × 0.5 × 5 minutes, rounded up
    done = follow(client, job["id"], testbed.pk, {"COMPLETED", "FAILED", "REJECTED"}, timeout_s=90)
    assert (done["state"], done["exit_code"]) == ("COMPLETED", 0), done
    line = client.get(f"/api/v1/jobs/{job['id']}/log/?tail=5").json()["lines"][0]
    assert line.startswith("gres=") and line.endswith("shards=0 gpus=1"), line  # one typed GPU: the instance
    elapsed_h = (
        Decimal(
            (
                Job.objects.get(pk=job["id"]).finished_at - Job.objects.get(pk=job["id"]).started_at
            ).total_seconds()
        )
        / 3600
    )
    assert Decimal(str(done["gpu_hours"])) == (elapsed_h * Decimal("0.5")).quantize(Decimal("0.0001"))
    grant = QuotaGrant.objects.get(tenant=tenant, share="mig")
    assert (grant.gpus_in_use, grant.gpu_hours_reserved) == (0, 0)
    assert grant.gpu_hours_used == Decimal(str(done["gpu_hours"]))


def test_a_shard_job_gets_shards_of_a_device(celery_worker, client_for, testbed, share_tenant):
    tenant, user = share_tenant
    client = client_for(user)
    job = submit(client, tenant, share="shard", gpus=2)
    assert job["device_fraction"] == 0.25  # 4 shards per GPU on this partition
    done = follow(client, job["id"], testbed.pk, {"COMPLETED", "FAILED", "REJECTED"}, timeout_s=90)
    assert (done["state"], done["exit_code"]) == ("COMPLETED", 0), done
    line = client.get(f"/api/v1/jobs/{job['id']}/log/?tail=5").json()["lines"][0]
    assert "shards=2" in line, line


def test_slurm_refuses_to_start_a_share_over_the_tenants_limit(testbed, share_tenant):
    """Past the portal (which would answer 409), straight to sbatch as the tenant's identity: Slurm
    itself holds a job asking for 2 instances of a 1-instance limit, and one asking for 3 shards
    of a 2-shard limit, with its association-limit reason; neither ever runs."""
    tenant, _user = share_tenant
    backend = SlurmBackend(cluster_config(testbed))
    share_partition = testbed_env()["SLURM_TESTBED_SHARE_PARTITION"]
    common = {
        "account": tenant.slug, "user": f"pt-{tenant.slug}", "qos": f"portal-{tenant.tier}",
        "partition": share_partition, "gpu_type": "h200",
    }  # fmt: skip
    over = [
        job_spec("sleep 1", **common, share="mig", mig_profile="3g.71gb", gpus_per_node=2),
        job_spec("sleep 1", **common, share="shard", gpus_per_node=3),
    ]
    ids = [backend.submit(spec) for spec in over]

    def held():
        statuses = backend.poll(ids)
        if all(s.state == "PENDING" and s.reason.startswith("AssocGrp") for s in statuses.values()):
            return statuses
        return None

    statuses = wait_until(held, timeout_s=30, interval_s=0.5, what="Slurm to hold both jobs on the limit")
    assert {s.reason for s in statuses.values()} <= {"AssocGrpGRES", "AssocGrpGRESMinutes"}
    # within the limit, the same share starts
    within = backend.submit(
        job_spec("sleep 1", **common, share="mig", mig_profile="3g.71gb", gpus_per_node=1)
    )
    wait_until(
        lambda: (
            backend.poll([within]).get(within, None) and backend.poll([within])[within].state != "PENDING"
        ),
        timeout_s=30,
        interval_s=0.5,
        what="the job within the limit to start",
    )
