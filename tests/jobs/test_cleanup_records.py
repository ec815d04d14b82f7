"""The cleanup of what jobs leave behind (scratch files, scheduler records, old timeline events),
the management command, and the beat schedule's tasks and their documentation."""

import io
import json
import os
import time
from datetime import timedelta
from importlib import import_module
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from clusters.backends.base import JobRef
from clusters.services import backend_of
from jobs.models import Job, JobEvent, JobState
from jobs.services import jobs_dispatch, retention_apply, scratch_purge
from portal.celery import app
from portal.core.models import AuditEvent
from tests.cleanup_support import end_grant, submit, wait_for
from tests.conftest import ROOT
from tests.factories import TenantFactory

pytestmark = pytest.mark.grant(gpus=8)  # the grant fixture's grant

DAY_S = 86_400


# --- 5. Scratch


def test_scratch_purge_deletes_old_files_refuses_links_out_and_audits(
    settings, tmp_path, tenant, cleanup_cluster
):
    settings.SCRATCH_PURGE_DAYS = 30
    scratch = Path(django_settings.VAR_DIR) / "local-cluster" / cleanup_cluster.slug / "scratch" / tenant.slug
    (scratch / "run-1").mkdir(parents=True, exist_ok=True)
    old, new, link = scratch / "run-1" / "old.ckpt", scratch / "new.ckpt", scratch / "outside"
    old.write_bytes(b"x" * 1000)
    new.write_bytes(b"y" * 10)
    secret = tmp_path / "secret"
    secret.write_text("not the tenant's")
    link.unlink(missing_ok=True)
    link.symlink_to(secret)
    aged = time.time() - 40 * DAY_S
    os.utime(old, (aged, aged))
    os.utime(link, (aged, aged), follow_symlinks=False)
    TenantFactory(slug="no-scratch-yet")

    dry = scratch_purge(dry_run=True)
    assert (dry.dry_run, dry.files_deleted, dry.bytes_freed, dry.refused) == (True, 1, 1000, 1)
    assert old.exists() and not AuditEvent.objects.filter(action="scratch.purge").exists()

    report = scratch_purge()
    assert (report.files_deleted, report.bytes_freed, report.refused) == (1, 1000, 1)
    assert not old.exists() and new.exists() and link.is_symlink() and secret.exists()
    audit = AuditEvent.objects.get(action="scratch.purge")
    assert (audit.actor_id, audit.tenant_slug, audit.target_id) == (None, tenant.slug, str(tenant.pk))
    assert audit.data["deleted"] == ["run-1/old.ckpt"] and list(audit.data["refused"]) == ["outside"]
    assert (audit.data["cluster"], audit.data["files_deleted"], audit.data["bytes_freed"]) == (
        cleanup_cluster.slug,
        1,
        1000,
    )

    again = scratch_purge()  # nothing old is left; the link out is refused again, and audited again
    assert (again.files_deleted, again.refused) == (0, 1)
    link.unlink()


def test_the_daily_purge_sends_one_task_per_cluster_and_tenant_and_each_purges(
    celery_worker, tenant, cleanup_cluster
):
    from clusters.models import Cluster
    from jobs.tasks import purge_scratch
    from tenants.models import Tenant

    scratch = Path(django_settings.VAR_DIR) / "local-cluster" / cleanup_cluster.slug / "scratch" / tenant.slug
    scratch.mkdir(parents=True, exist_ok=True)
    old = scratch / "old.ckpt"
    old.write_bytes(b"x" * 10)
    os.utime(old, (time.time() - 40 * DAY_S,) * 2)
    TenantFactory(slug="second-team")
    Cluster.objects.create(slug="k8s-none", name="K8s", kind="kubernetes", k8s_api_url="https://127.0.0.1:9")
    sent = purge_scratch.delay().get(timeout=30)
    assert sent == Cluster.objects.filter(enabled=True, kind="local").count() * Tenant.objects.count()
    deadline = time.monotonic() + 30
    while old.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not old.exists()
    assert AuditEvent.objects.get(action="scratch.purge", tenant_slug=tenant.slug).data["finished"] is True


# --- 6. Retention


def run_to_end(job: Job) -> Job:
    jobs_dispatch(job_id=job.pk, batch=1)
    wait_for([job], {JobState.COMPLETED})
    job.refresh_from_db()
    return job


def test_old_timelines_keep_their_first_and_last_event(
    settings, member, tenant, catalog, cleanup_cluster, grant
):
    settings.JOB_EVENT_RETENTION_DAYS = 365
    old = run_to_end(submit(member, tenant, catalog, script="#!/bin/bash\ntrue\n"))
    recent = run_to_end(submit(member, tenant, catalog, script="#!/bin/bash\ntrue\n"))
    running = submit(member, tenant, catalog, gpus=1)
    jobs_dispatch(job_id=running.pk, batch=1)
    wait_for([running], {JobState.RUNNING})
    long_ago = timezone.now() - timedelta(days=400)
    Job.objects.filter(pk=old.pk).update(finished_at=long_ago)
    JobEvent.objects.filter(job__in=[old, running]).update(at=long_ago)
    before = list(old.events.values_list("id", "to_state"))
    assert len(before) >= 4 and before[0][1] == "QUEUED" and before[-1][1] == "COMPLETED"
    recent_events = list(recent.events.values_list("id", flat=True))

    dry = retention_apply(dry_run=True)
    assert (dry.jobs_pruned, dry.events_deleted) == ([old.pk], len(before) - 2)
    assert (
        old.events.count() == len(before)
        and not AuditEvent.objects.filter(action="job_events.prune").exists()
    )

    report = retention_apply()
    assert (report.jobs_pruned, report.events_deleted) == ([old.pk], len(before) - 2)
    assert list(old.events.values_list("id", "to_state")) == [before[0], before[-1]]
    assert list(recent.events.values_list("id", flat=True)) == recent_events
    assert running.events.count() >= 4  # old events, but the job has not ended: its timeline stays whole
    audit = AuditEvent.objects.get(action="job_events.prune")
    assert (audit.tenant_slug, audit.data["job_ids"], audit.data["events_deleted"]) == (
        tenant.slug, [old.pk], len(before) - 2
    )  # fmt: skip
    assert retention_apply().events_deleted == 0  # twice: the first and last are never taken


def test_retention_deletes_the_scheduler_records_of_jobs_ended_long_enough_ago(
    settings, broken_cluster, member, tenant, catalog, cleanup_cluster, grant
):
    settings.JOB_LOG_RETENTION_DAYS = 0
    retention_apply()  # the records earlier runs of the suite left in this cluster's state directory
    settings.JOB_LOG_RETENTION_DAYS = 90
    job = run_to_end(submit(member, tenant, catalog, script="#!/bin/bash\necho kept\n"))
    backend = backend_of(cleanup_cluster)
    report = retention_apply()
    assert report.scheduler_objects[cleanup_cluster.slug] == [] and report.unreachable == ["cleanup-broken"]
    assert backend.find(job.token) == job.backend_id  # ended seconds ago: kept

    settings.JOB_LOG_RETENTION_DAYS = 0  # every ended job is old enough: no need to wait 90 days
    dry = retention_apply(dry_run=True)
    assert (
        job.backend_id in dry.scheduler_objects[cleanup_cluster.slug]
        and backend.find(job.token) == job.backend_id
    )
    report = retention_apply()
    assert job.backend_id in report.scheduler_objects[cleanup_cluster.slug]
    assert backend.find(job.token) is None
    ref = JobRef(backend_id=job.backend_id, token=job.token, account=tenant.slug)
    assert backend.log_tail(ref, lines=10, max_bytes=1000).lines == []
    audit = AuditEvent.objects.filter(action="scheduler.delete_finished").latest("pk")
    assert (audit.target_id, audit.actor_id) == (
        str(cleanup_cluster.pk),
        None,
    ) and job.backend_id in audit.data["ids"]


# --- The management command


def test_the_cleanup_command_runs_one_service_and_prints_its_report(
    member, tenant, catalog, cleanup_cluster, grant
):
    job = submit(member, tenant, catalog)
    end_grant(grant)
    out = io.StringIO()
    call_command("cleanup", "end-grants", "--dry-run", stdout=out)
    header, body = out.getvalue().split("\n", 1)
    assert header == "cleanup end_grants (dry run: nothing was changed)"
    report = json.loads(body)
    assert (report["dry_run"], report["cancelled"], report["grants_ended"]) == (
        True,
        [job.pk],
        [grant.pk],
    )
    job.refresh_from_db()
    assert job.state == JobState.QUEUED

    out = io.StringIO()
    call_command("cleanup", "end_grants", stdout=out)
    assert out.getvalue().startswith("cleanup end_grants (done)\n")
    assert json.loads(out.getvalue().split("\n", 1)[1])["cancelled"] == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.CANCELLED, "grant_ended")
    with pytest.raises(CommandError):
        call_command("cleanup", "delete-everything", stdout=io.StringIO())


def test_every_cleanup_command_name_runs_dry(db):
    for name in (
        "cap-walltime",
        "hold-suspended-tenants",
        "purge-scratch",
        "find-orphans",
        "apply-retention",
    ):
        out = io.StringIO()
        call_command("cleanup", name, "--dry-run", stdout=out)
        assert json.loads(out.getvalue().split("\n", 1)[1])["dry_run"] is True


# --- The beat schedule and its documentation


def test_every_beat_task_exists_and_is_registered():
    app.loader.import_default_modules()
    for entry in django_settings.CELERY_BEAT_SCHEDULE.values():
        module, name = entry["task"].rsplit(".", 1)
        task = getattr(import_module(module), name)
        assert task.name == entry["task"] and entry["task"] in app.tasks


def test_periodic_tasks_doc_lists_every_beat_entry():
    doc = (ROOT / "docs" / "periodic-tasks.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    for key, entry in django_settings.CELERY_BEAT_SCHEDULE.items():
        row = [line for line in rows if line.startswith(f"| `{key}`")]
        assert len(row) == 1, f"{key} is not in docs/periodic-tasks.md"
        assert f"`{entry['task']}`" in row[0]
    assert len(rows) == len(django_settings.CELERY_BEAT_SCHEDULE)
