"""The monitoring chain with the real services, as deploy/prometheus/ ships it: Debian's Prometheus
scrapes the live portal's /metrics (with its bearer token) and a DCGM exporter on the GPU of a job
that runs on the Slurm testbed, evaluates the shipped rules, and Alertmanager posts what fires to
the portal's receiver (with its own token). The portal keeps each alert on the job's tenant and
mails the tenant's owner when it fires and when it is resolved.

Shortened for a test, and only timings (tests/prometheus_support.py): scrapes, rule evaluation and
Alertmanager's grouping every second, and the rules' `for:` in seconds instead of minutes
(GpuTemperatureHigh's 2m is 2s here); `promtool test rules` proves the real durations
(test_alert_rules.py)."""

import dataclasses
from datetime import timedelta

import pytest
from django.core import mail

from clusters.gpu_metrics import GpuMetricsError, query_prometheus
from jobs.models import Job, JobGpuSample, JobState
from jobs.services import jobs_poll, jobs_sample_gpus
from jobs.services.dispatch import jobs_dispatch
from monitoring.models import Alert, AlertScope, AlertStatus, Delivery, DeliveryKind, DeliveryStatus
from monitoring.tasks import deliver_alerts
from tenants.models import Role
from tests.conftest import join
from tests.monitoring_support import TOKEN
from tests.prometheus_support import (
    alertmanager_server,
    dcgm_exporter,
    gpu_of_the_h200_run,
    gpus_from_nvidia_smi,
    prometheus_server,
)
from tests.slurm_support import slurm_tenant
from tests.wait_support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HOOK_TOKEN = "alertmanager-token-for-tests"
SLEEP = "#!/bin/bash\nsleep 300\n"  # RUNNING for the whole test; cancelled at its end
OWNER_MAIL = "owner@lab.example"
ALERT_TIMEOUT_S = 30
FIRED = ("GpuXidError", "GpuTemperatureHigh")


@pytest.fixture
def running_job(testbed):
    """A job RUNNING on the testbed, of a tenant of its own (Slurm accounts outlive the test
    database) whose owner has a mail address; cancelled, and its account dropped, at the end."""
    bed = slurm_tenant(testbed)
    try:
        owner = join(bed.tenant, f"{bed.tenant.slug}-owner", Role.OWNER)
        owner.email = OWNER_MAIL
        owner.save()
        bed.request = dataclasses.replace(bed.request, script=SLEEP, walltime_minutes=10)
        [job_id] = bed.submit()
        assert jobs_dispatch(job_id=job_id) == 1

        def running() -> Job | None:
            jobs_poll(cluster_id=testbed.pk)  # as beat's poll would
            return (
                Job.objects.filter(pk=job_id, state=JobState.RUNNING)
                .select_related("tenant", "cluster")
                .first()
            )

        yield wait_until(running, timeout_s=60, interval_s=0.5, what="the job RUNNING on the testbed")
    finally:
        bed.cleanup()


def deliver_pending(job: Job) -> list[Delivery]:
    """What the receiver queued for the job's tenant, sent as the worker's task would (no worker
    runs here, so that the mail lands in this process's outbox)."""
    pending = list(Delivery.objects.filter(tenant=job.tenant, status=DeliveryStatus.PENDING))
    for delivery in pending:
        assert deliver_alerts.apply(kwargs={"delivery_id": delivery.pk}).get() is True
        delivery.refresh_from_db()
    return pending


def alert_in_portal(status: str, **where) -> Alert:
    """The alert the receiver keeps, once Alertmanager has posted it."""
    return wait_until(
        lambda: Alert.objects.filter(status=status, **where).first(),
        timeout_s=ALERT_TIMEOUT_S, what=f"alert {where} {status} in the portal",
    )  # fmt: skip


def owner_subjects() -> list[str]:
    return sorted(message.subject for message in mail.outbox if OWNER_MAIL in message.to)


def test_the_shipped_rules_fire_on_a_running_jobs_gpu_and_the_owner_hears_of_it_and_of_the_end(
    live_server, settings, running_job, tmp_path
):
    settings.METRICS_TOKEN = TOKEN
    settings.ALERTMANAGER_TOKEN = HOOK_TOKEN
    job, cluster = running_job, running_job.cluster.slug
    portal = f"127.0.0.1:{live_server.thread.port}"
    [gpu] = gpus_from_nvidia_smi()  # the H200 capture: 1011 of 143771 MiB, 100 %, 65 °C, 692.1 W
    node = job.node_list.split(",")[0]
    assert node, job.node_list
    gpu.labels = {"Hostname": node, "hpc_job": job.backend_id}
    normal = {"temp_c": gpu.temp_c, "xid": 0}
    # The node's other GPU as the real H200 run left it while training: 93 % of its memory used.
    # Its job is none the portal knows (the exporter maps no job to it), so its alert is the platform's.
    full = gpu_of_the_h200_run(index=1)
    full.labels = {"Hostname": node}
    with (
        dcgm_exporter([gpu, full]) as exporter,
        alertmanager_server(tmp_path / "alertmanager", portal_url=f"http://{portal}", token=HOOK_TOKEN) as am,
        prometheus_server(
            tmp_path / "prometheus", dcgm=exporter.address, cluster=cluster, portal=portal, metrics_token=TOKEN,
            alertmanager=am.url.removeprefix("http://"),
        ) as prom,
    ):  # fmt: skip
        # Both targets answer: the portal's /metrics took the bearer token from credentials_file.
        assert prom.wait_value('up{job="portal"}', lambda up: up == 1) == 1
        assert prom.wait_value(f'up{{job="dcgm-{cluster}"}}', lambda up: up == 1) == 1
        # The portal's own series, as Prometheus keeps them.
        served = 'portal_http_request_duration_seconds_count{job="portal",route="metrics",method="GET",status="200"}'
        assert prom.wait_value(served, lambda count: count >= 1) >= 1
        assert prom.value(f'portal_jobs{{job="portal",cluster="{cluster}",state="RUNNING"}}') >= 1
        # The job's GPU telemetry, found by its Slurm id and cluster as the portal reads it.
        of_job = f'cluster="{cluster}",hpc_job="{job.backend_id}"'
        assert prom.value(f"DCGM_FI_DEV_GPU_TEMP{{{of_job}}}") == 65
        assert prom.value(f"DCGM_FI_DEV_POWER_USAGE{{{of_job}}}") == 692.1
        assert prom.value(f"DCGM_FI_DEV_GPU_UTIL{{{of_job}}}") == 100
        assert prom.value(f'DCGM_FI_DEV_FB_FREE{{{of_job},UUID="{gpu.uuid}"}}') == 143771 - 1011
        used = prom.wait_value(f"portal:gpu_memory_used:percent{{{of_job}}}", lambda pct: pct > 0)
        assert used == pytest.approx(100 * 1011 / 143771)
        assert not Alert.objects.filter(tenant=job.tenant).exists()

        # The portal reads the same series through the query API (PromQL), as its beat task does.
        testbed = job.cluster
        testbed.prometheus_url = prom.url
        testbed.save(update_fields=["prometheus_url"])
        assert jobs_sample_gpus().sampled == [job.pk]
        [reading] = JobGpuSample.objects.filter(job=job)
        assert (reading.gpus, reading.utilization_pct, reading.temperature_c, reading.power_w, reading.xid) == (
            1, 100, 65, 692.1, 0,
        )  # fmt: skip
        assert (reading.memory_used_mib, reading.memory_total_mib) == (1011, 143771)
        with pytest.raises(GpuMetricsError, match="refused the query: bad_data"):
            query_prometheus(prom.url, "sum(")

        # The real run's memory crosses the 90 % warning (GpuMemoryHigh; its `for:` in seconds here).
        pct = 100 * full.memory_used_mib / full.memory_total_mib
        assert 90 <= pct < 95, pct
        memory = alert_in_portal(AlertStatus.FIRING, name="GpuMemoryHigh")
        assert (memory.scope, memory.tenant, memory.job, memory.severity) == (
            AlertScope.PLATFORM,
            None,
            None,
            "warning",
        )
        assert memory.summary == f"GPU 1 on {node}: memory {pct:.0f}% used"
        assert memory.labels["UUID"] == full.uuid

        exporter.update(temp_c=86, xid=79)
        firing = {name: alert_in_portal(AlertStatus.FIRING, name=name) for name in FIRED}
        in_prometheus = {(a["labels"]["alertname"], a["state"]) for a in prom.alerts()}
        assert {(name, "firing") for name in FIRED} <= in_prometheus
        for name, alert in firing.items():
            assert (alert.scope, alert.tenant, alert.job, alert.cluster) == (
                AlertScope.JOB, job.tenant, job, job.cluster,
            ), name  # fmt: skip
            assert alert.severity == "critical" and alert.ends_at is None and alert.runbook
            assert {key: alert.labels.get(key) for key in ("cluster", "hpc_job", "Hostname", "UUID", "modelName")} == {
                "cluster": cluster, "hpc_job": job.backend_id, "Hostname": node, "UUID": gpu.uuid,
                "modelName": "NVIDIA H200",
            }  # fmt: skip
        assert firing["GpuXidError"].summary == f"GPU 0 on {node} reported XID 79"
        assert firing["GpuTemperatureHigh"].summary == f"GPU 0 on {node} at 86 °C"
        # The job's next reading carries the XID and the heat too.
        later = jobs_sample_gpus(now=reading.at + timedelta(minutes=1))
        assert later.sampled == [job.pk]
        latest = JobGpuSample.objects.filter(job=job).latest("at")
        assert (latest.temperature_c, latest.xid) == (86, 79)

        sent = deliver_pending(job)
        assert {(d.kind, d.event, d.status) for d in sent} == {
            (DeliveryKind.MAIL, "firing", DeliveryStatus.SENT)
        }
        slug = job.tenant.slug
        assert owner_subjects() == sorted(f"[FIRING:1] {name} ({slug})" for name in FIRED)
        mail.outbox.clear()

        exporter.update(**normal)
        resolved = {
            name: alert_in_portal(AlertStatus.RESOLVED, pk=alert.pk) for name, alert in firing.items()
        }
        for name, alert in resolved.items():
            assert alert.ends_at is not None and alert.ends_at >= alert.starts_at, name
        sent = deliver_pending(job)
        assert {(d.event, d.status) for d in sent} == {("resolved", DeliveryStatus.SENT)}
        assert owner_subjects() == sorted(f"[RESOLVED:1] {name} ({slug})" for name in FIRED)
        # One row per firing: the repeats Alertmanager may send counted on it, no other alert.
        assert set(Alert.objects.filter(tenant=job.tenant).values_list("name", flat=True)) == set(FIRED)
        assert Alert.objects.filter(tenant=job.tenant).count() == len(FIRED)
