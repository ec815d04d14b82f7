"""jobs_sample_gpus: each RUNNING job's GPUs read once a round and kept (JobGpuSample) for its
charts and GET /jobs/{id}/gpu-samples/; a cluster that cannot be read is reported and the others
still read; old readings pruned. The local cluster runs a real job and reads nvidia-smi replaying
the real H200 captures (tests/nvidia_smi_replay.sh; NVML cannot start on this GPU-less machine).
Through a real Prometheus's query API: tests/monitoring/test_prometheus_stack.py."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from clusters.backends.base import GpuSample
from clusters.gpu_metrics import GpuMetricsError
from clusters.models import Cluster
from clusters.services import backend_of
from jobs.models import Job, JobGpuSample, JobState
from jobs.selectors import GPU_SAMPLES_SHOWN, gpu_efficiency_of, gpu_samples_of
from jobs.services import cluster_gpu_samples, jobs_sample_gpus
from jobs.services.telemetry import sample_row
from jobs.tasks import sample_gpus
from tests.conftest import ROOT
from tests.factories import JobFactory
from tests.http_support import Answer, Request, loopback_server
from tests.local_support import job_spec

REPLAY = ROOT / "tests" / "nvidia_smi_replay.sh"


@pytest.fixture
def local_cluster(settings, tmp_path, local_partition):
    """The local cluster's state in the test's directory, its nvidia-smi the H200 replay."""
    settings.VAR_DIR = tmp_path
    settings.LOCAL_NVIDIA_SMI = str(REPLAY)
    settings.GPU_SAMPLE_KEEP_DAYS = 30
    return local_partition.cluster


@pytest.fixture
def running_local_job(local_cluster, local_partition, grant, member):
    """A real job running on the local cluster (a sleep), known to the portal as RUNNING."""
    backend = backend_of(local_cluster)
    backend_id = backend.submit(job_spec("tok-telemetry", "sleep 60\n"))
    deadline = timezone.now() + timedelta(seconds=20)
    while backend.poll([backend_id])[backend_id].state != "RUNNING":
        assert timezone.now() < deadline, "the local job did not start"
    now = timezone.now()
    job = JobFactory(
        grant=grant, partition=local_partition, submitted_by=member, name="train", gpus=1,
        walltime_minutes=60, reserved_gpu_hours=Decimal(1), holds_gpus=True, state=JobState.RUNNING,
        backend_id=backend_id, submitted_at=now, started_at=now,
    )  # fmt: skip
    yield job
    backend.cancel(backend_id)


def test_a_round_keeps_every_figure_of_a_running_local_jobs_gpu(running_local_job, monkeypatch):
    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "busy")
    report = sample_gpus()  # the beat task, called in this process
    assert report["sampled"] == [running_local_job.pk] and report["errors"] == {}
    [row] = JobGpuSample.objects.filter(job=running_local_job)
    assert (row.gpus, row.utilization_pct, row.utilization_min_pct, row.utilization_max_pct) == (
        1,
        100,
        100,
        100,
    )
    assert (row.memory_used_mib, row.memory_total_mib, row.memory_used_pct) == (1011, 143771, 0.7)
    assert (row.temperature_c, row.power_w, row.xid) == (65, 692.1, None)  # nvidia-smi has no XID

    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "idle")
    jobs_sample_gpus(now=timezone.now() + timedelta(minutes=1))
    assert [s.utilization_pct for s in gpu_samples_of(running_local_job)] == [100, 0]
    assert gpu_efficiency_of([running_local_job])[running_local_job.pk]["mean_pct"] == 50


def test_a_job_the_source_does_not_report_gets_no_row(running_local_job, monkeypatch):
    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "nodriver")  # nvidia-smi fails: nothing known
    report = jobs_sample_gpus()
    assert report.unread == [running_local_job.pk] and report.sampled == []
    assert not JobGpuSample.objects.exists()


def test_a_cluster_that_cannot_be_read_is_reported_and_the_others_still_read(
    running_local_job, testbed, member, grant, monkeypatch
):
    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "busy")
    testbed.prometheus_url = "http://127.0.0.1:9/"  # nothing listens on the discard port
    testbed.save()
    partition = testbed.partitions.first()
    JobFactory(
        grant=grant, partition=partition, submitted_by=member, gpus=1, state=JobState.RUNNING,
        backend_id="4242", started_at=timezone.now(),
    )  # fmt: skip
    report = jobs_sample_gpus()
    assert list(report.errors) == ["testbed"] and "127.0.0.1:9" in report.errors["testbed"]
    assert report.sampled == [running_local_job.pk]


def test_readings_older_than_the_kept_days_are_pruned(running_local_job, settings, monkeypatch):
    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "busy")
    now = timezone.now()
    old = JobGpuSample.objects.create(
        job=running_local_job, at=now - timedelta(days=31), gpus=1, utilization_pct=5,
        utilization_min_pct=5, utilization_max_pct=5,
    )  # fmt: skip
    kept = JobGpuSample.objects.create(
        job=running_local_job, at=now - timedelta(days=29), gpus=1, utilization_pct=5,
        utilization_min_pct=5, utilization_max_pct=5,
    )  # fmt: skip
    report = jobs_sample_gpus(now=now)
    assert report.pruned == 1
    assert set(JobGpuSample.objects.values_list("pk", flat=True)) - {kept.pk} != set()
    assert not JobGpuSample.objects.filter(pk=old.pk).exists()


def test_a_long_jobs_readings_are_merged_for_its_charts_keeping_every_peak(make_job, member):
    job = make_job(member, state=JobState.RUNNING)
    start = timezone.now() - timedelta(days=2)
    JobGpuSample.objects.bulk_create(
        JobGpuSample(
            job=job, at=start + timedelta(minutes=i), gpus=1, utilization_pct=50,
            utilization_min_pct=5 if i == 777 else 40, utilization_max_pct=60, memory_used_mib=1000,
            memory_total_mib=4000, temperature_c=91 if i == 1234 else 60, power_w=500,
            xid=79 if i == 1501 else 0,
        )
        for i in range(2000)
    )  # fmt: skip
    shown = gpu_samples_of(job)
    assert len(shown) <= GPU_SAMPLES_SHOWN
    assert shown[-1].at == start + timedelta(minutes=1999)  # the latest reading's time
    assert [s.at for s in shown] == sorted(s.at for s in shown)
    # A spike in one minute of 2000 survives the merge: the XID, the heat, the idle GPU.
    assert max(s.xid for s in shown) == 79
    assert max(s.temperature_c for s in shown) == 91
    assert min(s.utilization_min_pct for s in shown) == 5
    assert {s.utilization_pct for s in shown} == {50} and {s.memory_used_pct for s in shown} == {25}


def test_fewer_gpus_read_than_the_job_holds_leave_memory_and_power_unknown(make_job, member):
    job = make_job(member, state=JobState.RUNNING, gpus=2)
    sample = GpuSample("77", 1, 90.0, 90.0, 90.0, 1000.0, 143771.0, temperature_c=70.0, power_w=500.0, xid=0)
    row = sample_row(job, sample, at=timezone.now())
    assert (row.gpus, row.utilization_pct, row.temperature_c) == (1, 90.0, 70.0)
    assert (row.memory_used_mib, row.memory_total_mib, row.power_w) == (None, None, None)


def test_a_local_job_that_the_clusters_prometheus_does_not_map_is_read_from_the_backend(
    running_local_job, local_cluster, monkeypatch
):
    """The host's exporter has no job mapping for local jobs: Prometheus answers, but nothing of
    this job; the local cluster's own reading (nvidia-smi here) is the job's."""
    empty = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
    asked = []

    def prometheus(request: Request) -> Answer:
        asked.append(request.query.get("query", ""))
        return 200, "application/json", empty

    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "busy")
    with loopback_server(prometheus) as address:
        local_cluster.prometheus_url = f"http://{address}"
        local_cluster.save()
        report = jobs_sample_gpus()
    assert report.sampled == [running_local_job.pk]
    assert 'cluster="local"' in asked[0]
    assert JobGpuSample.objects.get(job=running_local_job).temperature_c == 65


def test_a_round_out_of_time_reports_the_clusters_it_did_not_reach(running_local_job):
    report = jobs_sample_gpus(budget_s=0)
    assert report.errors == {"local": "not reached in this round's time; read next round"}
    assert not JobGpuSample.objects.exists()


def test_a_telemetry_url_with_credentials_is_refused_and_never_shown(local_cluster):
    for field in ("prometheus_url", "metrics_url"):
        setattr(local_cluster, field, "http://scraper:s3cret@prometheus.example:9090/")
        with pytest.raises(ValidationError) as refused:
            local_cluster.full_clean()
        assert field in refused.value.message_dict and "s3cret" not in str(refused.value)
        setattr(local_cluster, field, "")
    # Saved around the check (an old row, a raw update): the round reports it without the secret.
    Cluster.objects.filter(pk=local_cluster.pk).update(prometheus_url="http://scraper:s3cret@127.0.0.1/")
    local_cluster.refresh_from_db()
    with pytest.raises(GpuMetricsError) as failed:
        cluster_gpu_samples(cluster=local_cluster, backend_ids=["local-1"])
    assert "s3cret" not in str(failed.value) and "127.0.0.1" in str(failed.value)


# --- GET /jobs/{id}/gpu-samples/


def readings(job: Job, count: int) -> None:
    start = timezone.now() - timedelta(minutes=count)
    JobGpuSample.objects.bulk_create(
        JobGpuSample(
            job=job,
            at=start + timedelta(minutes=i),
            gpus=2,
            utilization_pct=80 + i,
            utilization_min_pct=70,
            utilization_max_pct=90 + i,
            memory_used_mib=1000,
            memory_total_mib=4000,
            temperature_c=60 + i,
            power_w=600.5,
            xid=0,
        )
        for i in range(count)
    )


def test_the_api_answers_a_jobs_readings_oldest_first(client_for, make_job, member, viewer):
    job = make_job(member, state=JobState.RUNNING)
    readings(job, 3)
    answer = client_for(viewer).get(f"/api/v1/jobs/{job.pk}/gpu-samples/")
    assert answer.status_code == 200
    body = answer.json()
    assert [row["utilization_pct"] for row in body] == [80, 81, 82]
    assert body[0] == {
        "at": body[0]["at"], "gpus": 2, "utilization_pct": 80.0, "utilization_min_pct": 70.0,
        "utilization_max_pct": 90.0, "memory_used_mib": 1000.0, "memory_total_mib": 4000.0,
        "memory_used_pct": 25.0, "temperature_c": 60.0, "power_w": 600.5, "xid": 0,
    }  # fmt: skip


def test_another_tenants_job_readings_answer_404(client_for, make_job, member, outsider):
    job = make_job(member, state=JobState.RUNNING)
    readings(job, 1)
    answer = client_for(outsider).get(f"/api/v1/jobs/{job.pk}/gpu-samples/")
    assert answer.status_code == 404
    assert "utilization" not in answer.content.decode()


def test_a_job_not_read_yet_answers_an_empty_list(client_for, make_job, member):
    job = make_job(member, state=JobState.QUEUED)
    assert client_for(member).get(f"/api/v1/jobs/{job.pk}/gpu-samples/").json() == []
