"""The pages of lending and restarts (issue 23): the submit form's preemption and restart fields,
a restarted job's attempts on its page, the dashboard's lending panel, and cohorts and loans in
the admin console. Django's test client, and headless Chromium for each page as a person uses it.

Job rows and attempts are written straight into the database: these tests read pages, the
services that move jobs between attempts are tested in tests/jobs/."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import GpuModel
from jobs.models import Job, JobAttempt, JobEvent, JobState, Loan
from portal.core.models import AuditEvent
from portal.core.staff import ROLE_PLATFORM_ADMIN, ROLE_READ_ONLY_SUPPORT, staff_role_groups_sync
from tenants.models import Cohort, CohortMember
from tests.browser import browser_page, log_in, outside_the_browser, screenshot
from tests.factories import PASSWORD, JobFactory, QuotaGrantFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/t/protein-lab/jobs/new/"


def body(**overrides) -> dict:
    return {
        "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": "1", "nodes": "1", "walltime_minutes": "5",
        "name": "lendable", "priority": "", "template": "", "script": "#!/bin/bash\necho hi\n", "env": "",
    } | overrides  # fmt: skip


def errors_of(page: str, field: str) -> list[str]:
    box = re.search(rf'<div class="field-errors" id="id_{field}-errors"[^>]*>(.*?)</div>', page, re.S)
    assert box, f"no error box for {field}"
    return re.findall(r'<p class="error field-error"[^>]*>(.*?)</p>', box.group(1), re.S)


def staff(username: str, role: str):
    """A staff user (not a superuser) in one documented role's group."""
    staff_role_groups_sync(apps)  # a transactional test elsewhere may have flushed the groups
    user = UserFactory(username=username, is_staff=True)
    user.groups.set(Group.objects.filter(name=role))
    return user


# --- The submit form


def test_a_preemptible_job_gets_the_default_restarts_and_what_was_typed_reaches_the_job(
    web, member, grant, local_partition
):
    client = web(member)
    page = client.get(f"{URL}?scenario=ai-training").content.decode()
    assert 'name="preemptible"' in page and 'id="id_preemptible-help"' in page
    assert re.search(r'<input type="number" name="max_restarts" min="0" max="10"', page)  # JOB_MAX_RESTARTS
    assert client.post(URL, body(preemptible="on")).status_code == 302
    first = Job.objects.get()
    assert (first.preemptible, first.max_restarts, first.restart_exit_codes) == (True, 3, "")

    response = client.post(URL, body(name="picky", max_restarts="2", restart_exit_codes="42, 1"))
    assert response.status_code == 302
    picky = Job.objects.get(name="picky")
    assert (picky.preemptible, picky.max_restarts, picky.restart_exit_codes) == (False, 2, "1,42")


def test_restart_fields_out_of_bounds_are_named_on_their_fields(web, member, grant, local_partition):
    client = web(member)
    page = client.post(URL, body(restart_exit_codes="1,x", max_restarts="11")).content.decode()
    assert errors_of(page, "restart_exit_codes") == ["Whole numbers separated by commas, e.g. 1,42."]
    assert errors_of(page, "max_restarts") == ["Ensure this value is less than or equal to 10."]
    # the service's own rules, on the same field
    response = client.post(URL, body(restart_exit_codes="300", max_restarts="2"))
    assert response.status_code == 400
    assert errors_of(response.content.decode(), "restart_exit_codes") == [
        "At most 8 exit codes, each from 1 to 255."
    ]
    assert not Job.objects.exists()


def test_a_member_submits_a_preemptible_job_in_chromium(live_server, member, grant, local_partition):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}{URL}?scenario=ai-training")
        page.get_by_label("Name", exact=True).fill("borrower")
        page.get_by_label("GPUs", exact=True).fill("1")
        page.get_by_label("Walltime (minutes)").fill("5")
        page.get_by_label("Batch script").fill("#!/bin/bash\necho hi\n")
        page.get_by_label("Preemptible").check()
        expect(page.locator("#id_preemptible-help")).to_contain_text("resumes from its last checkpoint")
        expect(page.locator("#id_max_restarts-help")).to_contain_text("Left empty: 3 for a preemptible job")
        page.get_by_label("Restart on exit codes").fill("1,x")
        codes_errors = page.locator("#id_restart_exit_codes-errors")
        expect(codes_errors).to_have_text("Whole numbers separated by commas, e.g. 1,42.")  # as it is typed
        screenshot(page, "job-new-preemptible")
        page.get_by_role("button", name="Submit job").click()
        expect(codes_errors).to_have_text("Whole numbers separated by commas, e.g. 1,42.")  # the POST's page
        expect(page.get_by_label("Preemptible")).to_be_checked()
        page.get_by_label("Restart on exit codes").fill("")
        page.get_by_role("button", name="Submit job").click()
        page.wait_for_url(f"{base}/t/protein-lab/jobs/*/")
        expect(page.locator("#job-preemptible")).to_have_text("yes")
        expect(page.locator("#job-attempt")).to_have_text("1 of 4")
        job = outside_the_browser(lambda: Job.objects.get())
    assert (job.name, job.preemptible, job.max_restarts, job.restart_exit_codes) == ("borrower", True, 3, "")


# --- The job page


def restarted_job(grant, partition, user, *, attempts: int = 1) -> Job:
    """A preemptible job on its attempt `attempts + 1`, running on one borrowed GPU and reclaimed
    by its lender; its first attempt was preempted 10 minutes past its last checkpoint."""
    now = timezone.now()
    job = JobFactory(
        grant=grant, partition=partition, submitted_by=user, name="resumable", gpus=1, state=JobState.RUNNING,
        preemptible=True, max_restarts=3, attempt=attempts + 1, gpus_borrowed=1, node_list="gpu02",
        started_at=now - timedelta(minutes=5), stop_at=now + timedelta(minutes=4),
        gpu_hours=Decimal("0.6667"), gpu_hours_lost=Decimal("0.1667") * attempts, backend_id="102",
    )  # fmt: skip
    for number in range(1, attempts + 1):
        start = now - timedelta(hours=2 * number)
        JobAttempt.objects.create(
            job=job, number=number, backend_id=f"10{number}", token=f"t{number}", node_list="gpu01",
            started_at=start, ended_at=start + timedelta(minutes=50), end_state=JobState.PREEMPTED,
            reason="reclaimed by its lender", gpu_hours=Decimal("0.8333"),
            checkpoint_at=start + timedelta(minutes=40), gpu_hours_lost=Decimal("0.1667"), reviewed=True,
        )  # fmt: skip
    events = [(1, JobState.QUEUED, "submitted"), (1, JobState.RUNNING, ""), (1, JobState.PREEMPTED, "")]
    events += [(2, JobState.QUEUED, "restarted: attempt 2 of 4"), (2, JobState.RUNNING, "")]
    for attempt, state, reason in events:
        JobEvent.objects.create(job=job, attempt=attempt, to_state=state, reason=reason)
    return job


def test_the_job_page_takes_the_same_queries_for_1_and_3_ended_attempts(web, member, grant, local_partition):
    client = web(member)
    one = restarted_job(grant, local_partition, member)
    three = restarted_job(grant, local_partition, member, attempts=3)
    for url in (f"/t/protein-lab/jobs/{one.pk}/", f"/t/protein-lab/jobs/{one.pk}/live/"):
        client.get(url)  # warm
        with CaptureQueriesContext(connection) as first:
            assert len(client.get(url).context["attempts"]) == 1
        with CaptureQueriesContext(connection) as third:
            response = client.get(url.replace(str(one.pk), str(three.pk)))
        assert len(response.context["attempts"]) == 3
        assert len(third) == len(first), [q["sql"] for q in third.captured_queries]


def test_a_job_on_its_first_attempt_shows_no_attempts_and_a_requeued_one_its_backoff(
    web, member, grant, local_partition
):
    plain = JobFactory(grant=grant, partition=local_partition, submitted_by=member, state=JobState.RUNNING)
    page = web(member).get(f"/t/protein-lab/jobs/{plain.pk}/").content.decode()
    for absent in ('id="job-attempts"', 'id="job-attempt"', 'id="job-preemptible"', "GPU-hours lost"):
        assert absent not in page
    waiting = JobFactory(
        grant=grant, partition=local_partition, submitted_by=member, state=JobState.QUEUED, attempt=2,
        max_restarts=2, restart_after=timezone.now() + timedelta(minutes=1), reason="restart_backoff",
    )  # fmt: skip
    page = web(member).get(f"/t/protein-lab/jobs/{waiting.pk}/").content.decode()
    assert 'id="job-restart-after"' in page and "waits for its backoff until" in page
    assert 'id="job-stop-at"' not in page
    assert 'data-attempt="2" class="current-attempt"' in page  # no row of its own yet


def test_the_attempts_of_a_restarted_job_in_chromium(live_server, member, grant, local_partition):
    job = restarted_job(grant, local_partition, member)
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}/t/protein-lab/jobs/{job.pk}/")
        rows = page.locator("#job-attempts tbody tr")
        expect(rows).to_have_count(2)
        first, current = rows.nth(0), rows.nth(1)
        for text in ("gpu01", "Preempted", "reclaimed by its lender", "40 minutes of work kept", "0.1667"):
            expect(first).to_contain_text(text)
        expect(current).to_contain_text("gpu02")
        expect(current).to_contain_text("Running")
        expect(page.locator("#job-attempt")).to_have_text("2 of 4")
        expect(page.locator("#job-preemptible")).to_have_text("yes; 1 GPU borrowed from its cohort")
        expect(page.locator("#job-stop-at")).to_contain_text("Reclaimed by its lender")
        expect(page.locator("#job-gpu-hours-lost")).to_contain_text(
            "0.1667 (work past a checkpoint, not charged)"
        )
        timeline = page.locator(".timeline li")
        expect(timeline).to_have_count(5)
        expect(timeline.nth(2).locator(".attempt-no")).to_have_count(0)
        expect(timeline.nth(3)).to_contain_text("attempt 2")
        screenshot(page, "job-attempts")


# --- The dashboard's lending panel


@pytest.fixture
def cohort(tenant, other_tenant, catalog):
    """protein-lab and other-team lend each other H100s: protein-lab lends 2 and borrows 4."""
    cohort = Cohort.objects.create(slug="h100-pool", gpu_model=catalog[1], reclaim_grace_s=300)
    CohortMember.objects.create(cohort=cohort, tenant=tenant, lending_limit=2, borrowing_limit=4)
    CohortMember.objects.create(cohort=cohort, tenant=other_tenant, lending_limit=1, borrowing_limit=2)
    return cohort


@pytest.fixture
def loans(cohort, tenant, other_tenant, grant, local_partition, outsider, member):
    """Now, 2 of protein-lab's GPUs run a job of other-team's (for 3 hours so far); yesterday,
    other-team took back the GPU a protein-lab job had borrowed for an hour."""
    now = timezone.now()
    theirs = QuotaGrantFactory(tenant=other_tenant, pair=(grant.scenario, grant.gpu_model), gpus=2)
    their_job = JobFactory(grant=theirs, partition=local_partition, submitted_by=outsider, gpus=2)
    our_job = JobFactory(grant=grant, partition=local_partition, submitted_by=member, gpus=1)
    open_loan = Loan.objects.create(
        cohort=cohort, job=their_job, borrower=other_tenant, lender=tenant, lender_grant=grant, gpus=2,
        started_at=now - timedelta(hours=3),
    )  # fmt: skip
    Loan.objects.create(
        cohort=cohort, job=our_job, borrower=tenant, lender=other_tenant, lender_grant=theirs, gpus=1,
        started_at=now - timedelta(hours=26), ended_at=now - timedelta(hours=25), reclaimed=True,
    )  # fmt: skip
    return open_loan


def test_a_team_in_no_cohort_has_no_lending_panel(web, member, grant, other_tenant, catalog):
    other = Cohort.objects.create(slug="elsewhere", gpu_model=catalog[1])
    CohortMember.objects.create(cohort=other, tenant=other_tenant, lending_limit=4)
    response = web(member).get("/t/protein-lab/")
    assert response.context["lending"] is None
    page = response.content.decode()
    assert 'id="lending"' not in page and "elsewhere" not in page


def test_the_lending_panel_takes_the_same_queries_for_1_and_3_cohorts(web, member, loans, catalog, tenant):
    client = web(member)
    client.get("/t/protein-lab/")  # warm
    with CaptureQueriesContext(connection) as one:
        client.get("/t/protein-lab/")
    for slug in ("more-a", "more-b"):
        more = Cohort.objects.create(slug=slug, gpu_model=catalog[1])
        CohortMember.objects.create(cohort=more, tenant=tenant, lending_limit=1)
    with CaptureQueriesContext(connection) as three:
        response = client.get("/t/protein-lab/")
    assert [c["cohort"] for c in response.context["lending"]["cohorts"]] == ["h100-pool", "more-a", "more-b"]
    assert len(three) == len(one), [q["sql"] for q in three.captured_queries]


def test_the_lending_panel_in_chromium(live_server, member, loans):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        panel = page.locator("#lending")
        expect(panel.get_by_role("heading", name="Lending")).to_be_visible()
        row = panel.locator("tr[data-cohort=h100-pool]")
        expect(row.locator(".lent")).to_have_text("2 of 2 GPUs")
        expect(row.locator(".borrowed")).to_have_text("0 of 4 GPUs")
        expect(row).to_contain_text("300 s")
        expect(panel.locator("#lending-lent-hours")).to_have_text(re.compile(r"^6\.0\d$"))
        expect(panel.locator("#lending-borrowed-hours")).to_have_text("1.00")
        expect(panel.locator("#lending-reclaimed-from-borrowers")).to_have_text("0")
        expect(panel.locator("#lending-reclaimed-from-us")).to_have_text("1")
        expect(panel).not_to_contain_text("other-team")  # no other member of the cohort is named
        screenshot(page, "dashboard-lending")


# --- The admin console: cohorts and loans


def test_read_only_support_views_cohorts_and_loans_and_changes_neither(client, loans, cohort, tenant):
    client.force_login(staff("support", ROLE_READ_ONLY_SUPPORT))
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    listing = client.get("/admin/tenants/cohort/")
    assert listing.status_code == 200 and "h100-pool" in listing.content.decode()
    change = client.get(f"/admin/tenants/cohort/{cohort.pk}/change/")
    assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
    assert client.get("/admin/tenants/cohort/add/").status_code == 403
    posted = client.post(f"/admin/tenants/cohort/{cohort.pk}/change/", {"slug": "renamed"})
    assert posted.status_code == 403
    assert client.post(f"/admin/tenants/cohort/{cohort.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Cohort.objects.get().slug == "h100-pool"
    assert client.get("/admin/jobs/loan/").status_code == 200
    assert client.get(f"/admin/jobs/loan/{loans.pk}/change/").status_code == 200


def test_nobody_adds_changes_or_deletes_a_loan_in_the_console(client, admin_user, loans):
    client.force_login(admin_user)
    assert client.get("/admin/jobs/loan/add/").status_code == 403
    assert client.post(f"/admin/jobs/loan/{loans.pk}/change/", {"gpus": "9"}).status_code == 403
    assert client.post(f"/admin/jobs/loan/{loans.pk}/delete/", {"post": "yes"}).status_code == 403
    open_only = client.get("/admin/jobs/loan/?open=yes").context["cl"].result_list
    assert [loan.pk for loan in open_only] == [loans.pk]
    assert Loan.objects.get(pk=loans.pk).gpus == 2


def test_a_cohort_on_a_partition_of_another_gpu_model_is_refused(
    client, admin_user, local_partition, catalog
):
    other = GpuModel.objects.exclude(pk=catalog[1].pk).first()
    client.force_login(admin_user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    response = client.post(
        "/admin/tenants/cohort/add/",
        {"slug": "mixed", "gpu_model": other.pk, "partition": local_partition.pk, "reclaim_grace_s": "300",
         "members-TOTAL_FORMS": "0", "members-INITIAL_FORMS": "0"},
    )  # fmt: skip
    assert response.status_code == 200
    assert "This partition&#x27;s GPUs are not the cohort&#x27;s GPU model." in response.content.decode()
    assert not Cohort.objects.exists()


def management(total: int, initial: int) -> dict:
    return {
        "members-TOTAL_FORMS": str(total), "members-INITIAL_FORMS": str(initial),
        "members-MIN_NUM_FORMS": "0", "members-MAX_NUM_FORMS": "1000",
    }  # fmt: skip


def test_a_platform_admin_changes_a_cohort_and_its_members_through_the_audited_services(
    client, cohort, tenant, other_tenant
):
    ours, theirs = (CohortMember.objects.get(tenant=t) for t in (tenant, other_tenant))
    client.force_login(staff("padmin", ROLE_PLATFORM_ADMIN))
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    response = client.post(
        f"/admin/tenants/cohort/{cohort.pk}/change/",
        {"name": "H100 pool", "partition": "", "reclaim_grace_s": "600", **management(2, 2),
         "members-0-id": ours.pk, "members-0-cohort": cohort.pk, "members-0-lending_limit": "3",
         "members-0-borrowing_limit": "4",
         "members-1-id": theirs.pk, "members-1-cohort": cohort.pk, "members-1-lending_limit": "1",
         "members-1-borrowing_limit": "2", "members-1-DELETE": "on"},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()
    cohort.refresh_from_db()
    assert (cohort.name, cohort.reclaim_grace_s) == ("H100 pool", 600)
    assert list(CohortMember.objects.values_list("tenant__slug", "lending_limit", "borrowing_limit")) == [
        ("protein-lab", 3, 4)
    ]
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"cohort.update", "cohort.member.set", "cohort.member.remove"} <= actions


def test_a_tenant_already_in_a_cohort_of_the_model_is_not_added_to_another(
    client, admin_user, cohort, tenant
):
    client.force_login(admin_user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    response = client.post(
        "/admin/tenants/cohort/add/",
        {"slug": "second-pool", "gpu_model": cohort.gpu_model_id, "partition": "", "reclaim_grace_s": "300",
         **management(1, 0), "members-0-tenant": tenant.pk, "members-0-lending_limit": "1",
         "members-0-borrowing_limit": "1"},
        follow=True,
    )  # fmt: skip
    shown = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert any(level == "error" and "already in cohort h100-pool" in text for level, text in shown), shown
    assert not CohortMember.objects.filter(cohort__slug="second-pool").exists()


def test_a_platform_admin_makes_a_cohort_with_a_member_and_reads_the_loans_in_chromium(
    live_server, tenant, loans, catalog
):
    outside_the_browser(lambda: staff("padmin", ROLE_PLATFORM_ADMIN))
    # protein-lab lends its H100s in h100-pool (`loans`): the new cohort is of another model
    a100 = GpuModel.objects.exclude(pk=catalog[1].pk).order_by("slug").first()
    base = live_server.url
    with browser_page() as page:
        page.goto(f"{base}/admin/")
        page.get_by_label("Username").fill("padmin")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.goto(f"{base}/admin/tenants/cohort/add/")
        page.locator("#id_slug").fill("a100-pool")
        page.locator("#id_gpu_model").select_option(str(a100.pk))
        page.locator("#id_reclaim_grace_s").fill("120")
        page.get_by_role("button", name="Add another Cohort member").click()
        page.locator("#members-0 .select2-selection").click()
        page.locator(".select2-search__field").fill("protein")
        page.locator(".select2-results__option", has_text="protein-lab").click()
        page.locator("#id_members-0-lending_limit").fill("3")
        page.locator("#id_members-0-borrowing_limit").fill("1")
        screenshot(page, "admin-cohort-add")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator(".messagelist")).to_contain_text("was added successfully")
        row = page.locator("#result_list tbody tr", has_text="a100-pool")
        expect(row).to_contain_text("120")
        expect(row.locator("td.field-member_count")).to_have_text("1")
        screenshot(page, "admin-cohorts")

        page.goto(f"{base}/admin/jobs/loan/")
        expect(page.locator("#result_list tbody tr")).to_have_count(2)
        expect(page.locator("#changelist-filter")).to_contain_text("open")
        expect(page.get_by_role("link", name="Add loan")).to_have_count(0)
        expect(page.locator("select[name=action]")).to_have_count(0)
        page.goto(f"{base}/admin/jobs/loan/?open=yes")
        expect(page.locator("#result_list tbody tr")).to_have_count(1)
        screenshot(page, "admin-loans")
        page.locator("#result_list tbody a").first.click()
        expect(page.get_by_role("heading", level=1)).to_have_text("View loan")
        expect(page.locator('input[type="submit"]')).to_have_count(0)
    member = CohortMember.objects.get(cohort__slug="a100-pool")
    assert (member.tenant, member.lending_limit, member.borrowing_limit) == (tenant, 3, 1)
    assert {"cohort.create", "cohort.member.set"} <= set(AuditEvent.objects.values_list("action", flat=True))


def test_a_platform_admin_deletes_a_cohort_once_its_loans_have_ended(client, admin_user, loans, cohort):
    client.force_login(admin_user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    kept = client.post(f"/admin/tenants/cohort/{cohort.pk}/delete/", {"post": "yes"}, follow=True)
    assert kept.status_code == 200 and "has open loans" in kept.content.decode()  # said, not a 500
    assert Cohort.objects.filter(pk=cohort.pk).exists()
    Loan.objects.filter(pk=loans.pk).update(ended_at=timezone.now())
    assert client.post(f"/admin/tenants/cohort/{cohort.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Cohort.objects.filter(pk=cohort.pk).exists()
    assert Loan.objects.filter(cohort__isnull=True).count() == 2  # the record stays
