"""jobs_watch_idle: idle stretches of RUNNING jobs' GPUs, the flag by mail, the cancel after a
second window. Utilization comes from a real DCGM-exporter text served on loopback by the test,
and, for the local backend, from nvidia-smi replaying the real output of an H200."""

import json
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.core import mail
from django.utils import timezone

from clusters.backends.base import BackendUnavailable, ClusterConfig, GpuSample, JobSpec
from clusters.backends.local import LocalBackend
from clusters.backends.local.gpus import read_gpus
from clusters.gpu_metrics import GpuMetricsError, fetch_metrics
from clusters.services import backend_of
from jobs.models import Job, JobEvent, JobState
from jobs.services import jobs_watch_idle
from jobs.tasks import watch_idle_gpus
from portal.core.models import AuditEvent
from tests.conftest import ROOT
from tests.factories import JobFactory
from tests.http_support import Answer, Request, loopback_server

# Stands in for nvidia-smi on this GPU-less machine: it prints the real captures of an H200
# (tests/fixtures/nvidia-smi/h200) for the exact arguments the local backend runs;
# NVIDIA_SMI_REPLAY=idle|busy picks the capture, hang and nodriver the failures.
REPLAY = ROOT / "tests" / "nvidia_smi_replay.sh"
WINDOW = timedelta(minutes=120)


class Exporter:
    """What the loopback exporter answers; the test changes it between sweeps."""

    url = ""
    body = ""
    status = 200
    requests = 0


@pytest.fixture
def exporter():
    state = Exporter()

    def answer(request: Request) -> Answer:
        state.requests += 1
        return state.status, "text/plain; version=0.0.4; charset=utf-8", state.body.encode()

    with loopback_server(answer) as address:
        state.url = f"http://{address}/metrics"
        yield state


def exposition(jobs: dict[str, list[float]]) -> str:
    """dcgm-exporter's text for one 8-GPU node whose exporter maps Slurm jobs (hpc_job), with a
    GPU of no job and a metric of another kind beside, as a real scrape has."""
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    gpu = 0
    for job_id, values in jobs.items():
        for value in values:
            labels = (
                f'gpu="{gpu}",UUID="GPU-{gpu}5bdf912-4cc4-0a16-d75d-86bb37ecacb3",pci_bus_id="00000000:{gpu + 16:02X}:00.0",'
                f'device="nvidia{gpu}",modelName="NVIDIA H200",Hostname="gpu-node-07",'
                f'DCGM_FI_DRIVER_VERSION="580.159.04",hpc_job="{job_id}"'
            )
            lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value:g}", f"DCGM_FI_DEV_FB_USED{{{labels}}} 1011"]
            gpu += 1
    lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-free",Hostname="gpu-node-07"}} 0')
    return "\n".join(lines) + "\n"


@pytest.fixture
def lifecycle(settings, tmp_path):
    """The idle settings at their defaults, and the local cluster's state in the test's own
    directory (its backend then knows none of these jobs and answers {})."""
    settings.VAR_DIR = tmp_path
    settings.CLEANUP_DRY_RUN = False
    settings.IDLE_GPU_CANCEL = False
    settings.IDLE_GPU_THRESHOLD_PCT = 5
    settings.IDLE_GPU_WINDOW_MINUTES = 120
    return settings


@pytest.fixture
def cluster(local_partition, exporter, lifecycle):
    cluster = local_partition.cluster
    cluster.metrics_url = exporter.url
    cluster.full_clean()
    cluster.save()
    return cluster


@pytest.fixture
def make_job(local_partition, grant, tenant, catalog):
    def make(user, backend_id: str, *, gpus: int = 2, **fields) -> Job:
        now = timezone.now()
        return JobFactory(
            grant=grant, partition=local_partition, submitted_by=user, name="train", gpus=gpus,
            walltime_minutes=600, reserved_gpu_hours=Decimal(20), holds_gpus=True, state=JobState.RUNNING,
            backend_id=backend_id, submitted_at=now - timedelta(hours=5), started_at=now - timedelta(hours=5),
            **fields,
        )  # fmt: skip

    return make


def ago(minutes: int):
    return timezone.now() - timedelta(minutes=minutes)


def idle_fields(job: Job) -> tuple:
    job.refresh_from_db()
    return job.gpu_idle_since, job.gpu_idle_flagged_at


# --- Through a DCGM exporter


def test_idle_for_a_window_flags_the_job_once_by_mail_and_audit(
    cluster, exporter, member, make_job, django_capture_on_commit_callbacks
):
    job = make_job(member, "4242")
    exporter.body = exposition({"4242": [0, 3], "4243": [99]})
    first = jobs_watch_idle()
    assert (first.idle, first.flagged, first.errors) == ([job.pk], [], {})
    since, flagged_at = idle_fields(job)
    assert since is not None and flagged_at is None
    jobs_watch_idle()
    assert idle_fields(job) == (since, None)  # the stretch goes on from its first idle sample

    Job.objects.filter(pk=job.pk).update(gpu_idle_since=ago(121))  # the window has passed
    with django_capture_on_commit_callbacks(execute=True):
        report = jobs_watch_idle()
    assert report.flagged == [job.pk]
    assert idle_fields(job)[1] is not None
    [message] = mail.outbox
    assert message.to == ["member@example.org"]
    assert message.subject == f"[GPU portal] protein-lab: the GPUs of job #{job.pk} (train) are idle"
    assert "holds 2 GPUs, and none of them has reached 5 % utilization since" in message.body
    assert "please cancel it" in message.body
    assert f"/t/protein-lab/jobs/{job.pk}/" in message.body
    audit = AuditEvent.objects.get(action="job.idle_flagged")
    assert (audit.target_id, audit.tenant_slug, audit.actor_id) == (str(job.pk), "protein-lab", None)
    assert audit.data["threshold_pct"] == 5 and audit.data["idle_minutes"] >= 121

    with django_capture_on_commit_callbacks(execute=True):
        again = jobs_watch_idle()
    assert again.flagged == [] and again.idle == [job.pk]
    assert len(mail.outbox) == 1 and AuditEvent.objects.filter(action="job.idle_flagged").count() == 1
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING  # no cancel without IDLE_GPU_CANCEL


def test_one_busy_gpu_keeps_the_job_from_being_idle(
    cluster, exporter, member, make_job, django_capture_on_commit_callbacks
):
    job = make_job(member, "4242")
    was_idle = make_job(member, "4243", gpu_idle_since=ago(300))
    exporter.body = exposition({"4242": [0, 87], "4243": [2, 5]})  # 5 % is not under 5 %
    with django_capture_on_commit_callbacks(execute=True):
        report = jobs_watch_idle()
    assert (sorted(report.busy), report.idle, report.flagged) == ([job.pk, was_idle.pk], [], [])
    assert idle_fields(job) == (None, None) and idle_fields(was_idle) == (None, None)
    assert mail.outbox == []


def test_a_busy_sample_ends_the_stretch_and_a_later_idle_one_starts_a_new_one(
    cluster, exporter, member, make_job
):
    job = make_job(member, "4242", gpu_idle_since=ago(200), gpu_idle_flagged_at=ago(80))
    exporter.body = exposition({"4242": [0, 40]})
    assert jobs_watch_idle().busy == [job.pk]
    assert idle_fields(job) == (None, None)
    exporter.body = exposition({"4242": [0, 1]})
    before = timezone.now()
    assert jobs_watch_idle().flagged == []
    since, flagged_at = idle_fields(job)
    assert since >= before and flagged_at is None


def test_a_job_without_a_sample_for_all_its_gpus_is_not_idle(cluster, exporter, member, make_job):
    gone = make_job(member, "4242", gpu_idle_since=ago(200))
    partial = make_job(member, "4243", gpus=4, gpu_idle_since=ago(200))
    exporter.body = exposition({"4243": [0, 0]})  # 2 of its 4 GPUs: the others may be busy
    report = jobs_watch_idle()
    assert sorted(report.unknown) == [gone.pk, partial.pk] and report.flagged == []
    assert idle_fields(gone) == (None, None) and idle_fields(partial) == (None, None)


def test_cancel_after_a_second_window_only_where_the_site_enables_it(
    cluster, exporter, member, make_job, lifecycle, django_capture_on_commit_callbacks
):
    due = make_job(member, "4242", gpu_idle_since=ago(245), gpu_idle_flagged_at=ago(121))
    recent = make_job(member, "4243", gpu_idle_since=ago(180), gpu_idle_flagged_at=ago(60))
    exporter.body = exposition({"4242": [0, 0], "4243": [1, 2]})
    assert jobs_watch_idle().cancelled == []
    assert Job.objects.get(pk=due.pk).state == JobState.RUNNING

    lifecycle.IDLE_GPU_CANCEL = True
    with django_capture_on_commit_callbacks() as enqueued:  # the cancel_job message, not sent here
        report = jobs_watch_idle()
    assert report.cancelled == [due.pk]
    due.refresh_from_db()
    assert (due.state, due.reason) == (JobState.CANCELLING, "idle_gpus")
    assert JobEvent.objects.filter(job=due, to_state=JobState.CANCELLING, reason="idle_gpus").exists()
    audit = AuditEvent.objects.get(action="job.cancel", target_id=str(due.pk))
    assert audit.data == {"state": "RUNNING", "reason": "idle_gpus"} and audit.actor_id is None
    assert len(enqueued) == 1
    assert Job.objects.get(pk=recent.pk).state == JobState.RUNNING  # flagged an hour ago: not yet


def test_the_flag_mail_announces_the_cancel_when_the_site_enables_it(
    cluster, exporter, member, make_job, lifecycle, django_capture_on_commit_callbacks
):
    lifecycle.IDLE_GPU_CANCEL = True
    job = make_job(member, "4242", gpu_idle_since=ago(130))
    exporter.body = exposition({"4242": [0, 0]})
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_watch_idle().flagged == [job.pk]
    assert "Unless its GPUs get busy again, the portal will cancel it at about" in mail.outbox[0].body
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING  # flagged now; cancelled a window later


def test_dry_run_reports_and_writes_nothing(
    cluster, exporter, member, make_job, lifecycle, django_capture_on_commit_callbacks
):
    lifecycle.CLEANUP_DRY_RUN = True
    lifecycle.IDLE_GPU_CANCEL = True
    new = make_job(member, "4242")
    due = make_job(member, "4243", gpu_idle_since=ago(130))
    old = make_job(member, "4244", gpu_idle_since=ago(300), gpu_idle_flagged_at=ago(150))
    busy = make_job(member, "4245", gpu_idle_since=ago(300))
    exporter.body = exposition({"4242": [0, 0], "4243": [0, 0], "4244": [0, 0], "4245": [50, 50]})
    rows = list(Job.objects.order_by("pk").values())
    events, audits = JobEvent.objects.count(), AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        report = jobs_watch_idle()
    assert report.dry_run
    assert (report.flagged, report.cancelled, report.busy) == ([due.pk], [old.pk], [busy.pk])
    assert sorted(report.idle) == [new.pk, due.pk, old.pk]
    assert list(Job.objects.order_by("pk").values()) == rows
    assert (JobEvent.objects.count(), AuditEvent.objects.count()) == (events, audits)
    assert callbacks == [] and mail.outbox == []


def test_an_unreadable_exporter_is_reported_and_the_stretch_left_alone(cluster, exporter, member, make_job):
    job = make_job(member, "4242", gpu_idle_since=ago(100))
    exporter.body = exposition({"4242": [0, 0]}) + 'DCGM_FI_DEV_GPU_UTIL{gpu="9" 0\n'
    report = jobs_watch_idle()
    assert "metrics line 8" in report.errors["local"] and report.idle == report.unknown == []
    assert idle_fields(job)[0] < ago(99)

    exporter.status, exporter.body = 503, "exporter restarting\n"
    result = watch_idle_gpus.apply()  # the beat task itself: it reports, it does not fail
    assert result.successful()
    assert "503" in result.get()["errors"]["local"]
    assert idle_fields(job)[0] < ago(99)


def test_fetch_metrics_bounds_the_answer(exporter):
    exporter.body = exposition({"4242": [0, 0]})
    assert fetch_metrics(exporter.url).startswith("# HELP DCGM_FI_DEV_GPU_UTIL")
    with pytest.raises(GpuMetricsError, match="more than 100 bytes"):
        fetch_metrics(exporter.url, max_bytes=100)


def test_a_cluster_url_other_than_http_is_refused(cluster):
    from django.core.exceptions import ValidationError

    cluster.metrics_url = "ftp://metrics.example.org/metrics"
    with pytest.raises(ValidationError, match="metrics_url"):
        cluster.full_clean()


def test_the_admin_edits_a_clusters_metrics_url(client, admin_user, cluster):
    client.force_login(admin_user)
    page = client.get(f"/admin/clusters/cluster/{cluster.pk}/change/")
    assert page.status_code == 200
    assert f'name="metrics_url" value="{cluster.metrics_url}"' in page.content.decode()


# --- The local backend through nvidia-smi


def spec(token: str) -> JobSpec:
    return JobSpec(
        token=token, name=token, account="protein-lab", qos="portal-normal", priority="normal",
        partition="local", gpu_type="local", k8s_resource="", k8s_product="", gpus_per_node=1, nodes=1,
        walltime_minutes=60, script="sleep 60\n", env={},
    )  # fmt: skip


def wait_running(backend: LocalBackend, *backend_ids: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        statuses = backend.poll(list(backend_ids))
        if all(statuses.get(bid) and statuses[bid].state == "RUNNING" for bid in backend_ids):
            return
        time.sleep(0.05)
    raise AssertionError(f"{backend_ids} did not start")


def cuda_visible_devices(state_dir: Path, token: str) -> str:
    return json.loads((state_dir / "jobs" / token / ".portal" / "env.json").read_text())[
        "CUDA_VISIBLE_DEVICES"
    ]


def test_local_backend_maps_each_jobs_gpu_indexes_to_nvidia_smi(tmp_path, monkeypatch):
    """nvidia-smi replays the real H200: one GPU, index 0, idle (0 %) or busy (100 %)."""
    config = ClusterConfig(
        slug="local", kind="local", local_gpus=2, state_dir=str(tmp_path), nvidia_smi=str(REPLAY)
    )
    backend = LocalBackend(config, grace_s=1)
    first, second = backend.submit(spec("tok-a")), backend.submit(spec("tok-b"))
    try:
        wait_running(backend, first, second)
        assert (cuda_visible_devices(tmp_path, "tok-a"), cuda_visible_devices(tmp_path, "tok-b")) == (
            "0",
            "1",
        )
        monkeypatch.setenv("NVIDIA_SMI_REPLAY", "busy")
        # GPU 1 is not on the captured machine: that job has no sample rather than a made-up one.
        assert backend.gpu_utilization([first, second, "local-99"]) == {
            first: GpuSample(
                first, 1, 100.0, 100.0, 100.0, 1011.0, 143771.0, temperature_c=65.0, power_w=692.1
            )
        }
        monkeypatch.setenv("NVIDIA_SMI_REPLAY", "idle")
        assert backend.gpu_utilization([first]) == {
            first: GpuSample(first, 1, 0.0, 0.0, 0.0, 0.0, 143771.0, temperature_c=40.0, power_w=126.52)
        }
        assert backend.gpu_utilization(["local-99"]) == {}

        monkeypatch.setenv("NVIDIA_SMI_REPLAY", "nodriver")
        assert backend.gpu_utilization([first]) == {}
        missing = LocalBackend(
            ClusterConfig(**{**config.__dict__, "nvidia_smi": str(tmp_path / "nvidia-smi")})
        )
        assert missing.gpu_utilization([first]) == {}  # a machine without nvidia-smi: nothing known
    finally:
        backend.cancel(first)
        backend.cancel(second)


def test_an_nvidia_smi_that_hangs_is_unavailable_not_idle(monkeypatch):
    monkeypatch.setenv("NVIDIA_SMI_REPLAY", "hang")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"did not answer within 0\.5 s"):
        read_gpus(str(REPLAY), timeout_s=0.5)
    assert time.monotonic() - started < 5


def test_the_sweep_follows_a_local_job_through_nvidia_smi(
    local_partition, member, make_job, lifecycle, tmp_path, monkeypatch
):
    lifecycle.LOCAL_NVIDIA_SMI = str(REPLAY)
    backend = backend_of(local_partition.cluster)  # its state under the test's VAR_DIR
    backend_id = backend.submit(spec("tok-sweep"))
    try:
        wait_running(backend, backend_id)
        job = make_job(member, backend_id, gpus=1)
        monkeypatch.setenv("NVIDIA_SMI_REPLAY", "idle")
        assert jobs_watch_idle().idle == [job.pk]
        assert idle_fields(job)[0] is not None
        monkeypatch.setenv("NVIDIA_SMI_REPLAY", "busy")
        assert jobs_watch_idle().busy == [job.pk]
        assert idle_fields(job) == (None, None)
    finally:
        backend.cancel(backend_id)
