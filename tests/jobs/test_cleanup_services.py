"""The lifecycle cleanup (jobs/services/cleanup.py) on the local cluster: real jobs as processes,
a real Celery worker where a cancel must reach the scheduler, no mocks. Each test runs on a local
cluster of its own ("cleanup-local"), so that no other test's jobs hold its GPUs."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from clusters.backends.base import JobSpec, JobStatus
from clusters.services import backend_of
from jobs.models import Job, JobState
from jobs.services import (
    grants_end,
    job_finish,
    jobs_admit,
    jobs_cap_walltime,
    jobs_dispatch,
    orphans_find,
    tenants_hold_suspended,
)
from jobs.states import END_STATES
from jobs.tasks import cap_walltime
from portal.core.models import AuditEvent
from tenants.errors import TenantSuspended
from tenants.models import TenantState
from tenants.services import tenant_update
from tests.cleanup_support import LONG, end_grant, submit, wait_for

pytestmark = pytest.mark.grant(gpus=8)  # the grant fixture's grant

TODAY = timezone.localdate()
SHORT = "#!/bin/bash\nsleep 1\n"


# --- Helpers


def state_of(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.state, job.reason


def cancel_audits(job: Job) -> list[dict]:
    rows = AuditEvent.objects.filter(action="job.cancel", target_type="jobs.job", target_id=str(job.pk))
    return [{"actor": row.actor_id, **row.data} for row in rows]


def reasons(job: Job) -> list[tuple[str, str]]:
    return list(job.events.values_list("to_state", "reason"))


def three_jobs(member, tenant, catalog) -> tuple[Job, Job, Job]:
    """(running, pending in the scheduler, queued in the portal) on an 8-GPU grant."""
    running = submit(member, tenant, catalog, gpus=4)
    wait_for([running], {JobState.RUNNING})
    pending = submit(member, tenant, catalog, gpus=4)
    wait_for([pending], {JobState.PENDING})
    queued = submit(member, tenant, catalog, gpus=4, script=SHORT)
    assert state_of(queued) == (JobState.QUEUED, "quota_wait")
    return running, pending, queued


# --- 1. Walltime cap


def test_walltime_cap_cancels_only_the_job_running_past_the_cap(
    celery_worker, member, tenant, catalog, cleanup_cluster, grant
):
    old = submit(member, tenant, catalog)
    young = submit(member, tenant, catalog)
    wait_for([old, young], {JobState.RUNNING})
    # 72 hours are not waited for: the job's start moves back past the cap instead.
    hours = django_settings.JOB_WALLTIME_CAP_HOURS
    Job.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(hours=hours, minutes=5))
    audits = AuditEvent.objects.count()

    dry = jobs_cap_walltime(dry_run=True)
    assert (dry.dry_run, dry.cancelled, dry.cap_hours) == (True, [old.pk], hours)
    assert state_of(old)[0] == JobState.RUNNING and AuditEvent.objects.count() == audits

    report = cap_walltime.delay().get(timeout=60)  # the beat task, on the worker
    assert (report["dry_run"], report["cancelled"]) == (False, [old.pk])
    wait_for([old], END_STATES)
    assert state_of(old)[0] == JobState.CANCELLED
    assert (JobState.CANCELLING, "walltime_cap") in reasons(old)
    assert cancel_audits(old) == [{"actor": None, "state": "RUNNING", "reason": "walltime_cap"}]
    assert state_of(young)[0] == JobState.RUNNING and cancel_audits(young) == []
    assert jobs_cap_walltime().cancelled == []  # a second run finds nothing more


# --- 2. Grants that end


def test_an_ended_grant_cancels_waiting_jobs_and_leaves_running_ones_unless_told(
    celery_worker, settings, member, tenant, catalog, cleanup_cluster, grant
):
    settings.GRANT_END_CANCEL_RUNNING = False
    running, pending, queued = three_jobs(member, tenant, catalog)
    end_grant(grant)
    audits = AuditEvent.objects.count()

    dry = grants_end(dry_run=True)
    assert (dry.cancelled, dry.running_left, dry.grants_ended) == (
        [pending.pk, queued.pk],
        [running.pk],
        [grant.pk],
    )
    assert [state_of(job)[0] for job in (running, pending, queued)] == ["RUNNING", "PENDING", "QUEUED"]
    assert AuditEvent.objects.count() == audits

    report = grants_end()
    assert (report.cancelled, report.running_left) == ([pending.pk, queued.pk], [running.pk])
    assert (report.grants_ended, report.tenants_applied) == ([grant.pk], [tenant.pk])
    assert state_of(queued) == (JobState.CANCELLED, "grant_ended")  # never reached the scheduler
    wait_for([pending], END_STATES)
    assert state_of(pending)[0] == JobState.CANCELLED
    assert (JobState.CANCELLING, "grant_ended") in reasons(pending)
    for job, was in ((pending, "PENDING"), (queued, "QUEUED")):
        assert cancel_audits(job) == [{"actor": None, "state": was, "reason": "grant_ended"}]
    ended = AuditEvent.objects.get(action="grant.ended")
    assert (ended.target_id, ended.tenant_slug, ended.actor_id) == (str(grant.pk), tenant.slug, None)
    assert f"ended on {TODAY - timedelta(days=1)}" in ended.data["message"]
    assert "left to finish" in ended.data["message"] and ended.data["running"] == [running.pk]
    assert state_of(running)[0] == JobState.RUNNING

    again = grants_end()  # safe to run twice: nothing more to cancel, no second grant.ended
    assert (again.cancelled, again.grants_ended) == ([], [])
    assert AuditEvent.objects.filter(action="grant.ended").count() == 1

    settings.GRANT_END_CANCEL_RUNNING = True
    assert grants_end().cancelled == [running.pk]
    wait_for([running], END_STATES)
    assert state_of(running)[0] == JobState.CANCELLED
    grant.refresh_from_db()
    assert (grant.gpus_in_use, grant.gpu_hours_reserved) == (0, 0)


def test_two_runs_at_once_cancel_each_job_of_an_ended_grant_once(
    transactional_db, member, tenant, catalog, cleanup_cluster, grant
):
    jobs = [submit(member, tenant, catalog, gpus=2) for _ in range(4)]  # admitted, never dispatched here
    end_grant(grant)
    reports, barrier = [], threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        try:
            reports.append(grants_end())
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    cancelled = [pk for report in reports for pk in report.cancelled]
    assert sorted(cancelled) == [job.pk for job in jobs]  # each by one run, none twice
    assert all(len(cancel_audits(job)) == 1 for job in jobs)
    assert AuditEvent.objects.filter(action="grant.ended").count() == 1
    grant.refresh_from_db()
    assert (grant.gpus_in_use, grant.gpu_hours_reserved) == (0, 0)


def test_dispatch_refuses_a_job_whose_grant_ended_after_admission(
    member, tenant, catalog, cleanup_cluster, grant
):
    job = submit(member, tenant, catalog)  # admitted; its dispatch would follow on commit
    assert job.holds_gpus
    end_grant(grant)
    jobs_dispatch(job_id=job.pk, batch=1)
    job.refresh_from_db()
    assert (job.state, job.reason, job.holds_gpus, job.backend_id) == ("QUEUED", "grant_ended", False, "")
    assert backend_of(cleanup_cluster).find(job.token) is None
    grant.refresh_from_db()
    assert grant.gpus_in_use == 0
    assert grants_end().cancelled == [job.pk]
    assert state_of(job) == (JobState.CANCELLED, "grant_ended")
    grant.refresh_from_db()
    assert grant.gpu_hours_reserved == 0


def test_cleanup_dry_run_setting_makes_every_run_a_dry_run(
    settings, member, tenant, catalog, cleanup_cluster, grant
):
    settings.CLEANUP_DRY_RUN = True
    job = submit(member, tenant, catalog)
    end_grant(grant)
    report = grants_end()
    assert (report.dry_run, report.cancelled) == (True, [job.pk])
    assert state_of(job)[0] == JobState.QUEUED
    assert not AuditEvent.objects.filter(action__in=["job.cancel", "grant.ended"]).exists()
    assert grants_end(dry_run=False).cancelled == [job.pk]
    assert state_of(job) == (JobState.CANCELLED, "grant_ended")


# --- 3. Suspended tenants


def test_a_suspended_tenant_gets_no_new_work_and_its_held_jobs_come_back(
    celery_worker, settings, admin_user, member, tenant, catalog, cleanup_cluster, grant
):
    settings.SUSPENDED_CANCEL_RUNNING = False
    running, pending, queued = three_jobs(member, tenant, catalog)
    tenant_update(actor=admin_user, tenant=tenant, changes={"state": TenantState.SUSPENDED})
    with pytest.raises(TenantSuspended):
        submit(member, tenant, catalog)

    report = tenants_hold_suspended()
    assert (report.tenants, report.cancelled, report.held) == ([tenant.pk], [pending.pk], [queued.pk])
    assert (report.running_left, report.tenants_applied) == ([running.pk], [tenant.pk])
    wait_for([pending], END_STATES)
    assert (JobState.CANCELLING, "tenant_suspended") in reasons(pending)
    assert cancel_audits(pending) == [{"actor": None, "state": "PENDING", "reason": "tenant_suspended"}]
    jobs_admit(partition_id=queued.partition_id)  # GPUs are free now, and still admission holds it
    assert state_of(queued) == (JobState.QUEUED, "tenant_suspended")
    assert state_of(running)[0] == JobState.RUNNING and tenants_hold_suspended().cancelled == []

    settings.SUSPENDED_CANCEL_RUNNING = True
    assert tenants_hold_suspended().cancelled == [running.pk]
    wait_for([running], END_STATES)
    assert (JobState.CANCELLING, "tenant_suspended") in reasons(running)

    tenant_update(actor=admin_user, tenant=tenant, changes={"state": TenantState.ACTIVE})
    assert jobs_admit(partition_id=queued.partition_id) == [queued.pk]
    wait_for([queued], END_STATES)
    assert state_of(queued)[0] == JobState.COMPLETED


def test_dispatch_refuses_a_job_whose_tenant_was_suspended_after_admission(
    member, tenant, catalog, cleanup_cluster, grant
):
    job = submit(member, tenant, catalog)
    tenant.state = TenantState.SUSPENDED
    tenant.save(update_fields=["state"])
    jobs_dispatch(job_id=job.pk, batch=1)
    job.refresh_from_db()
    assert (job.state, job.reason, job.holds_gpus, job.backend_id) == (
        "QUEUED",
        "tenant_suspended",
        False,
        "",
    )
    assert backend_of(cleanup_cluster).find(job.token) is None
    grant.refresh_from_db()
    assert grant.gpus_in_use == 0
    assert tenants_hold_suspended().held == [job.pk]  # held, not cancelled: a suspension can end


# --- 4. Orphans


def spec(token: str, account: str) -> JobSpec:
    return JobSpec(
        token=token, name="orphan", account=account, qos="portal-normal", priority="normal", partition="local",
        gpu_type="local", k8s_resource="nvidia.com/gpu", k8s_product="", gpus_per_node=1, nodes=1,
        walltime_minutes=10, script=LONG, env={},
    )  # fmt: skip


def test_orphans_are_reported_once_and_cancelled_when_the_setting_says(
    settings, broken_cluster, member, tenant, catalog, cleanup_cluster, grant
):
    assert broken_cluster.pk < cleanup_cluster.pk  # the unreachable one comes first and stops nothing
    settings.ORPHAN_CANCEL = False
    backend = backend_of(cleanup_cluster)
    known = submit(member, tenant, catalog, gpus=1)
    jobs_dispatch(job_id=known.pk, batch=1)
    known.refresh_from_db()
    orphan_token = uuid.uuid4().hex
    orphan = backend.submit(spec(orphan_token, tenant.slug))  # started behind the portal's back
    # No portal token, under the tenant's account: an orphan too (a job the portal did not submit
    # would burn the tenant's quota unseen).
    foreign = backend.submit(spec(f"users-own-{uuid.uuid4().hex[:8]}", tenant.slug))
    elsewhere = backend.submit(spec(uuid.uuid4().hex, "not-a-tenant"))
    try:
        audits = AuditEvent.objects.count()
        dry = orphans_find(dry_run=True)
        found = {row["backend_id"]: row for row in dry.orphans}
        assert {orphan, foreign} <= found.keys() and {elsewhere, known.backend_id}.isdisjoint(found)
        assert found[foreign]["known"] == ""  # no portal job carries its token
        row = found[orphan]
        assert (row["cluster"], row["account"], row["token"], row["known"]) == (
            "cleanup-local",
            tenant.slug,
            orphan_token,
            "",
        )
        assert dry.unreachable == ["cleanup-broken"] and AuditEvent.objects.count() == audits
        broken_cluster.refresh_from_db()
        assert broken_cluster.healthy  # a dry run writes nothing, health included

        report = orphans_find()
        broken_cluster.refresh_from_db()
        assert not broken_cluster.healthy
        report = orphans_find()
        assert orphan in {row["backend_id"] for row in report.orphans} and report.cancelled == []
        assert backend.poll([orphan])[orphan].state in ("RUNNING", "PENDING")
        assert orphans_find().orphans == report.orphans  # reported each run, audited once
        audit = AuditEvent.objects.get(action="job.orphan", data__backend_id=orphan)
        assert (audit.target_id, audit.tenant_slug, audit.data["cancelled"]) == (
            str(cleanup_cluster.pk),
            tenant.slug,
            False,
        )

        # A portal job that the portal has ended while the scheduler still holds it is an orphan too.
        job_finish(
            job_id=known.pk, status=JobStatus(known.backend_id, "LOST", "", "unknown to the scheduler")
        )
        settings.ORPHAN_CANCEL = True
        report = orphans_find()
        cancelled = {
            f"cleanup-local:{orphan}",
            f"cleanup-local:{foreign}",
            f"cleanup-local:{known.backend_id}",
        }
        assert cancelled <= set(report.cancelled)
        assert {row["known"] for row in report.orphans if row["backend_id"] == known.backend_id} == {"LOST"}
        assert backend.poll([orphan])[orphan].state == "CANCELLED"
        assert backend.poll([foreign])[foreign].state == "CANCELLED"
        assert AuditEvent.objects.get(action="job.orphan", data__backend_id=orphan, data__cancelled=True)
    finally:
        for backend_id in (orphan, foreign, elsewhere):
            backend.cancel(backend_id)
