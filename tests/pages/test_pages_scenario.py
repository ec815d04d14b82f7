"""The whole path in a real headless Chromium, against the live server with a real Celery worker
and the local cluster: a researcher sizes and requests quota on the quota page, an admin
approves it in the admin console, the researcher submits a job through the form (checked and
previewed as it is filled in), watches it reach COMPLETED without reloading, then submits
another and cancels it. A screenshot of each page lands under artifacts/."""

from datetime import timedelta

from django.db.models import F
from django.utils import timezone
from playwright.sync_api import Page, expect

from jobs.models import Job, JobState
from tenants.models import QuotaGrant, QuotaRequest, RequestState
from tests.browser import (
    WAIT_MS,
    assert_same_document,
    browser_page,
    log_in,
    mark_document,
    outside_the_browser,
    screenshot,
)
from tests.factories import PASSWORD, JobFactory
from tests.jobs_support import beat

TODAY = timezone.localdate()


def log_out(page: Page) -> None:
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/accounts/login/")


def request_quota(page: Page, base: str) -> None:
    page.get_by_role("link", name="Quota", exact=True).click()
    expect(page.get_by_role("heading", name="Size the request: AI training")).to_be_visible()
    page.get_by_label("Model parameters (billions)").fill("1")
    page.get_by_label("Target days").fill("1")
    options = page.locator("#advice-options tbody tr")
    expect(options.first).to_be_visible()  # the advice came in place, as typed
    use = page.get_by_role("button", name="Use H100-80GB")
    use.click()
    form = page.locator("#quota-request-form")
    expect(form.get_by_label("GPU model")).to_have_value("h100-80gb")
    gpus = int(use.get_attribute("data-gpus"))
    expect(form.get_by_label("GPUs", exact=True)).to_have_value(str(gpus))
    # a 1B model fits in part of one H100: the advice proposes a MIG instance, and the form takes it
    assert use.get_attribute("data-share") == "mig"
    expect(form.get_by_label("Share of a GPU")).to_have_value("mig")
    expect(form.get_by_label("MIG profile")).to_have_value(use.get_attribute("data-mig-profile"))
    form.get_by_label("Share of a GPU").select_option("whole")  # the local cluster gives whole GPUs
    form.get_by_label("MIG profile").select_option("")
    form.get_by_label("GPUs", exact=True).fill("4")  # the local cluster has four
    form.get_by_label("GPU-hours", exact=True).fill("20")
    form.get_by_label("Start").fill(TODAY.isoformat())
    form.get_by_label("End").fill((TODAY + timedelta(days=30)).isoformat())
    form.get_by_label("Justification").fill("Fine-tuning a 1B protein language model.")
    screenshot(page, "quota")
    page.get_by_role("button", name="Send request").click()
    expect(page.get_by_role("status")).to_contain_text("sent.")
    expect(page.locator("#request-rows [data-state]").first).to_have_attribute("data-state", "pending")


def approve_in_admin_console(page: Page, base: str) -> None:
    page.get_by_role("link", name="Quota requests").click()
    page.get_by_role("link", name="Decide").first.click()
    expect(page.get_by_text("Fine-tuning a 1B protein language model.")).to_be_visible()
    page.locator("#id_decision").select_option("approve")
    page.locator("#id_note").fill("Approved for the fine-tuning run.")
    screenshot(page, "admin-decide-scenario")
    page.locator("input[type=submit], button[type=submit]").last.click()
    expect(page.locator(".messagelist")).to_contain_text("decided")


def submit_through_the_form(page: Page, *, name: str, script: str) -> int:
    page.get_by_role("link", name="Submit a job").click()
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("GPUs", exact=True).fill("1")
    page.get_by_label("Walltime (minutes)").fill("5")
    page.get_by_label("Batch script").fill(script)
    expect(page.locator("#preview-script")).to_contain_text(script.splitlines()[-1])  # previewed as typed
    expect(page.locator("#preview-resources")).to_contain_text("1 × H100-80GB on 1 node")
    if name == "hello":
        screenshot(page, "submit")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url("**/jobs/*/")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def earlier_weeks(job: Job) -> None:
    """Finished jobs of the weeks before, as a team's history, settled on its grant: the dashboard
    charts them by day."""
    now = timezone.now()
    history = ((13, 1.5), (11, 2), (9, 1), (8, 2.5), (6, 1), (4, 2), (2, 1), (1, 1))
    QuotaGrant.objects.filter(pk=job.grant_id).update(gpu_hours_used=F("gpu_hours_used") + 12)
    for days_ago, hours in history:
        JobFactory(
            grant=job.grant, partition=job.partition, submitted_by=job.submitted_by, name=f"train-{days_ago}",
            walltime_minutes=600, mem_per_gpu_mb=1000, reserved_gpu_hours=0, state=JobState.COMPLETED,
            started_at=now - timedelta(days=days_ago, hours=hours), finished_at=now - timedelta(days=days_ago),
            gpu_hours=hours,
        )  # fmt: skip


def test_quota_requested_approved_in_the_console_then_a_job_completes_and_another_is_cancelled(
    live_server, celery_worker, owner, admin_user, local_partition
):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "owner")
        request_quota(page, base)
        log_out(page)

        page.goto(f"{base}/admin/login/")
        page.locator("#id_username").fill("admin")
        page.locator("#id_password").fill(PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base}/admin/")
        approve_in_admin_console(page, base)
        page.locator("#logout-form button").click()
        page.wait_for_url("**/accounts/login/")

        log_in(page, base, "owner")
        expect(page.get_by_role("meter", name="GPUs in use")).to_have_attribute("aria-valuetext", "0 of 4")
        job_id = submit_through_the_form(
            page, name="hello", script="#!/bin/bash\necho gpus=$CUDA_VISIBLE_DEVICES"
        )
        expect(page.get_by_role("status")).to_contain_text(f"Job {job_id} submitted.")
        mark_document(page)
        with beat(local_partition.cluster_id):
            expect(page.locator("#job-state")).to_have_attribute("data-state", "COMPLETED", timeout=WAIT_MS)
            expect(page.locator("pre.log")).to_contain_text("gpus=", timeout=WAIT_MS)
        assert_same_document(page)
        screenshot(page, "job")

        long_id = submit_through_the_form(page, name="long", script="#!/bin/bash\necho started\nsleep 120")
        mark_document(page)
        with beat(local_partition.cluster_id):
            expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING", timeout=WAIT_MS)
            page.once("dialog", lambda dialog: dialog.accept())
            page.get_by_role("button", name="Cancel job").click()
            expect(page.locator("#job-state")).to_have_attribute("data-state", "CANCELLED", timeout=WAIT_MS)
        assert_same_document(page)

        outside_the_browser(earlier_weeks, Job.objects.get(pk=job_id))
        page.get_by_role("link", name="Dashboard").click()
        expect(page.locator("canvas#usage-chart[data-drawn]")).to_be_visible()
        expect(page.get_by_text("Total: 12.00 GPU-hours")).to_be_visible()
        screenshot(page, "dashboard-usage")

    quota_request = QuotaRequest.objects.get()
    assert quota_request.state == RequestState.APPROVED
    assert quota_request.decision_note == "Approved for the fine-tuning run."
    grant = QuotaGrant.objects.get()
    assert (grant.gpus, grant.gpu_hours) == (4, 20)
    assert Job.objects.get(pk=job_id).state == JobState.COMPLETED
    assert Job.objects.get(pk=long_id).state == JobState.CANCELLED
