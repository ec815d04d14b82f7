"""A job's cost where people read it: every job answer of the API (a page's and one job's agree),
the job page (so far while it runs), and the submit form's preview (at most, at today's price),
in headless Chromium."""

import os
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing.models import Price, TierMultiplier
from jobs.models import JobState
from tests.browser import browser_page, log_in, screenshot
from tests.factories import JobFactory


@pytest.fixture
def priced(catalog):
    since = timezone.now() - timedelta(days=10)
    TierMultiplier.objects.create(tier="high", multiplier=Decimal("1.2"), effective_from=since)
    return Price.objects.create(gpu_model=catalog[1], per_gpu_hour=Decimal("18.3333"), effective_from=since)


@pytest.mark.django_db
def test_every_job_answer_has_its_cost_and_a_page_agrees_with_each_job(client_for, owner, make_job, priced):
    start = timezone.now() - timedelta(hours=3)
    done = make_job(
        owner, state=JobState.COMPLETED, gpus=2, started_at=start, finished_at=start + timedelta(hours=1),
        gpu_hours=Decimal("2.0000"), tier="high",
    )  # fmt: skip
    running = make_job(
        owner, state=JobState.RUNNING, gpus=1, started_at=start, reserved_gpu_hours=Decimal("10")
    )
    waiting = make_job(owner)
    client = client_for(owner)
    page = {row["id"]: row for row in client.get("/api/v1/jobs/").json()["results"]}
    # 2 GPU-hours × 18.3333 × 1.2 = 43.99992 → 44.00; the running one 3 h so far × 18.3333 ≈ 55.00
    assert (page[str(done.pk)]["cost"], page[str(done.pk)]["currency"], page[str(done.pk)]["tier"]) == (
        "44.00", "CNY", "high",
    )  # fmt: skip
    assert Decimal(page[str(running.pk)]["cost"]) == pytest.approx(Decimal("55.00"), abs=Decimal("0.02"))
    assert page[str(waiting.pk)]["cost"] == "0.00"
    for job in (done, waiting):
        assert client.get(f"/api/v1/jobs/{job.pk}/").json()["cost"] == page[str(job.pk)]["cost"]


@pytest.mark.django_db(transaction=True)
def test_the_job_page_and_the_preview_show_what_it_costs(live_server, member, grant, local_partition, priced):
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    start = timezone.now() - timedelta(hours=2)
    job = JobFactory(
        grant=grant, partition=local_partition, submitted_by=member, state=JobState.COMPLETED, gpus=1,
        started_at=start, finished_at=start + timedelta(hours=1), gpu_hours=Decimal("1.0000"),
    )  # fmt: skip
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}/t/protein-lab/jobs/{job.pk}/")
        expect(page.locator("#job-cost")).to_have_text("CN¥18.33")
        page.goto(f"{base}/t/protein-lab/jobs/new/")
        page.get_by_label("Name", exact=True).fill("priced")
        page.get_by_label("GPU model").select_option("h100-80gb")
        page.get_by_label("GPUs", exact=True).fill("2")
        page.get_by_label("Walltime (minutes)").fill("30")
        page.get_by_label("Batch script").fill("#!/bin/bash\necho hi\n")
        # 2 GPUs × 0.5 h = 1 GPU-hour reserved, at 18.3333 (the tenant's tier, normal: 1×)
        expect(page.locator("#preview-cost")).to_have_text("at most CN¥18.33, at today's prices")
        screenshot(page, "job-new-cost")
