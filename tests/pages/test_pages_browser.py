"""The portal's pages in a real headless Chromium against a live server: live job states through
htmx on the local cluster with a real Celery worker, the cancel button and its refusal, the
language switch, and the keyboard. One screenshot per page under artifacts/."""

import re

from django.utils import timezone
from playwright.sync_api import Page, expect

from jobs.models import Job, JobEvent, JobState
from tests.browser import (
    WAIT_MS,
    assert_same_document,
    browser_page,
    log_in,
    mark_document,
    outside_the_browser,
    screenshot,
)
from tests.factories import JobFactory
from tests.jobs_support import api_submit as submit
from tests.jobs_support import beat

TODAY = timezone.localdate()


def queued_job(grant, partition, user) -> Job:
    """A QUEUED job row, as job_submit leaves it before dispatch, for pages that only read it."""
    job = JobFactory(
        grant=grant, partition=partition, submitted_by=user, name="waiting", walltime_minutes=5,
        mem_per_gpu_mb=1000, reserved_gpu_hours=0,
    )  # fmt: skip
    JobEvent.objects.create(job=job, to_state=JobState.QUEUED, reason="submitted")
    return job


def job_state(page: Page):
    return page.locator("#job-state")


def test_member_watches_a_job_complete_and_cancels_another_in_place(
    live_server, celery_worker, client_for, member, local_partition, grant
):
    api = client_for(member)
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        expect(page.get_by_role("heading", level=1)).to_have_text("Protein Lab")
        expect(page.get_by_role("meter", name="GPUs in use")).to_have_attribute("aria-valuetext", "0 of 4")
        expect(page.get_by_role("meter", name="GPU-hours used")).to_be_visible()
        expect(page.get_by_role("meter", name="Days left")).to_have_attribute(
            "aria-valuetext", "31 days left of 31"
        )
        expect(page.locator("canvas#usage-chart[data-drawn]")).to_be_visible()  # Chart.js drew it
        screenshot(page, "dashboard")

        job = outside_the_browser(submit, api)
        page.goto(f"{base}/t/protein-lab/jobs/{job['id']}/")
        mark_document(page)
        with beat(local_partition.cluster_id):
            expect(job_state(page)).to_have_attribute("data-state", "COMPLETED", timeout=WAIT_MS)
            expect(page.locator("pre.log")).to_contain_text("gpus=", timeout=WAIT_MS)
        assert_same_document(page)
        expect(job_state(page)).to_have_text("Completed")
        expect(page.locator(".timeline li").last).to_contain_text("Completed")
        expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)  # ended: nothing to cancel
        screenshot(page, "job-completed")

        long = outside_the_browser(submit, api, name="long", script="#!/bin/bash\necho started\nsleep 120\n")
        page.goto(f"{base}/t/protein-lab/jobs/{long['id']}/")
        mark_document(page)
        with beat(local_partition.cluster_id):
            expect(job_state(page)).to_have_attribute("data-state", "RUNNING", timeout=WAIT_MS)
            expect(page.locator("pre.log")).to_contain_text("started", timeout=WAIT_MS)
            screenshot(page, "job-running")
            page.once("dialog", lambda dialog: dialog.accept())  # "Cancel this job?"
            page.get_by_role("button", name="Cancel job").click()
            expect(page.get_by_role("status")).to_contain_text(f"Job {long['id']}: cancellation requested.")
            expect(job_state(page)).to_have_attribute("data-state", _any_of("CANCELLING", "CANCELLED"))
            screenshot(page, "job-cancelling")
            expect(job_state(page)).to_have_attribute("data-state", "CANCELLED", timeout=WAIT_MS)
        assert_same_document(page)
        expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
        screenshot(page, "job-cancelled")

        page.goto(f"{base}/t/protein-lab/jobs/")
        expect(page.locator("#job-rows tr")).to_have_count(2)
        screenshot(page, "job-list")

        page.get_by_role("link", name="Dashboard").click()
        expect(page.locator(".events li")).to_have_count(10)  # the latest events of both jobs
        expect(page.locator("#job-rows")).to_contain_text("No job is running or waiting.")
        screenshot(page, "dashboard-after-jobs")
    assert Job.objects.get(pk=long["id"]).state == JobState.CANCELLED


def _any_of(*states: str) -> re.Pattern:
    return re.compile("^(" + "|".join(states) + ")$")


def test_a_viewer_sees_no_cancel_control_and_a_forged_post_is_refused(
    live_server, viewer, member, local_partition, grant
):
    job = queued_job(grant, local_partition, member)
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "viewer")
        page.goto(f"{base}/t/protein-lab/jobs/{job.pk}/")
        expect(job_state(page)).to_have_attribute("data-state", "QUEUED")
        expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
        expect(page.locator("form[action$='/cancel/']")).to_have_count(0)
        screenshot(page, "job-as-viewer")

        # A hand-made form with the page's own, valid CSRF token.
        token = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
        with page.expect_navigation() as navigation:
            page.evaluate(
                """([url, token]) => {
                    const form = Object.assign(document.createElement("form"), {method: "post", action: url});
                    form.append(Object.assign(document.createElement("input"),
                                              {type: "hidden", name: "csrfmiddlewaretoken", value: token}));
                    document.body.append(form);
                    form.submit();
                }""",
                [f"{base}/t/protein-lab/jobs/{job.pk}/cancel/", token],
            )
        assert navigation.value.status == 403
        expect(page.get_by_role("heading", level=1)).to_have_text("Not allowed")
        expect(page.get_by_role("alert")).to_have_text("Your role allows cancelling only your own jobs.")
        screenshot(page, "cancel-forbidden")
        response = page.request.post(
            f"{base}/t/protein-lab/jobs/{job.pk}/cancel/",
            form={"csrfmiddlewaretoken": token},
            headers={"HX-Request": "true"},
        )
        assert response.status == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.events.count() == 1


def test_the_language_switch_turns_the_dashboard_into_chinese_and_back(live_server, member, grant):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.get_by_label("Language").select_option("zh-hans")
        page.get_by_role("button", name="Apply", exact=True).click()
        expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
        expect(page).to_have_url(f"{base}/t/protein-lab/")
        expect(page.get_by_role("link", name="仪表盘")).to_have_attribute("aria-current", "page")
        expect(page.get_by_role("heading", name="已获配额")).to_be_visible()
        expect(page.get_by_role("meter", name="使用中的 GPU")).to_have_attribute("aria-valuetext", "0 / 4")
        days = page.get_by_role("meter", name="剩余天数")
        expect(days).to_have_attribute("aria-valuetext", "剩余 31 天，共 31 天")
        expect(page.get_by_role("heading", name="运行中和等待中的作业")).to_be_visible()
        expect(page.get_by_role("button", name="退出登录")).to_be_visible()
        screenshot(page, "dashboard-zh-hans")
        page.get_by_role("link", name="作业", exact=True).click()
        expect(page.get_by_label("提交者", exact=True)).to_be_visible()
        expect(page.locator("td.empty")).to_have_text("没有符合筛选条件的作业。")
        screenshot(page, "job-list-zh-hans")

        page.get_by_label("语言").select_option("en")
        page.get_by_role("button", name="应用", exact=True).click()
        expect(page.locator("html")).to_have_attribute("lang", "en")
        expect(page).to_have_url(f"{base}/t/protein-lab/jobs/")  # the switch keeps the page
        expect(page.get_by_role("link", name="Jobs", exact=True)).to_have_attribute("aria-current", "page")
        page.get_by_role("link", name="Dashboard").click()
        expect(page.get_by_role("heading", name="Quota grants")).to_be_visible()
        expect(page.get_by_role("meter", name="GPUs in use")).to_have_attribute("aria-valuetext", "0 of 4")


def focus_by_tab(page: Page, selector: str, *, most: int) -> int:
    """Press Tab until the element matching `selector` has focus; how many presses it took."""
    for presses in range(1, most + 1):
        page.keyboard.press("Tab")
        if page.evaluate("(sel) => document.activeElement.matches(sel)", selector):
            return presses
    raise AssertionError(f"{selector} not reached in {most} presses of Tab")


def test_keyboard_reaches_the_switcher_and_the_cancel_button_and_controls_have_labels(
    live_server, member, local_partition, grant
):
    job = queued_job(grant, local_partition, member)
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}/t/protein-lab/jobs/{job.pk}/")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.classList.contains('skip-link')")  # first stop
        assert focus_by_tab(page, "#tenant-switch", most=5) <= 5
        outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
        assert outline != "none"  # the focus ring shows
        focus_by_tab(page, "#cancel-job", most=25)
        screenshot(page, "job-keyboard-focus")
        page.once("dialog", lambda dialog: dialog.accept())
        page.keyboard.press("Enter")
        expect(job_state(page)).to_have_attribute("data-state", "CANCELLED")  # a QUEUED job ends at once

        page.goto(f"{base}/t/protein-lab/jobs/")
        for label in ("Team", "Language", "State", "Scenario", "Submitted by"):
            expect(page.get_by_label(label, exact=True)).to_be_visible()
        page.get_by_label("State", exact=True).select_option("CANCELLED")
        page.get_by_label("Submitted by", exact=True).focus()
        focus_by_tab(page, "#apply-filters", most=3)
        page.keyboard.press("Enter")
        page.wait_for_url("**/jobs/?state=CANCELLED*")
        expect(page.locator("#job-rows tr")).to_have_count(1)
        screenshot(page, "job-list-filtered")

        page.goto(f"{base}/t/protein-lab/")
        page.get_by_label("Team", exact=True).focus()
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")  # the switcher's button, without any script
        page.wait_for_url(f"{base}/t/protein-lab/")
