"""The tenant pages rendered on the server: dashboard, job list, job page, cancel, switcher.
Django's test client, no browser (tests/pages/test_pages_browser.py drives Chromium)."""

import re
import subprocess
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job, JobEvent, JobState
from jobs.states import END_STATES
from tenants.models import QuotaGrant, Role
from tests.conftest import join
from tests.factories import ClusterFactory, JobFactory, PartitionFactory

# The grant fixture's grant: 2 of its 4 GPUs in use, 12.5 of its 100 GPU-hours used.
pytestmark = pytest.mark.grant(gpus_in_use=2, gpu_hours_used=Decimal("12.5"))


def make_job(grant, partition, user, *, state=JobState.QUEUED, name="hello", **fields) -> Job:
    """A job row as the services leave it: page tests read it, they do not run it."""
    job = JobFactory(
        grant=grant, partition=partition, submitted_by=user, name=name, gpus=2, walltime_minutes=5,
        mem_per_gpu_mb=1000, script="#!/bin/bash\necho hi\n", state=state, **fields,
    )  # fmt: skip
    if state not in END_STATES:  # the ledger holds what an unfinished job reserved
        QuotaGrant.objects.filter(pk=grant.pk).update(
            gpu_hours_reserved=F("gpu_hours_reserved") + job.reserved_gpu_hours
        )
    JobEvent.objects.create(job=job, from_state="", to_state=JobState.QUEUED, reason="submitted")
    if state != JobState.QUEUED:
        JobEvent.objects.create(job=job, from_state=JobState.QUEUED, to_state=state)
    return job


HTMX = {"HTTP_HX_REQUEST": "true"}


# --- Access


def test_pages_need_a_login(client, tenant):
    for url in ("/", "/t/protein-lab/", "/t/protein-lab/jobs/", "/t/protein-lab/jobs/1/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_a_tenant_outside_the_callers_answers_404_on_every_page(
    web, outsider, member, grant, local_partition
):
    job = make_job(grant, local_partition, member)
    client = web(outsider)
    for url in (
        "/t/protein-lab/",
        "/t/protein-lab/jobs/",
        "/t/protein-lab/jobs/rows/",
        f"/t/protein-lab/jobs/{job.pk}/",
        f"/t/protein-lab/jobs/{job.pk}/live/",
        f"/t/protein-lab/jobs/{job.pk}/log/",
        "/t/?tenant=protein-lab",
    ):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/t/protein-lab/jobs/{job.pk}/cancel/").status_code == 404
    # A job of another tenant under this tenant's URL is no job either.
    assert client.get(f"/t/other-team/jobs/{job.pk}/").status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_home_redirects_to_the_first_team_and_welcomes_a_user_without_one(web, member, db):
    assert web(member).get("/")["Location"] == "/t/protein-lab/"
    loner = join.__globals__["UserFactory"](username="loner")
    response = web(loner).get("/")
    assert response.status_code == 200
    assert "You are not in any team yet" in response.content.decode()


def test_the_switcher_goes_to_the_chosen_teams_page_and_keeps_the_section(web, member, other_tenant):
    from tenants.services import membership_add

    membership_add(actor=None, tenant=other_tenant, user=member, role=Role.VIEWER)
    client = web(member)
    page = client.get("/t/protein-lab/").content.decode()
    assert '<option value="other-team"' in page and '<label for="tenant-switch">' in page
    assert client.get("/t/?tenant=other-team")["Location"] == "/t/other-team/"
    assert client.get("/t/?tenant=other-team&section=jobs")["Location"] == "/t/other-team/jobs/"
    for section, path in (("quota", "quota/"), ("team", "team/"), ("clusters", "clusters/"), ("x", "")):
        assert client.get(f"/t/?tenant=other-team&section={section}")["Location"] == f"/t/other-team/{path}"
    assert client.get("/t/?tenant=nope").status_code == 404


# --- Dashboard


def test_dashboard_shows_each_grants_bars_the_active_jobs_usage_and_events(
    web, member, grant, local_partition
):
    running = make_job(grant, local_partition, member, state=JobState.RUNNING, name="train")
    # usage counts GPU-hours on the days a job ran them: the job needs its start
    make_job(
        grant, local_partition, member, state=JobState.COMPLETED, name="done",
        started_at=timezone.now() - timedelta(minutes=90), finished_at=timezone.now(), gpu_hours=Decimal("1.5"),
    )  # fmt: skip
    response = web(member).get("/t/protein-lab/")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'aria-valuenow="2" aria-valuetext="2 of 4"' in page  # GPUs in use
    assert "12.5 of 100 (0.2 reserved)" in page
    assert "31 days left of 31" in page
    assert 'id="usage-chart"' in page and 'id="usage-data"' in page
    assert response.context["usage_total"] == 1.5
    assert [job.pk for job in response.context["jobs"]] == [running.pk]  # running and waiting only
    assert "every 3s [!portalLive('events')]" in page  # the active rows poll while the stream is down
    assert f'href="/t/protein-lab/jobs/{running.pk}/">train #{running.pk}</a>' in page  # recent events
    assert "Your role: Member" in page


def test_dashboard_of_a_team_without_grants_or_jobs_says_so(web, member):
    page = web(member).get("/t/protein-lab/").content.decode()
    assert "no current quota grant" in page and "No job is running or waiting." in page
    assert "every 3s" not in page


# --- Job list


def test_the_list_filters_by_state_scenario_and_submitter(web, member, manager, grant, local_partition):
    mine = make_job(grant, local_partition, member, state=JobState.RUNNING, name="mine")
    theirs = make_job(grant, local_partition, manager, state=JobState.COMPLETED, name="theirs")
    client = web(member)

    def shown(query: str) -> list[int]:
        return [job.pk for job in client.get(f"/t/protein-lab/jobs/?{query}").context["jobs"]]

    assert shown("") == [theirs.pk, mine.pk]
    assert shown("state=RUNNING") == [mine.pk]
    assert shown("state=active") == [mine.pk]
    assert shown("submitted_by=manager") == [theirs.pk]
    assert shown("scenario=ai-training&state=COMPLETED") == [theirs.pk]
    assert shown("scenario=cfd") == []
    response = client.get("/t/protein-lab/jobs/?state=NOPE")
    assert response.context["jobs"] == [] and "This filter is not valid" in response.content.decode()


def test_the_list_pages_by_50_with_older_and_newer_links(web, member, grant, local_partition):
    jobs = [
        make_job(grant, local_partition, member, state=JobState.COMPLETED, name=f"j{i}") for i in range(53)
    ]
    client = web(member)
    first = client.get("/t/protein-lab/jobs/?state=COMPLETED")
    assert len(first.context["jobs"]) == 50 and first.context["jobs"][0].pk == jobs[-1].pk
    assert first.context["newer_query"] is None
    older = client.get(f"/t/protein-lab/jobs/?{first.context['older_query']}")
    assert [job.pk for job in older.context["jobs"]] == [job.pk for job in reversed(jobs[:3])]
    assert "state=COMPLETED" in first.context["older_query"]
    newer = client.get(f"/t/protein-lab/jobs/?{older.context['newer_query']}")
    assert [job.pk for job in newer.context["jobs"]] == [job.pk for job in reversed(jobs[3:])]


def test_the_rows_fragment_polls_only_while_a_shown_job_is_active(web, member, grant, local_partition):
    """It follows the tenant's event stream; it polls only while the stream is down and a shown
    job is active."""
    job = make_job(grant, local_partition, member, state=JobState.RUNNING)
    client = web(member)
    fragment = client.get("/t/protein-lab/jobs/rows/?state=RUNNING&state=COMPLETED", **HTMX)
    body = fragment.content.decode()
    assert body.startswith("<tbody") and "every 3s [!portalLive('events')]" in body
    assert 'data-events="/api/v1/events/stream/?tenant=protein-lab"' in body
    assert 'hx-get="/t/protein-lab/jobs/rows/?state=RUNNING&amp;state=COMPLETED"' in body
    assert "no-cache" in fragment["Cache-Control"] and "HX-Request" in fragment["Vary"]
    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED)
    body = client.get("/t/protein-lab/jobs/rows/?state=RUNNING&state=COMPLETED", **HTMX).content.decode()
    assert "every 3s" not in body and 'data-state="COMPLETED"' in body
    assert 'hx-trigger="portal:job from:body throttle:500ms"' in body


@pytest.mark.parametrize("url", ["/t/protein-lab/jobs/", "/t/protein-lab/jobs/rows/", "/t/protein-lab/"])
def test_lists_take_the_same_queries_for_1_and_20_jobs(web, member, grant, local_partition, url):
    client = web(member)
    make_job(grant, local_partition, member, state=JobState.RUNNING)
    client.get(url)  # warm: content types, permissions
    with CaptureQueriesContext(connection) as one:
        assert client.get(url).status_code == 200
    for i in range(19):
        make_job(grant, local_partition, member, state=JobState.RUNNING, name=f"n{i}")
    with CaptureQueriesContext(connection) as twenty:
        response = client.get(url)
    assert len(response.context["jobs"]) == 20
    # 17: the dashboard's budget panel reads the tenant's budgets (none here: nothing priced).
    assert len(twenty) == len(one) <= 17, [q["sql"] for q in twenty.captured_queries]


# --- Job page


def test_the_job_page_shows_resources_timeline_gpu_hours_and_log_state(web, member, grant, local_partition):
    job = make_job(
        grant, local_partition, member, state=JobState.COMPLETED, exit_code=0, gpu_hours=Decimal("0.0123"),
        started_at=timezone.now() - timedelta(minutes=2), finished_at=timezone.now(),
    )  # fmt: skip
    page = web(member).get(f"/t/protein-lab/jobs/{job.pk}/").content.decode()
    assert "2 × H100-80GB" in page
    assert "0.0123" in page and "0:02:00" in page
    assert page.count('<li class="tl-') == 2  # QUEUED, COMPLETED
    assert "The job has not reached the cluster yet" in page  # no backend id: no log to read
    assert "hx-trigger" not in page  # ended: nothing polls
    assert "Cancel job" not in page  # ended: nothing to cancel


def test_an_unreadable_log_is_a_message_in_the_page(web, member, grant, local_partition, tmp_path):
    # A local cluster whose state directory is a file: every read of it fails, as a lost disk would.
    state = Path(settings.VAR_DIR) / "local-cluster" / "unreadable"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("not a directory")
    cluster = ClusterFactory(slug="unreadable", local_gpus=1, healthy=False)
    partition = PartitionFactory(
        cluster=cluster, gpu_model=grant.gpu_model, gpus_per_node=1, max_walltime_minutes=60
    )
    try:
        job = make_job(grant, partition, member, state=JobState.RUNNING, backend_id="local-1")
        client = web(member)
        page = client.get(f"/t/protein-lab/jobs/{job.pk}/").content.decode()
        assert "The output cannot be read from cluster Unreadable right now. Trying again." in page
        fragment = client.get(f"/t/protein-lab/jobs/{job.pk}/log/", **HTMX)
        assert fragment.status_code == 200 and 'role="alert"' in fragment.content.decode()
    finally:
        state.unlink()


@pytest.mark.parametrize(
    ("persona", "own", "shown"),
    [("owner", False, True), ("manager", False, True), ("member", True, True), ("member", False, False),
     ("viewer", False, False)],
)  # fmt: skip
def test_the_cancel_button_shows_only_to_who_may_cancel(
    web, request, tenant, grant, local_partition, persona, own, shown
):
    user = request.getfixturevalue(persona)
    submitter = user if own else join(tenant, "someone", Role.MEMBER)
    job = make_job(grant, local_partition, submitter, state=JobState.RUNNING)
    page = web(user).get(f"/t/protein-lab/jobs/{job.pk}/").content.decode()
    assert ('id="cancel-job"' in page) is shown


# --- Cancel


def test_a_viewers_hand_made_cancel_is_refused_with_403_and_changes_nothing(
    web, viewer, member, grant, local_partition
):
    job = make_job(grant, local_partition, member, state=JobState.QUEUED)
    response = web(viewer).post(f"/t/protein-lab/jobs/{job.pk}/cancel/")
    assert response.status_code == 403
    assert "Your role allows cancelling only your own jobs." in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_member_cannot_cancel_another_members_job(web, member, tenant, grant, local_partition):
    other = join(tenant, "other", Role.MEMBER)
    job = make_job(grant, local_partition, other, state=JobState.QUEUED)
    assert web(member).post(f"/t/protein-lab/jobs/{job.pk}/cancel/").status_code == 403


def test_cancel_needs_post_and_a_csrf_token(member, grant, local_partition):
    from django.test import Client

    job = make_job(grant, local_partition, member)
    client = Client(enforce_csrf_checks=True)
    client.force_login(member)
    assert client.get(f"/t/protein-lab/jobs/{job.pk}/cancel/").status_code == 405
    response = client.post(f"/t/protein-lab/jobs/{job.pk}/cancel/")
    assert response.status_code == 403 and "Form expired" in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_cancel_without_javascript_redirects_back_with_a_message(web, member, grant, local_partition):
    job = make_job(grant, local_partition, member, state=JobState.QUEUED)
    response = web(member).post(f"/t/protein-lab/jobs/{job.pk}/cancel/", follow=True)
    assert response.redirect_chain == [(f"/t/protein-lab/jobs/{job.pk}/", 302)]
    page = response.content.decode()
    assert f"Job {job.pk}: cancellation requested." in page and 'data-state="CANCELLED"' in page
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_cancel_through_htmx_swaps_the_live_part_with_the_message_out_of_band(
    web, member, grant, local_partition
):
    job = make_job(grant, local_partition, member, state=JobState.QUEUED)
    response = web(member).post(f"/t/protein-lab/jobs/{job.pk}/cancel/", **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and body.startswith('<div id="job-live"')
    assert 'data-state="CANCELLED"' in body and 'id="cancel-job"' not in body
    assert '<div id="flash" class="flash" hx-swap-oob="true">' in body and "cancellation requested" in body


def test_cancelling_an_ended_job_is_a_409_shown_as_a_message(web, member, grant, local_partition):
    job = make_job(grant, local_partition, member, state=JobState.COMPLETED)
    client = web(member)
    response = client.post(f"/t/protein-lab/jobs/{job.pk}/cancel/", **HTMX)
    assert response.status_code == 409
    assert f"Job {job.pk} has already ended; there is nothing to cancel." in response.content.decode()
    response = client.post(f"/t/protein-lab/jobs/{job.pk}/cancel/", follow=True)
    assert "has already ended" in response.content.decode()


# --- Languages


def test_the_pages_speak_simplified_chinese_when_chosen(client, member, grant, local_partition):
    job = make_job(grant, local_partition, member, state=JobState.RUNNING)
    client.force_login(member)
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/t/protein-lab/"})
    assert response.status_code == 302
    page = client.get("/t/protein-lab/").content.decode()
    assert '<html lang="zh-hans">' in page
    for text in ("仪表盘", "配额", "运行中", "切换", "语言"):
        assert text in page, text
    page = client.get(f"/t/protein-lab/jobs/{job.pk}/").content.decode()
    assert "取消作业" in page and "时间线" in page


def test_every_message_has_a_chinese_translation_with_matching_placeholders():
    """msgfmt (gettext, which the install needs to compile the catalog) counts what is
    untranslated or fuzzy, and --check fails on a placeholder a translation dropped."""
    po = settings.BASE_DIR / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
    result = subprocess.run(
        ["msgfmt", "--check", "--statistics", "-o", "/dev/null", str(po)],
        capture_output=True, text=True, timeout=30, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\d+ translated messages\.\n", result.stderr), result.stderr
