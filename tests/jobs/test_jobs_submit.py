"""POST /api/v1/jobs/: validation, quota, priority caps, idempotency, admission order, cancel."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.models import Job, JobEvent, JobState
from jobs.services import job_claim, jobs_admit
from jobs.services.admission import admission_order, jobs_admit_marked
from portal.core.models import AuditEvent
from tenants.models import QuotaGrant, Role, Tenant
from tests.conftest import join
from tests.factories import ClusterFactory, JobFactory, PartitionFactory, QuotaGrantFactory

pytestmark = [pytest.mark.django_db, pytest.mark.grant(gpus=8)]

SCRIPT = "#!/bin/bash\necho hello\n"


@pytest.fixture
def partition(catalog):
    """One node of 8 GPUs on the local cluster "local"."""
    return PartitionFactory(cluster=ClusterFactory(slug="local"), gpu_model=catalog[1])


def body(**overrides) -> dict:
    return {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 2,
        "walltime_minutes": 60, "name": "train-1", "script": SCRIPT,
    } | overrides  # fmt: skip


def submitted_and_admitted(client, **fields) -> dict:
    """POST a job, then the admission pass that the admit task it sent runs: the job's answer."""
    response = client.post("/api/v1/jobs/", body(**fields), format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    jobs_admit_marked(partition_id=Job.objects.get(pk=job["id"]).partition_id)
    return client.get(f"/api/v1/jobs/{job['id']}/").json()


def test_submit_reserves_gpus_times_walltime_and_is_admitted(client_for, member, partition, grant):
    response = client_for(member).post("/api/v1/jobs/", body(env={"MY_VAR": "x"}), format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["state"] == "QUEUED" and job["reason"] == ""
    assert (job["cluster"], job["partition"], job["gpu_hours_reserved"]) == ("local", "local", 2.0)
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (Decimal(2), 0)  # admission is the task's
    assert jobs_admit_marked(partition_id=partition.pk) == [int(job["id"])]
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (Decimal(2), 2)
    stored = Job.objects.get(pk=job["id"])
    assert (
        stored.holds_gpus and stored.env["MY_VAR"] == "x" and "NCCL_DEBUG" in stored.env
    )  # scenario defaults
    assert list(stored.events.values_list("to_state", flat=True)) == ["QUEUED"]
    assert AuditEvent.objects.filter(action="job.submit", target_id=job["id"]).exists()


def test_no_grant_is_409_no_quota(client_for, member, partition):
    response = client_for(member).post("/api/v1/jobs/", body(), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "no_quota"


def test_too_few_hours_is_409_quota_exhausted_with_the_figures(
    client_for, member, partition, tenant, catalog
):
    QuotaGrantFactory(tenant=tenant, gpus=8, gpu_hours=1)
    response = client_for(member).post("/api/v1/jobs/", body(), format="json")
    assert response.status_code == 409
    problem = response.json()
    assert problem["code"] == "quota_exhausted"
    assert (problem["gpu_hours_requested"], problem["gpu_hours_remaining"]) == ("2.00", "1.0000")
    assert not Job.objects.exists()


def test_concurrent_limit_full_leaves_the_job_queued_with_quota_wait(
    client_for, member, partition, tenant, catalog
):
    QuotaGrantFactory(tenant=tenant, gpus=2)
    client = client_for(member)
    assert submitted_and_admitted(client)["reason"] == ""
    second = submitted_and_admitted(client, name="train-2")
    assert (second["state"], second["reason"]) == ("QUEUED", "quota_wait")


def test_viewer_may_not_submit(client_for, viewer, partition, grant):
    assert client_for(viewer).post("/api/v1/jobs/", body(), format="json").status_code == 403


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": 0}, "gpus"), ({"gpus": "two"}, "gpus"), ({"gpus": 16}, "gpus"), ({"gpus": 3, "nodes": 2}, "gpus"),
        ({"nodes": 2, "gpus": 4}, "nodes"), ({"walltime_minutes": 601}, "walltime_minutes"),
        ({"walltime_minutes": -5}, "walltime_minutes"), ({"name": "bad name; rm -rf /"}, "name"),
        ({"name": "x" * 65}, "name"), ({"priority": "urgent"}, "priority"),
        ({"env": {"BAD-NAME": "x"}}, "env"), ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
        ({"env": {"OK": 5}}, "env"), ({"env": ["A=1"]}, "env"),
        ({"script": "echo no shebang"}, "script"), ({"script": ""}, "script"),
        ({"script": "#!/bin/bash\n" + "x" * 70000}, "script"),
        ({"cluster": "nowhere"}, "cluster"), ({"partition": "gpu-big"}, "partition"),
        ({"gpu_model": "t4"}, "gpu_model"), ({"scenario": "astrology"}, "scenario"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(client_for, member, partition, grant, change, field):
    response = client_for(member).post("/api/v1/jobs/", body(**change), format="json")
    assert response.status_code == 400, response.content
    assert [k for k in response.json()["errors"] if k.split(".")[0] == field], response.json()["errors"]
    assert not Job.objects.exists()


def test_priority_may_not_exceed_the_tenants_tier(client_for, member, partition, grant, tenant):
    tenant.tier = "low"
    tenant.save()
    response = client_for(member).post("/api/v1/jobs/", body(priority="normal"), format="json")
    assert response.status_code == 400 and "priority" in response.json()["errors"]
    assert client_for(member).post("/api/v1/jobs/", body(priority="low"), format="json").status_code == 201


def test_idempotency_key_returns_the_first_job(client_for, member, partition, grant):
    client = client_for(member)
    first = client.post("/api/v1/jobs/", body(), format="json", HTTP_IDEMPOTENCY_KEY="abc-1")
    again = client.post("/api/v1/jobs/", body(), format="json", HTTP_IDEMPOTENCY_KEY="abc-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.count() == 1
    grant.refresh_from_db()
    assert grant.gpu_hours_reserved == 2  # reserved once
    other = client.post("/api/v1/jobs/", body(gpus=4), format="json", HTTP_IDEMPOTENCY_KEY="abc-1")
    assert other.status_code == 409 and other.json()["code"] == "conflict"


def test_a_job_of_another_tenant_is_not_found(client_for, member, outsider, partition, grant):
    job_id = client_for(member).post("/api/v1/jobs/", body(), format="json").json()["id"]
    client = client_for(outsider)
    assert client.get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    assert client.get(f"/api/v1/jobs/{job_id}/events/").status_code == 404
    assert client.get("/api/v1/jobs/").json()["results"] == []


def test_cancel_a_queued_job_releases_its_quota(client_for, member, partition, grant):
    client = client_for(member)
    job_id = client.post("/api/v1/jobs/", body(), format="json").json()["id"]
    response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 202
    assert response.json()["state"] == "CANCELLED"
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use, grant.gpu_hours_used) == (0, 0, 0)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 409
    events = client.get(f"/api/v1/jobs/{job_id}/events/").json()
    assert [(e["from_state"], e["to_state"]) for e in events] == [("", "QUEUED"), ("QUEUED", "CANCELLED")]


def test_members_cancel_only_their_own_jobs_managers_any(
    client_for, member, manager, tenant, partition, grant
):
    other = join(tenant, "member2", Role.MEMBER)
    job_id = client_for(other).post("/api/v1/jobs/", body(), format="json").json()["id"]
    assert client_for(member).post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 403
    assert client_for(manager).post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 202


def test_admission_order_tier_then_priority_then_fair_share_then_age(partition, catalog):
    """Pins the order of docs/architecture.md: tier, job priority, recent usage (decayed), age."""
    tenants = {}
    for slug, tier in [("crit", "critical"), ("hi", "high"), ("busy", "normal"), ("idle", "normal")]:
        tenants[slug] = Tenant.objects.create(slug=slug, name=slug, tier=tier)
        QuotaGrantFactory(tenant=tenants[slug], gpus=8, gpu_hours=1000)

    def make(slug, priority="normal", **extra) -> Job:
        return JobFactory(
            grant=QuotaGrant.objects.get(tenant=tenants[slug]), partition=partition, submitted_by=None,
            name=f"{slug}-{priority}", gpus=8, walltime_minutes=60, priority=priority, mem_per_gpu_mb=1000,
            script=SCRIPT, **extra,
        )  # fmt: skip

    # busy ran 100 GPU-hours yesterday; idle ran 100 GPU-hours 60 days ago (outside the window).
    make("busy", state=JobState.COMPLETED, gpu_hours=100, finished_at=timezone.now() - timedelta(days=1))
    make("idle", state=JobState.COMPLETED, gpu_hours=100, finished_at=timezone.now() - timedelta(days=60))
    waiting = [
        make("busy", "high"), make("idle", "low"), make("busy", "low"), make("idle", "high"),
        make("hi", "low"), make("crit", "low"), make("idle", "low"),
    ]  # fmt: skip
    order = [(job.tenant.slug, job.priority) for job in admission_order(waiting)]
    assert order == [
        ("crit", "low"), ("hi", "low"),
        ("idle", "high"), ("busy", "high"),
        ("idle", "low"), ("idle", "low"), ("busy", "low"),
    ]  # fmt: skip
    ids = [job.pk for job in admission_order(waiting)]
    assert ids[4] < ids[5]  # equal in all else: the older first


def test_a_job_waiting_for_capacity_is_not_passed_by_a_smaller_one(
    partition, tenant, catalog, client_for, member
):
    QuotaGrantFactory(tenant=tenant, gpus=16, gpu_hours=1000)
    client = client_for(member)
    assert submitted_and_admitted(client, gpus=6)["reason"] == ""
    big = submitted_and_admitted(client, gpus=4, name="big")
    small = submitted_and_admitted(client, gpus=1, name="small")
    assert big["reason"] == "capacity_wait"
    assert small["reason"] == "capacity_wait"
    assert jobs_admit(partition_id=partition.pk) == []
    assert JobEvent.objects.filter(to_state="SUBMITTING").count() == 0


def test_sweep_ends_a_job_cancelled_while_its_dispatcher_died(
    client_for, member, partition, grant, settings, tmp_path
):
    """Cancelled during submission, and the dispatcher is gone before sbatch: the sweep asks the
    scheduler by token, finds nothing, and ends the job here, releasing its quota."""
    from jobs.services import jobs_sweep

    settings.VAR_DIR = tmp_path
    client = client_for(member)
    job_id = client.post("/api/v1/jobs/", body(), format="json").json()["id"]
    Job.objects.filter(pk=job_id).update(state=JobState.CANCELLING, dispatch_lease_until=timezone.now())
    jobs_sweep()
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.reason, job.backend_id) == (
        "CANCELLED",
        "cancelled before it reached the scheduler",
        "",
    )
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)


def test_an_env_name_with_a_trailing_newline_is_refused(client_for, member, partition, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, gpus=8)
    response = client_for(member).post("/api/v1/jobs/", body(env={"FOO\n": "x"}), format="json")
    assert response.status_code == 400 and "env" in response.json()["errors"]


def test_a_grant_too_small_for_the_job_is_no_match(client_for, member, partition, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, gpus=1, days=5)
    big = QuotaGrantFactory(tenant=tenant, gpus=8)
    response = client_for(member).post("/api/v1/jobs/", body(gpus=4), format="json")
    assert response.status_code == 201 and response.json()["reason"] == ""
    assert Job.objects.get().grant == big


def test_grants_all_too_small_for_the_job_answer_409(client_for, member, partition, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, gpus=1)
    refused = client_for(member).post("/api/v1/jobs/", body(gpus=4), format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "quota_exhausted"
    assert refused.json()["gpus_granted"] == 1


def test_a_job_held_by_its_own_quota_does_not_stall_other_tenants(
    client_for, member, partition, tenant, catalog
):
    tenant.tier = "high"
    tenant.save()
    QuotaGrantFactory(tenant=tenant, gpus=4)
    other = Tenant.objects.create(slug="other", name="Other")
    QuotaGrantFactory(tenant=other, gpus=8)
    other_member = join(other, "other-member", Role.MEMBER)
    client = client_for(member)
    assert submitted_and_admitted(client, gpus=4)["reason"] == ""
    assert submitted_and_admitted(client, gpus=4)["reason"] == "quota_wait"
    theirs = submitted_and_admitted(client_for(other_member), tenant="other", gpus=2)
    assert theirs["reason"] == ""  # 4 of 8 GPUs are free, and this tenant has quota


def test_priority_defaults_within_the_tiers_cap(client_for, member, partition, tenant, catalog):
    tenant.tier = "low"
    tenant.save()
    QuotaGrantFactory(tenant=tenant, gpus=8)
    response = client_for(member).post("/api/v1/jobs/", body(), format="json")
    assert response.status_code == 201 and response.json()["priority"] == "low"


def test_a_job_cancelled_after_the_lease_is_not_submitted(client_for, member, partition, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, gpus=8)
    client = client_for(member)
    job_id = client.post("/api/v1/jobs/", body(), format="json").json()["id"]
    client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert job_claim(int(job_id)) is None
