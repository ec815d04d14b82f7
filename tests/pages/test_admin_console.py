"""The admin console: the quota decision page beside the tenant's waiting jobs, cluster health
(the "Check health now" action and the index page's panel), and the read-only audit log. Django's
test client, and one walk through the console in headless Chromium."""

import os
import socket
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import Cluster, Partition
from jobs.models import Job, JobEvent, JobState
from portal.core.models import AuditEvent
from tenants.models import QuotaGrant, QuotaRequest, RequestState
from tests.browser import browser_page, screenshot
from tests.factories import (
    PASSWORD,
    ClusterFactory,
    JobFactory,
    PartitionFactory,
    QuotaGrantFactory,
    QuotaRequestFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db
# Playwright's sync API runs an event loop in this thread; the browser test's ORM calls happen
# before and after it, never inside a request, so the guard has nothing to protect here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

TODAY = timezone.localdate()


@pytest.fixture
def console(client, admin_user):
    """The test client, logged in as the platform admin, pages in English."""
    client.force_login(admin_user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    return client


def staff_with(client, username: str, *codenames: str):
    """A staff user who holds only the named model permissions, logged in to the client."""
    user = UserFactory(username=username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    return client


def make_job(grant, partition, user, *, name: str, state=JobState.QUEUED, reason: str = "") -> Job:
    """A job row as the services leave it, for pages that only read it."""
    job = JobFactory(
        grant=grant, partition=partition, submitted_by=user, name=name, gpus=2, walltime_minutes=5,
        mem_per_gpu_mb=1000, state=state, reason=reason,
    )  # fmt: skip
    JobEvent.objects.create(job=job, to_state=state, reason=reason or "submitted")
    return job


def decide_url(quota_request: QuotaRequest) -> str:
    return f"/admin/tenants/quotarequest/{quota_request.pk}/decide/"


# --- The decision page


def test_decide_page_shows_the_tenants_waiting_jobs_and_counts_the_running(
    console, tenant, other_tenant, member, outsider, grant, local_partition, catalog
):
    make_job(grant, local_partition, member, name="held-by-quota", reason="quota_wait")
    make_job(grant, local_partition, member, name="in-slurm-queue", state=JobState.PENDING, reason="Priority")
    make_job(grant, local_partition, member, name="already-running", state=JobState.RUNNING)
    make_job(grant, local_partition, member, name="long-done", state=JobState.COMPLETED)
    theirs = QuotaGrantFactory(tenant=other_tenant, gpus=2, gpu_hours=10, days=5)
    make_job(theirs, local_partition, outsider, name="other-teams-job")

    response = console.get(decide_url(QuotaRequestFactory(tenant=tenant)))
    assert response.status_code == 200
    assert [job.name for job in response.context["waiting_jobs"]] == ["held-by-quota", "in-slurm-queue"]
    page = response.content.decode()
    assert "quota_wait" in page and "Priority" in page and ">member<" in page
    assert "Jobs waiting: 2; running: 1." in page
    for absent in ("already-running", "long-done", "other-teams-job"):
        assert absent not in page
    assert "more waiting job" not in page


def test_decide_page_takes_the_same_queries_for_1_and_10_waiting_jobs(
    console, tenant, member, grant, local_partition, catalog
):
    url = decide_url(QuotaRequestFactory(tenant=tenant))
    QuotaRequestFactory(tenant=tenant, gpus=2)  # another request of the tenant, listed beside it
    make_job(grant, local_partition, member, name="job-0")
    console.get(url)  # warm: content types, permissions
    with CaptureQueriesContext(connection) as one:
        assert console.get(url).status_code == 200
    for i in range(1, 10):
        make_job(grant, local_partition, member, name=f"job-{i}", reason="quota_wait")
    with CaptureQueriesContext(connection) as ten:
        response = console.get(url)
    assert len(response.context["waiting_jobs"]) == 10
    assert len(ten) == len(one) <= 10, [q["sql"] for q in ten.captured_queries]


def test_decide_page_lists_50_waiting_jobs_and_says_how_many_more(
    console, tenant, member, grant, local_partition, catalog
):
    for i in range(53):
        make_job(grant, local_partition, member, name=f"job-{i}")
    response = console.get(decide_url(QuotaRequestFactory(tenant=tenant)))
    assert [job.name for job in response.context["waiting_jobs"]] == [f"job-{i}" for i in range(50)]
    page = response.content.decode()
    assert "and 3 more waiting jobs" in page
    assert "Jobs waiting: 53; running: 0." in page


def test_staff_who_may_only_view_requests_reads_the_decide_page_but_cannot_decide(
    client, tenant, catalog, owner
):
    quota_request = QuotaRequestFactory(tenant=tenant)
    staff_with(client, "no-perms")
    assert client.get(decide_url(quota_request)).status_code == 403

    staff_with(client, "reader", "view_quotarequest")
    assert client.get(decide_url(quota_request)).status_code == 200
    response = client.post(decide_url(quota_request), {"decision": "approve", "note": "Sure."})
    assert response.status_code == 403
    listing = client.post(
        "/admin/tenants/quotarequest/",
        {"action": "approve_selected", "_selected_action": [quota_request.pk], "note": "Sure."},
    )
    assert listing.status_code == 200  # the action is not offered: "no action selected"
    quota_request.refresh_from_db()
    assert quota_request.state == RequestState.PENDING
    assert not QuotaGrant.objects.exists()


# --- Cluster health


def check_health(client, *clusters: Cluster):
    return client.post(
        "/admin/clusters/cluster/",
        {"action": "check_health", "_selected_action": [c.pk for c in clusters]},
        follow=True,
    )


def closed_port() -> int:
    """A loopback port that nothing listens on: bound once to find it free, then let go."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def openssh_private_key() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()


def test_check_health_now_asks_the_local_cluster_and_records_its_answer(console, local_partition):
    cluster = local_partition.cluster
    assert cluster.health_checked_at is None and local_partition.gpus_free is None
    response = check_health(console, cluster)
    assert response.status_code == 200
    cluster.refresh_from_db()
    assert cluster.healthy and cluster.health_checked_at is not None
    assert "4 GPUs; state in" in cluster.health_detail
    messages = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert messages == [("success", f"local is healthy: {cluster.health_detail}")]
    assert Partition.objects.get(pk=local_partition.pk).gpus_free is not None  # the inventory ran too
    assert "Healthy" in response.content.decode()


def test_check_health_now_reports_a_cluster_whose_ssh_cannot_connect(console, local_partition):
    port = closed_port()
    unreachable = ClusterFactory(
        slug="far-hpc", name="Far HPC", kind="slurm", ssh_host="127.0.0.1", ssh_port=port, ssh_user="portal",
        ssh_private_key=openssh_private_key(), healthy=True, health_checked_at=timezone.now() - timedelta(days=1),
    )  # fmt: skip
    response = check_health(console, unreachable, local_partition.cluster)
    unreachable.refresh_from_db()
    assert not unreachable.healthy
    assert f"SSH to portal@127.0.0.1:{port} failed" in unreachable.health_detail
    assert unreachable.health_checked_at > timezone.now() - timedelta(minutes=1)
    messages = {(m.level_tag, str(m)) for m in response.context["messages"]}
    assert ("error", f"far-hpc is unhealthy: {unreachable.health_detail}") in messages
    assert any(level == "success" and text.startswith("local is healthy") for level, text in messages)
    page = response.content.decode()
    assert "Unhealthy" in page and "icon-no.svg" in page


def test_a_staff_user_who_may_only_view_clusters_cannot_check_their_health(client, local_partition):
    staff_with(client, "cluster-reader", "view_cluster")
    check_health(client, local_partition.cluster)
    local_partition.cluster.refresh_from_db()
    assert local_partition.cluster.health_checked_at is None


def test_index_page_shows_each_enabled_clusters_health_and_gpus(console, local_partition, catalog):
    Cluster.objects.filter(pk=local_partition.cluster_id).update(health_checked_at=timezone.now())
    Partition.objects.filter(pk=local_partition.pk).update(gpus_free=3)
    down = ClusterFactory(
        slug="k8s", name="GPU Pool", kind="kubernetes", healthy=False, health_detail="API server timed out",
        health_checked_at=timezone.now(),
    )  # fmt: skip
    PartitionFactory(cluster=down, name="a40", gpu_model=catalog[1], nodes=2, max_walltime_minutes=60)
    ClusterFactory(slug="retired", name="Retired Cluster", enabled=False, local_gpus=0, healthy=False)

    with CaptureQueriesContext(connection) as queries:
        page = console.get("/admin/").content.decode()
    panel = page[
        page.index('id="cluster-health"') : page.index("</table>", page.index('id="cluster-health"'))
    ]
    assert f'href="/admin/clusters/cluster/{local_partition.cluster_id}/change/">Local</a>' in panel
    assert f'href="/admin/clusters/cluster/{down.pk}/change/">GPU Pool</a>' in panel
    assert "3 of 4 free" in panel and "? of 16 free" in panel  # the pool's free GPUs were never counted
    assert "Healthy" in panel and "Unhealthy" in panel and "API server timed out" in panel
    assert "Retired Cluster" not in panel
    assert sum("clusters_partition" in q["sql"] for q in queries.captured_queries) == 1


def test_index_page_leaves_the_panel_out_for_staff_who_may_not_view_clusters(client, local_partition):
    staff_with(client, "audit-reader", "view_auditevent")
    page = client.get("/admin/").content.decode()
    assert "Audit events" in page
    assert 'id="cluster-health"' not in page


# --- The audit log: read-only for everyone


@pytest.fixture
def event(admin_user) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=admin_user, actor_username="admin", tenant_id=7, tenant_slug="protein-lab",
        action="quota.approve", target_type="quotarequest", target_id="42", data={"note": "Four for now."},
    )  # fmt: skip


def as_row(event: AuditEvent) -> dict:
    return AuditEvent.objects.filter(pk=event.pk).values().get()


def test_the_audit_event_page_shows_every_field_read_only_without_save_buttons(console, event):
    page = console.get(f"/admin/core/auditevent/{event.pk}/change/").content.decode()
    for value in ("quota.approve", "quotarequest", "42", "protein-lab", "Four for now.", "admin"):
        assert value in page
    for label in ("At:", "Actor:", "Tenant id:", "Target type:", "Data:"):
        assert label in page
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    for field in (
        "actor",
        "actor_username",
        "tenant_id",
        "tenant_slug",
        "action",
        "target_type",
        "target_id",
    ):
        assert f'name="{field}"' not in page  # shown, never an input
    assert "/delete/" not in page


def test_posts_that_would_change_or_delete_an_audit_event_are_refused(console, event):
    before = as_row(event)
    change = console.post(
        f"/admin/core/auditevent/{event.pk}/change/",
        {
            "actor_username": "someone-else",
            "action": "nothing.happened",
            "target_type": "x",
            "target_id": "1",
        },
    )
    assert change.status_code == 403
    assert console.post(f"/admin/core/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert console.post("/admin/core/auditevent/add/", {"action": "forged"}).status_code == 403
    bulk = console.post(
        "/admin/core/auditevent/",
        {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"},
    )
    assert bulk.status_code == 200  # no such action here: the list comes back, nothing deleted
    assert as_row(event) == before
    assert AuditEvent.objects.count() == 1


def test_the_audit_log_offers_no_actions_and_filters_by_date_and_tenant(console, event):
    other = AuditEvent.objects.create(
        actor_username="owner",
        tenant_slug="other-team",
        action="job.cancel",
        target_type="job",
        target_id="9",
    )
    listing = console.get("/admin/core/auditevent/")
    page = listing.content.decode()
    assert "delete_selected" not in page and 'name="action"' not in page
    assert "?tenant_slug=other-team" in page and f"?at__year={TODAY.year}" in page

    by_tenant = console.get("/admin/core/auditevent/?tenant_slug=other-team")
    assert [e.pk for e in by_tenant.context["cl"].result_list] == [other.pk]
    by_day = f"?at__year={TODAY.year}&at__month={TODAY.month}&at__day={TODAY.day}"
    assert {e.pk for e in console.get(f"/admin/core/auditevent/{by_day}").context["cl"].result_list} == {
        event.pk,
        other.pk,
    }
    last_year = console.get(f"/admin/core/auditevent/?at__year={TODAY.year - 1}")
    assert list(last_year.context["cl"].result_list) == []


def test_staff_with_only_the_view_permission_reads_the_audit_log_and_changes_nothing(client, event):
    staff_with(client, "auditor", "view_auditevent")
    listing = client.get("/admin/core/auditevent/")
    assert listing.status_code == 200 and "quota.approve" in listing.content.decode()
    detail = client.get(f"/admin/core/auditevent/{event.pk}/change/")
    assert detail.status_code == 200 and "Four for now." in detail.content.decode()
    before = as_row(event)
    assert client.post(f"/admin/core/auditevent/{event.pk}/change/", {"action": "x"}).status_code == 403
    assert client.post(f"/admin/core/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert as_row(event) == before


# --- In a browser


def test_an_admin_walks_from_cluster_health_to_a_decision_and_the_audit_log(
    live_server, admin_user, member, local_partition, grant, catalog
):
    Cluster.objects.filter(pk=local_partition.cluster_id).update(
        health_checked_at=timezone.now(), health_detail="4 GPUs; state in var/local-cluster"
    )
    quota_request = QuotaRequestFactory(tenant=grant.tenant)
    make_job(grant, local_partition, member, name="waits-for-quota", reason="quota_wait")
    base = live_server.url
    with browser_page() as page:
        page.goto(f"{base}/admin/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        panel = page.locator("#cluster-health")
        expect(panel.get_by_role("link", name="Local")).to_be_visible()
        expect(panel).to_contain_text("Healthy")
        screenshot(page, "admin-index")

        page.goto(f"{base}/admin/tenants/quotarequest/")
        page.get_by_role("link", name="Decide").click()
        page.wait_for_url(f"{base}{decide_url(quota_request)}")
        waiting = page.locator("#waiting-jobs")
        expect(waiting.get_by_role("row").filter(has_text="waits-for-quota")).to_contain_text("quota_wait")
        expect(page.locator("#job-counts")).to_have_text("Jobs waiting: 1; running: 0.")
        expect(page.get_by_role("button", name="Decide")).to_be_visible()
        screenshot(page, "admin-decide")

        page.goto(f"{base}/admin/core/auditevent/")
        expect(page.locator("#result_list")).to_contain_text("membership.add")
        expect(page.locator("#changelist-filter")).to_contain_text("protein-lab")
        expect(page.locator("nav.toplinks")).to_contain_text(str(TODAY.year))  # the date hierarchy
        expect(page.locator("select[name=action]")).to_have_count(0)
        screenshot(page, "admin-audit")
        page.locator("#result_list tbody a").first.click()
        expect(page.get_by_role("heading", level=1)).to_have_text("View audit event")
        expect(page.locator('input[type="submit"]')).to_have_count(0)
