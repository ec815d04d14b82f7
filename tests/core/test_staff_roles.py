"""Staff who are not superusers, one persona per documented role (portal/core/staff.py) and one
with no role: each has exactly its role's powers in the API, the pages and the admin console.

Personas: `bare` (is_staff and nothing else), `approver` (Quota approver), `support` (Read-only
support), `padmin` (Platform admin through the group, not a superuser). The tenant "protein-lab"
has an owner and a QUEUED job with a script and an environment; "other-team" has its own."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.core import mail
from django.core.management import call_command
from django.utils import timezone

from jobs.models import Job, JobState
from portal.core.models import AuditEvent
from portal.core.staff import (
    ROLE_PLATFORM_ADMIN,
    ROLE_QUOTA_APPROVER,
    ROLE_READ_ONLY_SUPPORT,
    STAFF_ROLES,
    can_decide_quota,
    is_platform_admin,
    sees_all_tenants,
)
from tenants.models import QuotaGrant, RequestState, Tier
from tests.factories import JobFactory, QuotaGrantFactory, QuotaRequestFactory, UserFactory

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()
SCRIPT = "#!/bin/bash\necho script-secret-material\n"
ENV = {"HF_TOKEN": "env-secret-material"}


def staff(username: str, *roles: str):
    user = UserFactory(username=username, is_staff=True)
    user.groups.set(Group.objects.filter(name__in=roles))
    return user


@pytest.fixture
def bare(db):
    return staff("bare")


@pytest.fixture
def approver(db):
    return staff("approver", ROLE_QUOTA_APPROVER)


@pytest.fixture
def support(db):
    return staff("support", ROLE_READ_ONLY_SUPPORT)


@pytest.fixture
def padmin(db):
    return staff("padmin", ROLE_PLATFORM_ADMIN)


@pytest.fixture
def job(make_job, owner):
    job = make_job(owner, env=ENV)
    Job.objects.filter(pk=job.pk).update(script=SCRIPT)
    # The grant's ledger as job_submit leaves it, so that a cancel can release the reservation.
    QuotaGrant.objects.filter(pk=job.grant_id).update(gpu_hours_reserved=job.reserved_gpu_hours)
    job.script = SCRIPT
    return job


@pytest.fixture
def their_job(job, other_tenant, outsider):
    """A QUEUED job of the other tenant, on the same partition, under a grant of its own."""
    grant = QuotaGrantFactory(
        tenant=other_tenant, pair=(job.scenario, job.gpu_model), gpus=2, gpu_hours=50, days=9,
        gpu_hours_reserved=Decimal("0.17"),
    )  # fmt: skip
    return JobFactory(
        grant=grant, partition=job.partition, submitted_by=outsider, name="theirs", script=SCRIPT, env=ENV
    )


@pytest.fixture
def pending(tenant, catalog):
    return QuotaRequestFactory(tenant=tenant)


@pytest.fixture
def their_pending(other_tenant, catalog):
    return QuotaRequestFactory(tenant=other_tenant)


def approve(client, quota_request):
    return client.post(
        f"/api/v1/quota-requests/{quota_request.pk}/approve/", {"note": "Fine."}, format="json"
    )


def console(client, user):
    client.force_login(user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    return client


# --- The roles themselves


def test_the_migration_made_each_role_with_exactly_its_permissions():
    for name, perms in STAFF_ROLES.items():
        held = Group.objects.get(name=name).permissions.values_list("content_type__app_label", "codename")
        assert {f"{app}.{codename}" for app, codename in held} == perms
    assert "tenants.change_tenant" not in STAFF_ROLES[ROLE_QUOTA_APPROVER]
    assert not any(
        p.split(".")[1].startswith(("add_", "change_", "delete_"))
        for p in STAFF_ROLES[ROLE_READ_ONLY_SUPPORT]
    )


def test_the_predicates_follow_the_roles(admin_user, bare, approver, support, padmin, owner):
    powers = lambda user: (is_platform_admin(user), can_decide_quota(user), sees_all_tenants(user))  # noqa: E731
    assert powers(admin_user) == (True, True, True)
    assert powers(padmin) == (True, True, True)
    assert powers(approver) == (False, True, True)
    assert powers(support) == (False, False, True)
    assert powers(bare) == (False, False, False)
    assert powers(owner) == (False, False, False)


def test_a_role_without_is_staff_grants_nothing(support):
    support.is_staff = False
    support.save()
    assert not sees_all_tenants(type(support).objects.get(pk=support.pk))


def test_the_command_grants_and_revokes_a_role_with_an_audit(db, capsys):
    user = UserFactory(username="newhire")
    call_command("staff_role", "grant", "newhire", ROLE_QUOTA_APPROVER)
    user.refresh_from_db()
    assert user.is_staff and can_decide_quota(user)
    call_command("staff_role", "list")
    assert f"{ROLE_QUOTA_APPROVER}: newhire" in capsys.readouterr().out
    call_command("staff_role", "revoke", "newhire", ROLE_QUOTA_APPROVER)
    user = type(user).objects.get(pk=user.pk)  # a fresh instance: has_perm caches on the old
    assert not can_decide_quota(user)
    actions = list(
        AuditEvent.objects.filter(target_id=str(user.pk)).order_by("id").values_list("action", "data")
    )
    assert actions == [("staff.role_grant", {"role": ROLE_QUOTA_APPROVER}),
                       ("staff.role_revoke", {"role": ROLE_QUOTA_APPROVER})]  # fmt: skip


def test_sync_restores_a_groups_permissions(db):
    group = Group.objects.get(name=ROLE_READ_ONLY_SUPPORT)
    group.permissions.clear()
    call_command("staff_role", "sync")
    assert group.permissions.count() == len(STAFF_ROLES[ROLE_READ_ONLY_SUPPORT])


def test_news_of_a_request_goes_to_those_who_may_decide_it(
    client_for,
    owner,
    catalog,
    admin_user,
    bare,
    approver,
    support,
    padmin,
    django_capture_on_commit_callbacks,
):
    body = {"tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 8,
            "gpu_hours": 100, "starts_on": str(TODAY), "ends_on": str(TODAY + timedelta(days=9)),
            "justification": "More."}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        assert client_for(owner).post("/api/v1/quota-requests/", body, format="json").status_code == 201
    assert sorted(mail.outbox[0].to) == sorted(u.email for u in (admin_user, approver, padmin))


# --- Staff with no role: is_staff opens the console's door and nothing else


def test_bare_staff_gets_nothing_from_the_api(client_for, bare, job, their_job, pending, tenant):
    api = client_for(bare)
    me = api.get("/api/v1/me/").json()
    assert (me["is_staff"], me["platform_admin"], me["staff_roles"]) == (True, False, [])
    assert api.get("/api/v1/tenants/").json()["results"] == []
    assert api.get("/api/v1/jobs/").json()["results"] == []
    assert api.get(f"/api/v1/jobs/{their_job.pk}/").status_code == 404
    assert approve(api, pending).status_code == 404  # a tenant it cannot see: 404 before all
    assert (
        api.patch(f"/api/v1/tenants/{tenant.slug}/", {"tier": "critical"}, format="json").status_code == 404
    )
    assert api.post("/api/v1/tenants/", {"slug": "mine", "name": "Mine"}, format="json").status_code == 403
    pending.refresh_from_db()
    assert pending.state == RequestState.PENDING


def test_bare_staff_in_a_tenant_is_only_its_member(client_for, bare, tenant, pending, job):
    from tenants.models import Role
    from tenants.services import membership_add

    membership_add(actor=None, tenant=tenant, user=bare, role=Role.OWNER)
    api = client_for(bare)
    response = approve(api, pending)
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert (
        api.patch(f"/api/v1/tenants/{tenant.slug}/", {"tier": "critical"}, format="json").status_code == 403
    )
    tenant.refresh_from_db()
    assert tenant.tier == Tier.NORMAL


def test_bare_staff_gets_403_in_the_console_and_404_on_the_pages(client, bare, job, pending, tenant):
    console(client, bare)
    for url in ("/admin/tenants/tenant/", "/admin/jobs/job/", f"/admin/jobs/job/{job.pk}/change/",
                "/admin/clusters/cluster/", f"/admin/tenants/quotarequest/{pending.pk}/decide/"):  # fmt: skip
        assert client.get(url).status_code == 403, url
    assert client.get("/admin/").status_code == 200  # the door opens, onto nothing
    assert client.get(f"/t/{tenant.slug}/").status_code == 404
    assert client.get(f"/t/{tenant.slug}/jobs/{job.pk}/").status_code == 404


# --- Quota approver: decides quota everywhere, reads every tenant, changes nothing else


def test_approver_decides_through_the_api(client_for, approver, pending, their_pending):
    api = client_for(approver)
    me = api.get("/api/v1/me/").json()
    assert (me["platform_admin"], me["staff_roles"]) == (False, [ROLE_QUOTA_APPROVER])
    listed = {row["id"] for row in api.get("/api/v1/quota-requests/").json()["results"]}
    assert listed == {str(pending.pk), str(their_pending.pk)}
    assert approve(api, pending).status_code == 200
    rejected = api.post(f"/api/v1/quota-requests/{their_pending.pk}/reject/", {"note": "No."}, format="json")
    assert rejected.status_code == 200
    pending.refresh_from_db(), their_pending.refresh_from_db()
    assert (pending.state, their_pending.state) == (RequestState.APPROVED, RequestState.REJECTED)


def test_approver_may_not_change_tiers_tenants_members_or_jobs(client_for, approver, tenant, job):
    api = client_for(approver)
    for body in ({"tier": "critical"}, {"state": "suspended"}, {"name": "Renamed"}):
        response = api.patch(f"/api/v1/tenants/{tenant.slug}/", body, format="json")
        assert response.status_code == 403, body
    assert api.post("/api/v1/tenants/", {"slug": "mine", "name": "Mine"}, format="json").status_code == 403
    members = api.post(f"/api/v1/tenants/{tenant.slug}/members/", {"username": "approver", "role": "owner"},
                       format="json")  # fmt: skip
    assert members.status_code == 403
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    tenant.refresh_from_db(), job.refresh_from_db()
    assert (tenant.tier, tenant.name, job.state) == (Tier.NORMAL, "Protein Lab", JobState.QUEUED)


def test_approver_decides_in_the_console_but_sets_no_tier(client, approver, pending, their_pending, tenant):
    console(client, approver)
    decided = client.post(
        f"/admin/tenants/quotarequest/{pending.pk}/decide/", {"decision": "approve", "note": "Ok."}
    )
    assert decided.status_code == 302
    bulk = client.post("/admin/tenants/quotarequest/",
                       {"action": "reject_selected", "_selected_action": [their_pending.pk], "note": "No."})  # fmt: skip
    assert bulk.status_code == 302
    pending.refresh_from_db(), their_pending.refresh_from_db()
    assert (pending.state, their_pending.state) == (RequestState.APPROVED, RequestState.REJECTED)
    page = client.get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    assert page.status_code == 200 and 'name="tier"' not in page.content.decode()
    data = {"slug": tenant.slug, "name": tenant.name, "tier": "critical", "state": "active"}
    assert client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data).status_code == 403
    assert client.get("/admin/tenants/tenant/add/").status_code == 403
    tenant.refresh_from_db()
    assert tenant.tier == Tier.NORMAL


# --- Read-only support: sees every tenant, writes nothing, reads no script or environment


def test_support_lists_every_tenant_and_job_through_the_api(
    client_for, support, job, their_job, tenant, other_tenant
):
    api = client_for(support)
    me = api.get("/api/v1/me/").json()
    assert (me["platform_admin"], me["staff_roles"]) == (False, [ROLE_READ_ONLY_SUPPORT])
    assert {t["slug"] for t in api.get("/api/v1/tenants/").json()["results"]} == {
        tenant.slug,
        other_tenant.slug,
    }
    assert {j["id"] for j in api.get("/api/v1/jobs/").json()["results"]} == {str(job.pk), str(their_job.pk)}
    detail = api.get(f"/api/v1/jobs/{their_job.pk}/")
    assert detail.status_code == 200
    assert "script" not in detail.json() and "env" not in detail.json()
    assert b"secret-material" not in detail.content
    assert api.get(f"/api/v1/tenants/{other_tenant.slug}/members/").status_code == 200


def test_support_reads_the_audit_of_every_tenant(client_for, support, job, their_job, admin_user):
    from jobs.services import job_cancel

    job_cancel(actor=admin_user, job=their_job)
    actions = [e["action"] for e in client_for(support).get("/api/v1/audit/").json()["results"]]
    assert "job.cancel" in actions


def test_support_writes_nothing_through_the_api(client_for, support, job, pending, tenant, catalog):
    api = client_for(support)
    cancel = api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert cancel.status_code == 403 and cancel.json()["code"] == "permission_denied"
    assert approve(api, pending).status_code == 403
    for body in ({"tier": "critical"}, {"name": "Renamed"}):
        assert api.patch(f"/api/v1/tenants/{tenant.slug}/", body, format="json").status_code == 403
    submit = {"tenant": tenant.slug, "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 1,
              "walltime_minutes": 5, "name": "mine", "script": "#!/bin/bash\n"}  # fmt: skip
    assert api.post("/api/v1/jobs/", submit, format="json").status_code == 403
    assert api.delete(f"/api/v1/quota-requests/{pending.pk}/").status_code == 403
    job.refresh_from_db(), pending.refresh_from_db(), tenant.refresh_from_db()
    assert (job.state, pending.state, tenant.tier) == (JobState.QUEUED, RequestState.PENDING, Tier.NORMAL)


def test_support_reads_the_pages_of_any_tenant_and_acts_on_none(client, support, job, tenant):
    console(client, support)
    dashboard = client.get(f"/t/{tenant.slug}/")
    assert dashboard.status_code == 200
    assert "Staff (read-only)" in dashboard.content.decode()
    assert "Admin console" in dashboard.content.decode()
    detail = client.get(f"/t/{tenant.slug}/jobs/{job.pk}/")
    assert detail.status_code == 200 and "secret-material" not in detail.content.decode()
    assert client.post(f"/t/{tenant.slug}/jobs/{job.pk}/cancel/").status_code == 403
    assert (
        client.post(f"/t/{tenant.slug}/team/add/", {"username": "support", "role": "owner"}).status_code
        == 403
    )
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_support_reads_the_console_without_scripts_and_cannot_cancel(client, support, job, pending):
    console(client, support)
    assert client.get("/admin/jobs/job/").status_code == 200
    page = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200
    assert "secret-material" not in page.content.decode() and job.token not in page.content.decode()
    listing = client.post("/admin/jobs/job/", {"action": "cancel_selected", "_selected_action": [job.pk]})
    assert listing.status_code == 200  # the action is not offered: "no action selected"
    assert client.post(f"/admin/tenants/quotarequest/{pending.pk}/decide/",
                       {"decision": "approve", "note": "x"}).status_code == 403  # fmt: skip
    job.refresh_from_db(), pending.refresh_from_db()
    assert (job.state, pending.state) == (JobState.QUEUED, RequestState.PENDING)


def test_the_cancel_action_needs_the_change_permission(client, job):
    from django.contrib.auth.models import Permission

    viewer_staff = UserFactory(username="job-reader", is_staff=True)
    viewer_staff.user_permissions.set(Permission.objects.filter(codename="view_job"))
    console(client, viewer_staff)
    client.post("/admin/jobs/job/", {"action": "cancel_selected", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_the_cancel_action_is_the_change_permissions_whatever_the_tenant_roles(client, job):
    """The console's bulk cancel answers to `jobs.change_job`: staff who hold it cancel a job of a
    tenant they have no role in (jobs.selectors.job_may_cancel, the API's and the pages' rule too)."""
    from django.contrib.auth.models import Permission

    job_staff = UserFactory(username="job-changer", is_staff=True)
    job_staff.user_permissions.set(Permission.objects.filter(codename__in=["view_job", "change_job"]))
    console(client, job_staff)
    done = client.post("/admin/jobs/job/", {"action": "cancel_selected", "_selected_action": [job.pk]})
    assert done.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


# --- Platform admin through the group (no superuser): every power


def test_platform_admin_holds_every_power_in_the_api(client_for, padmin, pending, tenant, job, their_job):
    api = client_for(padmin)
    assert api.get("/api/v1/me/").json()["platform_admin"] is True
    assert api.get(f"/api/v1/jobs/{their_job.pk}/").json()["env"] == ENV
    assert approve(api, pending).status_code == 200
    assert (
        api.patch(f"/api/v1/tenants/{tenant.slug}/", {"tier": "critical"}, format="json").status_code == 200
    )
    assert api.post("/api/v1/tenants/", {"slug": "new-team", "name": "New"}, format="json").status_code == 201
    assert api.post(f"/api/v1/jobs/{their_job.pk}/cancel/").status_code == 202


def test_platform_admin_cancels_in_the_console_and_reads_the_script(client, padmin, job, tenant):
    console(client, padmin)
    page = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "script-secret-material" in page
    done = client.post("/admin/jobs/job/", {"action": "cancel_selected", "_selected_action": [job.pk]})
    assert done.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert 'name="tier"' in client.get(f"/admin/tenants/tenant/{tenant.pk}/change/").content.decode()
    assert "Platform admin" in client.get(f"/t/{tenant.slug}/").content.decode()


@pytest.mark.parametrize(
    "path", ["/api/v1/jobs/", "/api/v1/tenants/", "/api/v1/quota-requests/", "/api/v1/audit/"]
)
def test_support_lists_cost_the_same_queries_for_1_and_20_rows(
    client_for, support, job, tenant, catalog, path
):
    """The staff check reads the caller's permissions once per request, whatever the rows."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.core.services import audit_record
    from tests.factories import TenantFactory

    api = client_for(support)

    def more(n: int) -> None:
        for _ in range(n):
            copy = Job.objects.get(pk=job.pk)
            copy.pk, copy.token = None, Job._meta.get_field("token").default()
            copy.save()
            QuotaRequestFactory(tenant=TenantFactory())
            audit_record(actor=None, action="test.row", target=job, tenant=tenant)

    more(1)
    api.get(path)  # warm: content types
    with CaptureQueriesContext(connection) as one:
        assert api.get(path).status_code == 200
    more(19)
    with CaptureQueriesContext(connection) as twenty:
        rows = api.get(path).json()["results"]
    assert len(rows) >= 20
    assert len(twenty) == len(one), [q["sql"] for q in twenty.captured_queries]
