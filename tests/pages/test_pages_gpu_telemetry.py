"""A job's GPU telemetry and its alerts on the pages, in real headless Chromium against a live
server: the job page draws its GPU charts (Chart.js) from the readings of the real H200 run
(tests/fixtures/h200-run/, docs/monitoring-h200.md) and lists the alerts about it; the tenant's
dashboard shows the running job's GPU efficiency and the firing alert, which another tenant's
dashboard does not. Screenshots: artifacts/job-gpu-charts.png, artifacts/dashboard-alert.png."""

import json
from datetime import timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from playwright.sync_api import expect

from jobs.models import JobGpuSample, JobState
from monitoring.services import IncomingAlert, alerts_receive
from tests.browser import browser_page, log_in, screenshot
from tests.conftest import ROOT
from tests.factories import JobFactory

RUN = ROOT / "tests" / "fixtures" / "h200-run" / "h200-run.json"


def h200_readings(job) -> list[JobGpuSample]:
    """The training job's readings as the portal kept them on the H200, moved to end now."""
    rows = json.loads(RUN.read_text())["portal"]["train"]["gpu_samples"]
    shift = timezone.now() - parse_datetime(rows[-1]["at"])
    fields = {f.name for f in JobGpuSample._meta.get_fields()} - {"id", "job", "at"}
    return JobGpuSample.objects.bulk_create(
        JobGpuSample(job=job, at=parse_datetime(row["at"]) + shift, **{k: row[k] for k in fields})
        for row in rows
    )


def firing(job, **labels) -> None:
    """Alertmanager's message for a hot GPU of the job, through the receiver's service."""
    alerts_receive([
        IncomingAlert(
            fingerprint="f3a1c0de", status="firing",
            labels={"alertname": "GpuTemperatureHigh", "severity": "critical", "scope": "job",
                    "cluster": job.cluster.slug, "hpc_job": job.backend_id, "gpu": "0",
                    "Hostname": "gpu-node-07", **labels},
            annotations={"summary": "GPU 0 on gpu-node-07 at 86 °C",
                         "runbook": "The GPU throttles and may fail: admins check the node's cooling."},
            starts_at=timezone.now() - timedelta(minutes=3), ends_at=None,
        )
    ])  # fmt: skip


def test_the_job_page_charts_the_h200_run_and_the_dashboard_shows_efficiency_and_the_alert(
    live_server, member, outsider, other_tenant, grant, local_partition
):
    now = timezone.now()
    job = JobFactory(
        grant=grant, partition=local_partition, submitted_by=member, name="train-lm", gpus=1,
        state=JobState.RUNNING, backend_id="local-7", started_at=now - timedelta(minutes=4),
        reserved_gpu_hours=1,
    )  # fmt: skip
    readings = h200_readings(job)
    assert len(readings) >= 5
    mean = sum(r.utilization_pct for r in readings) / len(readings)
    firing(job)
    base = live_server.url

    with browser_page() as page:
        log_in(page, base, "member")
        efficiency = page.locator("#gpu-efficiency")
        row = efficiency.locator(f'tr[data-job="{job.pk}"]')
        expect(row).to_contain_text("train-lm")
        expect(row.get_by_role("meter")).to_have_attribute("value", f"{mean:.0f}")
        alerts = page.locator("#alerts")
        expect(alerts.get_by_role("heading")).to_have_text("Firing alerts")
        expect(alerts.locator('[data-alert="GpuTemperatureHigh"]')).to_contain_text(
            "GPU 0 on gpu-node-07 at 86 °C"
        )
        expect(alerts.get_by_role("link", name=f"job #{job.pk}")).to_be_visible()
        screenshot(page, "dashboard-alert")

        alerts.get_by_role("link", name=f"job #{job.pk}").click()
        page.wait_for_url(f"{base}/t/protein-lab/jobs/{job.pk}/")
        for chart in ("utilization", "memory", "temperature", "power"):
            expect(page.locator(f"canvas#gpu-{chart}-chart[data-drawn]")).to_be_visible()  # Chart.js drew it
        expect(page.locator("#gpus #gpu-efficiency")).to_contain_text(f"GPU efficiency: {mean:.0f}%")
        expect(page.locator("#alerts").get_by_role("heading")).to_have_text("Alerts about this job")
        expect(page.locator('#alerts [data-alert="GpuTemperatureHigh"]')).to_contain_text("Firing")
        page.get_by_text("Latest readings as a table").click()
        latest = readings[-1]
        first_row = page.locator("#gpu-readings tbody tr").first
        expect(first_row).to_contain_text(f"{latest.utilization_pct:.0f}")
        expect(first_row).to_contain_text(f"{latest.temperature_c:g}")
        screenshot(page, "job-gpu-charts")

    with browser_page() as page:
        log_in(page, base, "outsider", lands_on=f"/t/{other_tenant.slug}/")
        expect(page.locator("#alerts")).to_contain_text("No alert is firing for your team.")
        expect(page.locator("#gpu-efficiency")).to_have_count(0)
        page.goto(f"{base}/t/protein-lab/jobs/{job.pk}/")
        expect(page.locator("body")).not_to_contain_text("train-lm")  # another tenant's job: 404
