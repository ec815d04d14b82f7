"""The job pages follow the event streams in Chromium: a state change reaches the job page and the
job list through the stream, with no polling while the stream is up; a new log line is appended
as the job prints it; and with the stream cut, the pages poll again as before."""

import re

from playwright.sync_api import expect

from jobs.models import Job, JobState
from jobs.services.common import job_move
from tests.browser import WAIT_MS, browser_page, log_in, outside_the_browser, screenshot
from tests.jobs_support import api_submit as submit
from tests.jobs_support import beat

POLLED = re.compile(r"/t/protein-lab/jobs/(\d+/live/|rows/)")


def moved(job_id: int, state: str) -> None:
    job = Job.objects.get(pk=job_id)
    job_move(job, state, reason=f"moved to {state}")
    job.save(update_fields=["state", "reason", "raw_state"])


def fragment_requests(page) -> list[str]:
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url) if POLLED.search(request.url) else None)
    return seen


def test_the_job_page_and_list_follow_the_stream_without_polling(
    live_server, client_for, member, local_partition, grant
):
    api = client_for(member)
    job = outside_the_browser(submit, api, name="streamed")
    outside_the_browser(moved, job["id"], JobState.SUBMITTING)
    outside_the_browser(moved, job["id"], JobState.PENDING)
    with browser_page() as page:
        log_in(page, live_server.url, "member")
        page.goto(f"{live_server.url}/t/protein-lab/jobs/{job['id']}/")
        page.wait_for_function("window.portalLive && portalLive('events')", timeout=WAIT_MS)
        seen = fragment_requests(page)
        page.wait_for_timeout(4000)  # longer than the 3 s poll: no poll comes while the stream is up
        assert seen == []
        outside_the_browser(moved, job["id"], JobState.RUNNING)
        expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING", timeout=WAIT_MS)
        expect(page.locator(".reason").first).to_have_text("moved to RUNNING")
        assert len(seen) == 1  # one fetch, because of the event

        page.goto(f"{live_server.url}/t/protein-lab/jobs/")
        page.wait_for_function("portalLive('events')", timeout=WAIT_MS)
        seen = fragment_requests(page)
        outside_the_browser(moved, job["id"], JobState.CANCELLING)
        row = page.locator("#job-rows tr").filter(has_text="streamed")
        expect(row.locator("[data-state]")).to_have_attribute("data-state", "CANCELLING", timeout=WAIT_MS)
        page.wait_for_timeout(3500)
        assert len(seen) == 1


def test_with_the_stream_cut_the_job_page_polls_again(
    live_server, client_for, member, local_partition, grant
):
    api = client_for(member)
    job = outside_the_browser(submit, api, name="polled")
    outside_the_browser(moved, job["id"], JobState.SUBMITTING)
    with browser_page() as page:
        page.route(re.compile(r".*/stream/.*"), lambda route: route.abort())
        log_in(page, live_server.url, "member")
        seen = fragment_requests(page)
        page.goto(f"{live_server.url}/t/protein-lab/jobs/{job['id']}/")
        outside_the_browser(moved, job["id"], JobState.PENDING)
        expect(page.locator("#job-state")).to_have_attribute("data-state", "PENDING", timeout=WAIT_MS)
        assert page.evaluate("portalLive('events')") is False
        page.wait_for_timeout(3500)
        assert len(seen) >= 2  # every 3 s


def test_the_log_grows_as_the_job_prints(
    live_server, celery_worker, client_for, member, local_partition, grant
):
    api = client_for(member)
    script = "#!/bin/bash\necho first\nsleep 4\necho second\nsleep 4\necho third\nsleep 60\n"
    job = outside_the_browser(submit, api, name="printer", script=script)
    with browser_page() as page:
        log_in(page, live_server.url, "member")
        page.goto(f"{live_server.url}/t/protein-lab/jobs/{job['id']}/")
        with beat(local_partition.cluster_id):
            expect(page.locator("pre.log")).to_contain_text("first", timeout=WAIT_MS)
            page.wait_for_function("portalLive('log')", timeout=WAIT_MS)
            expect(page.locator("pre.log")).to_contain_text("third", timeout=WAIT_MS)
            text = page.locator("pre.log").text_content()
            assert text.split() == ["first", "second", "third"]  # appended once each, in order
            screenshot(page, "job-log-streamed")
            outside_the_browser(api.post, f"/api/v1/jobs/{job['id']}/cancel/")
