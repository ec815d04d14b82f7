"""Shares of a GPU through the API (issue [Share]): quota asked and granted in the share's unit,
jobs that ask for a MIG instance, a slice or a shard, the 400s that name the field, GPU-hours in
device-equivalents, admission filling a partition by device fractions, and the ledger's
arithmetic over many small fractional jobs."""

from datetime import timedelta
from decimal import ROUND_CEILING, Decimal

import pytest
from django.utils import timezone

from clusters.backends.base import JobStatus
from clusters.models import GpuModel, Scenario
from clusters.shares import mig_profiles
from jobs.models import Job, JobState
from jobs.services.admission import jobs_admit_marked
from jobs.services.finish import jobs_finish
from tenants.models import QuotaGrant
from tests.api_support import assert_problem
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory

pytestmark = pytest.mark.django_db

SCRIPT = "#!/bin/bash\necho hello\n"


@pytest.fixture
def h200(catalog):
    return Scenario.objects.get(slug="ai-training"), GpuModel.objects.get(slug="h200")


@pytest.fixture
def shared(h200):
    """One node of 2 H200 on the local cluster, offering whole devices, MIG 3g.71gb and 1g.18gb
    instances and slices."""
    return PartitionFactory(
        cluster=ClusterFactory(slug="local"), name="h200", gpu_model=h200[1], gpus_per_node=2, nodes=1,
        share_kinds=["whole", "mig", "slice"], mig_profiles=["3g.71gb", "1g.18gb"],
    )  # fmt: skip


def body(**overrides) -> dict:
    return {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h200", "gpus": 1,
        "walltime_minutes": 60, "name": "share-1", "script": SCRIPT,
    } | overrides  # fmt: skip


def grant_of(tenant, h200, **fields) -> QuotaGrant:
    return QuotaGrantFactory(tenant=tenant, pair=h200, **{"gpus": 4, "gpu_hours": 100} | fields)


# --- The catalog


def test_the_catalog_lists_each_models_profiles_fractions_share_kinds_and_sources(client_for, member, h200):
    models = client_for(member).get("/api/v1/gpu-models/?page_size=200").json()["results"]
    by_slug = {model["slug"]: model for model in models}
    h200_row = by_slug["h200"]
    assert h200_row["share_kinds"] == ["whole", "mig", "slice", "shard"]
    fractions = {p["name"]: p["fraction"] for p in h200_row["mig_profiles"]}
    assert fractions == {
        "1g.18gb": 0.1428, "1g.35gb": 0.25, "2g.35gb": 0.2857, "3g.71gb": 0.5, "4g.71gb": 0.5714, "7g.141gb": 1.0,
    }  # fmt: skip
    assert any("MIG" in source for source in h200_row["sources"])
    assert by_slug["t4"]["mig_profiles"] == [] and "mig" not in by_slug["t4"]["share_kinds"]
    assert by_slug["ascend-910b"]["vendor"] == "huawei" and by_slug["ascend-910b"]["memory_gb"] == 64


def test_a_devices_instances_never_add_up_to_more_than_the_device():
    for model in GpuModel.objects.exclude(mig_profiles=[]):
        for profile in mig_profiles(model.mig_profiles):
            assert profile.fraction * profile.instances_max <= 1, (model.slug, profile.name)


# --- Quota in the share's unit


def test_slices_are_requested_without_caps_granted_and_used_by_a_job_with_its_own(
    client_for, owner, member, admin_user, h200, shared
):
    """A slice grant counts slices; each job names its caps. Requested, approved, then a job."""
    request = {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h200", "share": "slice", "gpus": 4,
        "gpu_hours": 10, "starts_on": str(timezone.localdate()),
        "ends_on": str(timezone.localdate() + timedelta(days=30)), "justification": "notebooks",
    }  # fmt: skip
    created = client_for(owner).post("/api/v1/quota-requests/", request, format="json")
    assert created.status_code == 201, created.content
    approved = client_for(admin_user).post(
        f"/api/v1/quota-requests/{created.json()['id']}/approve/", {"note": "ok"}
    )
    assert approved.status_code == 200
    fields = {"share": "slice", "gpu_memory_mib": 18048, "gpu_cores_pct": 10}  # an eighth of an H200
    job = client_for(member).post("/api/v1/jobs/", body(**fields), format="json")
    assert job.status_code == 201, job.content
    assert (job.json()["device_fraction"], job.json()["gpu_hours_reserved"]) == (0.125, 0.13)


def test_quota_is_requested_and_granted_in_mig_instances(client_for, owner, admin_user, h200):
    request = {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h200", "share": "mig",
        "mig_profile": "3g.71gb", "gpus": 4, "gpu_hours": 100, "starts_on": str(timezone.localdate()),
        "ends_on": str(timezone.localdate() + timedelta(days=30)), "justification": "small fine-tunes",
    }  # fmt: skip
    created = client_for(owner).post("/api/v1/quota-requests/", request, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["share"], created.json()["mig_profile"]) == ("mig", "3g.71gb")
    approved = client_for(admin_user).post(
        f"/api/v1/quota-requests/{created.json()['id']}/approve/", {"note": "ok"}
    )
    assert approved.status_code == 200
    quota = client_for(owner).get("/api/v1/quotas/?tenant=protein-lab").json()["results"][0]
    assert (quota["share"], quota["mig_profile"], quota["gpus"]) == ("mig", "3g.71gb", 4)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"share": "mig", "mig_profile": "5g.99gb"}, "mig_profile"),
        ({"share": "mig"}, "mig_profile"),
        ({"share": "whole", "mig_profile": "3g.71gb"}, "mig_profile"),
        ({"share": "quarter"}, "share"),
    ],
)
def test_a_quota_request_for_a_share_the_model_lacks_is_a_400_naming_the_field(
    client_for, owner, h200, fields, field
):
    request = {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h200", "gpus": 1, "gpu_hours": 10,
        "starts_on": str(timezone.localdate()), "ends_on": str(timezone.localdate() + timedelta(days=3)),
        "justification": "x",
    } | fields  # fmt: skip
    response = client_for(owner).post("/api/v1/quota-requests/", request, format="json")
    assert_problem(response, 400, "invalid")
    assert field in response.json()["errors"]


def test_mig_on_a_model_without_mig_is_a_400_naming_share(client_for, owner, catalog):
    ScenarioGpuModel = GpuModel.objects.get(slug="t4")
    request = {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": ScenarioGpuModel.slug, "gpus": 1,
        "gpu_hours": 10, "share": "mig", "mig_profile": "1g.10gb", "starts_on": str(timezone.localdate()),
        "ends_on": str(timezone.localdate() + timedelta(days=3)), "justification": "x",
    }  # fmt: skip
    response = client_for(owner).post("/api/v1/quota-requests/", request, format="json")
    assert_problem(response, 400, "invalid")
    assert "T4 offers: whole, slice, shard." in response.json()["errors"]["share"][0]


# --- Jobs


def test_a_mig_job_reserves_its_fraction_of_device_hours(client_for, member, tenant, h200, shared):
    grant = grant_of(tenant, h200, share="mig", mig_profile="3g.71gb")
    response = client_for(member).post(
        "/api/v1/jobs/", body(share="mig", mig_profile="3g.71gb"), format="json"
    )
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["share"], job["mig_profile"], job["device_fraction"]) == ("mig", "3g.71gb", 0.5)
    assert job["gpu_hours_reserved"] == 0.5  # 1 instance × 0.5 × 1 hour
    grant.refresh_from_db()
    assert grant.gpu_hours_reserved == Decimal("0.5")


def test_a_slice_job_counts_the_larger_of_its_memory_and_compute_parts(
    client_for, member, tenant, h200, shared
):
    grant_of(tenant, h200, share="slice")
    fields = {"share": "slice", "gpu_memory_mib": 36096, "gpu_cores_pct": 10}  # a quarter of 144,384 MiB
    response = client_for(member).post("/api/v1/jobs/", body(**fields), format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["device_fraction"], job["gpu_hours_reserved"]) == (0.25, 0.25)
    stored = Job.objects.get(pk=job["id"])
    assert (stored.gpu_memory_mib, stored.gpu_cores_pct) == (36096, 10)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"share": "shard"}, "share"),  # the partition offers no shards
        ({"share": "mig", "mig_profile": "4g.71gb"}, "mig_profile"),  # the model has it, the partition not
        ({"share": "mig", "mig_profile": "3g.71gb", "gpus": 2}, "gpus"),  # one instance per node
        ({"share": "slice", "gpu_memory_mib": 200_000, "gpu_cores_pct": 10}, "gpu_memory_mib"),
        ({"share": "slice", "gpu_memory_mib": 1000, "gpu_cores_pct": 0}, "gpu_cores_pct"),
        ({"share": "slice", "gpu_memory_mib": 1000, "gpu_cores_pct": 10, "gpus": 2}, "gpus"),  # one per node
        ({"share": "whole", "gpu_memory_mib": 1000}, "gpu_memory_mib"),
    ],
)
def test_a_share_the_partition_cannot_give_is_a_400_naming_the_field(
    client_for, member, tenant, h200, shared, fields, field
):
    grant_of(tenant, h200, share=fields["share"], mig_profile=fields.get("mig_profile", ""))
    response = client_for(member).post("/api/v1/jobs/", body(**fields), format="json")
    assert_problem(response, 400, "invalid")
    assert field in response.json()["errors"], response.json()
    assert not Job.objects.exists()


def test_a_share_without_a_grant_in_its_unit_is_409_no_quota(client_for, member, tenant, h200, shared):
    grant_of(tenant, h200)  # whole devices only
    response = client_for(member).post(
        "/api/v1/jobs/", body(share="mig", mig_profile="3g.71gb"), format="json"
    )
    assert_problem(response, 409, "no_quota")
    assert "MIG 3g.71gb" in response.json()["detail"]


def test_another_tenants_share_partition_is_not_revealed_by_the_check(
    client_for, outsider, tenant, h200, shared
):
    """The tenant field is checked before any share: an outsider naming our tenant gets 404-like
    refusal on the tenant, not a share error that would tell what we hold."""
    grant_of(tenant, h200, share="mig", mig_profile="3g.71gb")
    response = client_for(outsider).post(
        "/api/v1/jobs/", body(share="mig", mig_profile="3g.71gb"), format="json"
    )
    assert response.status_code in (400, 404)
    assert set(response.json().get("errors", {})) <= {"tenant"}


# --- Admission by device fractions


def test_admission_fills_a_device_with_its_fractions(client_for, member, tenant, h200, catalog):
    """One H200 offered as 3g.71gb instances: two of them (half a device each) start, the third
    waits for capacity, not for quota."""
    partition = PartitionFactory(
        cluster=ClusterFactory(slug="local"), name="one", gpu_model=h200[1], gpus_per_node=1, nodes=1,
        share_kinds=["mig"], mig_profiles=["3g.71gb"],
    )  # fmt: skip
    grant_of(tenant, h200, share="mig", mig_profile="3g.71gb")
    client = client_for(member)
    ids = []
    for n in range(3):
        response = client.post(
            "/api/v1/jobs/", body(share="mig", mig_profile="3g.71gb", name=f"m{n}"), format="json"
        )
        assert response.status_code == 201, response.content
        ids.append(int(response.json()["id"]))
    assert sorted(jobs_admit_marked(partition_id=partition.pk)) == ids[:2]
    third = Job.objects.get(pk=ids[2])
    assert (third.holds_gpus, third.reason) == (False, "capacity_wait")


# --- The ledger's arithmetic


def test_ten_thousand_small_fractional_jobs_leave_no_drift(tenant, member, h200, shared):
    """10,000 jobs of one 1g.18gb instance (0.1428 of a device) of 1 to 7 minutes, reserved as
    submit reserves and ended as the end settles them: the grant's reservation comes back to
    exactly 0, its used hours are exactly the sum of the jobs' charges, and each charge is units ×
    fraction × elapsed to the 4 places the ledger keeps."""
    fraction = Decimal("0.1428")
    grant = grant_of(tenant, h200, share="mig", mig_profile="1g.18gb", gpus=10_000)
    QuotaGrant.objects.filter(pk=grant.pk).update(gpu_hours=Decimal(10_000))
    now = timezone.now()
    jobs, reserved_total = [], Decimal(0)
    for n in range(10_000):
        minutes = 1 + n % 7
        reserved = (Decimal(1) * fraction * minutes / 60).quantize(Decimal("0.01"), ROUND_CEILING)
        reserved_total += reserved
        jobs.append(
            Job(
                tenant=tenant, submitted_by=member, name=f"tiny-{n}", scenario=h200[0], gpu_model=h200[1],
                grant=grant, cluster=shared.cluster, partition=shared, gpus=1, share="mig",
                mig_profile="1g.18gb", device_fraction=fraction, walltime_minutes=minutes, cpus_per_gpu=1,
                mem_per_gpu_mb=1024, script=SCRIPT, reserved_gpu_hours=reserved, holds_gpus=True,
                state=JobState.RUNNING, backend_id=str(n),
                started_at=now - timedelta(seconds=1 + (n * 37) % (minutes * 60), microseconds=n % 1000),
            )
        )  # fmt: skip
    Job.objects.bulk_create(jobs, batch_size=1000)
    QuotaGrant.objects.filter(pk=grant.pk).update(gpu_hours_reserved=reserved_total, gpus_in_use=10_000)
    ended_at = now
    statuses = {
        job.pk: JobStatus(backend_id=job.backend_id, state="COMPLETED", raw_state="COMPLETED", exit_code=0,
                          started_at=job.started_at, finished_at=ended_at)
        for job in Job.objects.filter(grant=grant)
    }  # fmt: skip
    assert jobs_finish(statuses) == 10_000
    grant.refresh_from_db()
    charges = list(Job.objects.filter(grant=grant).values_list("gpu_hours", "started_at", "finished_at"))
    assert grant.gpu_hours_reserved == 0 and grant.gpus_in_use == 0
    assert grant.gpu_hours_used == sum(hours for hours, _s, _f in charges)
    for hours, started, finished in charges[:500]:
        elapsed_h = Decimal(str((finished - started).total_seconds())) / 3600
        assert hours == (elapsed_h * fraction).quantize(Decimal("0.0001"))
