"""/api/v1/quota-requests/: request, withdraw, approve (all or part), reject, expire; mail and audit.
And /api/v1/quotas/?active=."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from portal.core.models import AuditEvent
from tenants.models import QuotaGrant, QuotaRequest, RequestState, TenantState
from tenants.services import quota_requests_expire
from tests.api_support import assert_problem, request_body

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()


@pytest.fixture
def pending(client_for, owner, catalog, admin_user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(owner).post("/api/v1/quota-requests/", request_body())
    assert response.status_code == 201, response.content
    return response.json()


def test_owner_requests_and_admins_hear_of_it(pending, admin_user):
    assert pending["state"] == "pending"
    assert pending["requested_by"] == "owner"
    assert pending["grant"] is None
    assert pending["gpu_hours"] == 2000
    assert [m.to for m in mail.outbox] == [[admin_user.email]]
    assert "protein-lab" in mail.outbox[0].subject
    assert AuditEvent.objects.filter(action="quota_request.create", target_id=pending["id"]).exists()


def test_manager_may_request_but_member_and_viewer_may_not(client_for, manager, member, viewer, catalog):
    assert client_for(manager).post("/api/v1/quota-requests/", request_body()).status_code == 201
    for user in (member, viewer):
        response = client_for(user).post("/api/v1/quota-requests/", request_body())
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"


def test_another_tenants_slug_reads_as_unknown(client_for, outsider, catalog, tenant):
    response = client_for(outsider).post("/api/v1/quota-requests/", request_body())
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["tenant"]


def test_gpu_model_must_be_one_the_scenario_lists(client_for, owner, catalog):
    from clusters.models import GpuModel

    unlisted = GpuModel.objects.exclude(scenarios=catalog[0]).first() or GpuModel.objects.create(
        slug="x-unlisted", vendor="nvidia", name="X", memory_gb=8, fp64_tflops=1, fp32_tflops=1, fp16_tflops=1,
        memory_bandwidth_gbs=1, interconnect="PCIe", interconnect_gbs=1, ecc=False, cost_index=1,
        slurm_gres="x", k8s_resource="nvidia.com/gpu", k8s_product="X",
    )  # fmt: skip
    response = client_for(owner).post("/api/v1/quota-requests/", request_body(gpu_model=unlisted.slug))
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["gpu_model"]


def test_suspended_tenant_cannot_request(client_for, owner, catalog, tenant):
    tenant.state = TenantState.SUSPENDED
    tenant.save()
    response = client_for(owner).post("/api/v1/quota-requests/", request_body())
    assert response.status_code == 409
    assert response.json()["code"] == "tenant_suspended"
    assert client_for(owner).get("/api/v1/quota-requests/").status_code == 200  # reading still works


def test_full_approval_creates_the_grant_and_mails_the_team(
    client_for, pending, admin_user, owner, manager, member, django_capture_on_commit_callbacks
):
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(admin_user).post(
            f"/api/v1/quota-requests/{pending['id']}/approve/", {"note": "Go."}
        )
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "approved"
    assert body["decided_by"] == "admin" and body["decision_note"] == "Go."
    grant = QuotaGrant.objects.get(pk=body["grant"])
    assert (grant.gpus, grant.gpu_hours, grant.ends_on) == (8, 2000, TODAY + timedelta(days=90))
    assert sorted(mail.outbox[0].to) == sorted([owner.email, manager.email])  # not the member
    assert "approved" in mail.outbox[0].subject
    quotas = client_for(member).get("/api/v1/quotas/?tenant=protein-lab&active=true").json()["results"]
    assert quotas == [
        {
            "id": str(grant.pk), "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb",
            "share": "whole", "mig_profile": "", "gpus": 8, "gpus_in_use": 0, "gpu_hours": 2000.0, "gpu_hours_used": 0.0, "gpu_hours_reserved": 0.0,
            "gpu_hours_remaining": 2000.0, "starts_on": str(TODAY), "ends_on": str(TODAY + timedelta(days=90)),
            "active": True,
        }
    ]  # fmt: skip


def test_lowering_any_figure_is_a_partial_approval(client_for, pending, admin_user):
    ends_on = str(TODAY + timedelta(days=30))
    body = (
        client_for(admin_user)
        .post(
            f"/api/v1/quota-requests/{pending['id']}/approve/",
            {"note": "Half.", "gpus": 4, "ends_on": ends_on},
        )
        .json()
    )
    assert body["state"] == "partially_approved"
    grant = QuotaGrant.objects.get(pk=body["grant"])
    assert (grant.gpus, grant.gpu_hours, str(grant.ends_on)) == (4, 2000, ends_on)


def test_raising_a_figure_or_no_note_is_refused(client_for, pending, admin_user):
    admin = client_for(admin_user)
    raised = admin.post(f"/api/v1/quota-requests/{pending['id']}/approve/", {"note": "More!", "gpus": 16})
    assert raised.status_code == 400 and list(raised.json()["errors"]) == ["gpus"]
    silent = admin.post(f"/api/v1/quota-requests/{pending['id']}/approve/", {"note": "  "})
    assert silent.status_code == 400 and list(silent.json()["errors"]) == ["note"]
    assert QuotaRequest.objects.get(pk=pending["id"]).state == RequestState.PENDING
    assert not QuotaGrant.objects.exists()


def test_deciding_twice_is_a_conflict(client_for, pending, admin_user):
    admin = client_for(admin_user)
    assert (
        admin.post(f"/api/v1/quota-requests/{pending['id']}/reject/", {"note": "No budget."}).status_code
        == 200
    )
    again = admin.post(f"/api/v1/quota-requests/{pending['id']}/approve/", {"note": "Yes after all."})
    assert again.status_code == 409
    assert again.json()["code"] == "conflict"
    assert not QuotaGrant.objects.exists()


def test_only_admins_decide(client_for, pending, owner):
    response = client_for(owner).post(
        f"/api/v1/quota-requests/{pending['id']}/approve/", {"note": "Self-serve"}
    )
    assert response.status_code == 403


def test_withdraw_while_pending_then_it_stays_listed(client_for, pending, owner, admin_user):
    client = client_for(owner)
    assert client.delete(f"/api/v1/quota-requests/{pending['id']}/").status_code == 204
    assert client.get(f"/api/v1/quota-requests/{pending['id']}/").json()["state"] == "withdrawn"
    assert client.delete(f"/api/v1/quota-requests/{pending['id']}/").status_code == 409
    listed = client.get("/api/v1/quota-requests/?state=withdrawn").json()["results"]
    assert [r["id"] for r in listed] == [pending["id"]]


def test_pending_requests_expire_once_their_end_passes(pending):
    assert quota_requests_expire(today=TODAY + timedelta(days=90)) == 0
    assert quota_requests_expire(today=TODAY + timedelta(days=91)) == 1
    assert QuotaRequest.objects.get(pk=pending["id"]).state == RequestState.EXPIRED
    assert AuditEvent.objects.filter(action="quota_request.expired").count() == 1


def test_the_active_filter_takes_true_or_false_only(client_for, member, grant):
    client = client_for(member)
    # Django's NullBooleanField read "maybe" as no filter at all.
    assert list(assert_problem(client.get("/api/v1/quotas/?active=maybe"), 400, "invalid")["errors"]) == [
        "active"
    ]
    assert len(client.get("/api/v1/quotas/?active=true").json()["results"]) == 1
    assert len(client.get("/api/v1/quotas/?active=false").json()["results"]) == 0
    assert len(client.get("/api/v1/quotas/?active=").json()["results"]) == 1
