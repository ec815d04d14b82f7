"""Regressions found in review: each test fails on the code before its fix."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone

from clusters.models import Cluster, Partition
from jobs.models import Job, JobState
from jobs.services import job_claim, jobs_poll
from tenants.models import Membership, QuotaGrant, Role, Tenant
from tests.conftest import join

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()


@pytest.fixture
def partition(catalog, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    cluster = Cluster.objects.create(slug="local", name="Local", kind="local", local_gpus=8, healthy=True)
    return Partition.objects.create(
        cluster=cluster,
        name="local",
        gpu_model=catalog[1],
        gpus_per_node=8,
        nodes=1,
        max_walltime_minutes=600,
    )


def grant_for(tenant, catalog, *, gpus=8, hours=100, ends_in=30) -> QuotaGrant:
    return QuotaGrant.objects.create(
        tenant=tenant, scenario=catalog[0], gpu_model=catalog[1], gpus=gpus, gpu_hours=Decimal(hours),
        starts_on=TODAY, ends_on=TODAY + timedelta(days=ends_in),
    )  # fmt: skip


def job_body(tenant="protein-lab", **overrides) -> dict:
    return {"tenant": tenant, "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 2,
            "walltime_minutes": 60, "name": "j", "script": "#!/bin/bash\n"} | overrides  # fmt: skip


def test_x_forwarded_for_does_not_reset_the_password_throttle(anon_client, member):
    with override_settings(API_THROTTLE_RATES={"user": "100/min", "anon": "100/min", "token": "3/min"}):
        codes = [
            anon_client.post("/api/v1/auth/token/", {"username": "member", "password": "x"},
                             HTTP_X_FORWARDED_FOR=f"10.0.0.{i}").status_code
            for i in range(5)
        ]  # fmt: skip
    assert codes == [400, 400, 400, 429, 429]


@pytest.mark.parametrize(
    ("method", "url", "body", "field"),
    [
        (
            "patch",
            "/api/v1/tenants/protein-lab/",
            {"contact_email": "a" * 250 + "@example.org"},
            "contact_email",
        ),
        ("post", "/api/v1/tenants/", {"slug": "Team_A", "name": "A"}, "slug"),
        ("get", "/api/v1/usage/?to=0001-01-05", None, "to"),
        ("get", "/api/v1/usage/?from=9999-12-31", None, "from"),
    ],
)
def test_bad_input_that_used_to_500(client_for, admin_user, owner, method, url, body, field):
    response = getattr(client_for(admin_user), method)(url, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]


def test_an_env_name_with_a_trailing_newline_is_refused(client_for, member, partition, tenant, catalog):
    grant_for(tenant, catalog)
    response = client_for(member).post("/api/v1/jobs/", job_body(env={"FOO\n": "x"}), format="json")
    assert response.status_code == 400 and "env" in response.json()["errors"]


def test_a_grant_too_small_for_the_job_is_no_match(client_for, member, partition, tenant, catalog):
    grant_for(tenant, catalog, gpus=1, ends_in=5)
    big = grant_for(tenant, catalog, gpus=8, ends_in=30)
    response = client_for(member).post("/api/v1/jobs/", job_body(gpus=4), format="json")
    assert response.status_code == 201 and response.json()["reason"] == ""
    assert Job.objects.get().grant == big


def test_grants_all_too_small_for_the_job_answer_409(client_for, member, partition, tenant, catalog):
    grant_for(tenant, catalog, gpus=1)
    refused = client_for(member).post("/api/v1/jobs/", job_body(gpus=4), format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "quota_exhausted"
    assert refused.json()["gpus_granted"] == 1


def test_a_job_held_by_its_own_quota_does_not_stall_other_tenants(
    client_for, member, partition, tenant, catalog
):
    tenant.tier = "high"
    tenant.save()
    grant_for(tenant, catalog, gpus=4)
    other = Tenant.objects.create(slug="other", name="Other")
    grant_for(other, catalog, gpus=8)
    other_member = join(other, "other-member", Role.MEMBER)
    client = client_for(member)
    assert client.post("/api/v1/jobs/", job_body(gpus=4), format="json").json()["reason"] == ""
    assert client.post("/api/v1/jobs/", job_body(gpus=4), format="json").json()["reason"] == "quota_wait"
    theirs = client_for(other_member).post("/api/v1/jobs/", job_body("other", gpus=2), format="json").json()
    assert theirs["reason"] == ""  # 4 of 8 GPUs are free, and this tenant has quota


def test_priority_defaults_within_the_tiers_cap(client_for, member, partition, tenant, catalog):
    tenant.tier = "low"
    tenant.save()
    grant_for(tenant, catalog)
    response = client_for(member).post("/api/v1/jobs/", job_body(), format="json")
    assert response.status_code == 201 and response.json()["priority"] == "low"


def test_a_viewer_sees_neither_script_nor_env(client_for, member, viewer, partition, tenant, catalog):
    grant_for(tenant, catalog)
    job_id = (
        client_for(member)
        .post("/api/v1/jobs/", job_body(env={"TOKEN": "s3cret"}), format="json")
        .json()["id"]
    )
    assert client_for(member).get(f"/api/v1/jobs/{job_id}/").json()["env"]["TOKEN"] == "s3cret"
    seen = client_for(viewer).get(f"/api/v1/jobs/{job_id}/")
    assert seen.status_code == 200 and "s3cret" not in seen.content.decode() and "script" not in seen.json()


def test_a_job_cancelled_after_the_lease_is_not_submitted(client_for, member, partition, tenant, catalog):
    grant_for(tenant, catalog)
    client = client_for(member)
    job_id = client.post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert job_claim(int(job_id)) is None


def test_a_job_the_scheduler_forgot_becomes_lost_and_frees_its_quota(
    client_for, member, partition, tenant, catalog
):
    grant = grant_for(tenant, catalog)
    job_id = client_for(member).post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=job_id).update(
        state=JobState.PENDING, backend_id="local-999", submitted_at=long_ago
    )
    jobs_poll(cluster_id=partition.cluster_id)
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.reason) == ("LOST", "unknown to the scheduler")
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)


def test_the_console_hands_a_tenant_from_one_owner_to_another_in_one_save(client, admin_user, tenant, owner):
    client.force_login(admin_user)
    heir = join(tenant, "heir", Role.MEMBER)
    rows = {m.user.username: m for m in Membership.objects.filter(tenant=tenant)}
    data = {
        "slug": tenant.slug, "name": tenant.name, "tier": tenant.tier, "state": "active", "contact_email": "",
        "memberships-TOTAL_FORMS": "2", "memberships-INITIAL_FORMS": "2",
        "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000",
        "cluster_accounts-TOTAL_FORMS": "0", "cluster_accounts-INITIAL_FORMS": "0",
        "cluster_accounts-MIN_NUM_FORMS": "0", "cluster_accounts-MAX_NUM_FORMS": "1000",
        "memberships-0-id": str(rows["owner"].pk), "memberships-0-tenant": str(tenant.pk), "memberships-0-role": "manager",
        "memberships-1-id": str(rows["heir"].pk), "memberships-1-tenant": str(tenant.pk), "memberships-1-role": "owner",
    }  # fmt: skip
    response = client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data)
    assert response.status_code == 302
    assert Membership.objects.get(user=heir).role == Role.OWNER
    assert Membership.objects.get(user=owner).role == Role.MANAGER


def test_a_cancelled_job_the_scheduler_forgot_is_cancelled_at_once(
    client_for, member, partition, tenant, catalog
):
    """Kubernetes forgets a Job once its foreground delete is done: no LOST, no grace period."""
    grant = grant_for(tenant, catalog)
    job_id = client_for(member).post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    Job.objects.filter(pk=job_id).update(
        state=JobState.CANCELLING, backend_id="local-999", submitted_at=timezone.now()
    )
    jobs_poll(cluster_id=partition.cluster_id)
    assert Job.objects.get(pk=job_id).state == "CANCELLED"
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)
