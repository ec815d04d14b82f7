"""The lifecycle cleanup against the real Slurm testbed: an sbatch made behind the portal's back,
and an ended grant's limits lowered in slurmdbd. A test that fails because slurmctld was briefly
stopped (fault injection) is re-run, not skipped."""

import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.backends.base import JobSpec
from clusters.models import Cluster
from clusters.services import backend_of
from jobs.models import Job, JobState
from jobs.services import (
    JobRequest,
    grants_end,
    job_submit,
    jobs_dispatch,
    jobs_poll,
    orphans_find,
)
from jobs.states import END_STATES
from portal.core.models import AuditEvent
from tenants.limits import tenant_apply
from tenants.models import QuotaGrant, Role, Tenant
from tests.conftest import join
from tests.factories import QuotaGrantFactory
from tests.jobs_support import submit_admitted
from tests.slurm_support import POLL_S
from tests.wait_support import wait_until

TODAY = timezone.localdate()


@pytest.fixture
def slurm_tenant(testbed, catalog):
    """A tenant (and Slurm account) of its own: accounts outlive the test database."""
    tenant = Tenant.objects.create(slug=f"cleanup-{uuid.uuid4().hex[:8]}", name="Cleanup")
    user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
    grant = QuotaGrantFactory(tenant=tenant, pair=catalog)
    tenant_apply(tenant_id=tenant.pk, cluster_id=testbed.pk)
    yield tenant, user, grant
    backend = backend_of(testbed)
    backend.run(["scancel", "--account", tenant.slug])
    deadline = time.monotonic() + 30
    while (
        backend.check(["squeue", "-h", "-A", tenant.slug, "-o", "%i"]).strip() and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    backend.run(["sacctmgr", "-i", "delete", "account", f"name={tenant.slug}"])


def spec(token: str, account: str) -> JobSpec:
    """A job under the tenant's account, run by the tenant's own identity (as a job of its could)."""
    return JobSpec(
        token=token, name="orphan", account=account, qos="portal-normal", priority="normal", partition="h100",
        gpu_type="h100", k8s_resource="nvidia.com/gpu", k8s_product="", gpus_per_node=1, nodes=1,
        walltime_minutes=5, script="#!/bin/bash\nsleep 300\n", env={}, cpus_per_gpu=1, mem_per_gpu_mb=100,
        user=f"pt-{account}",
    )  # fmt: skip


def test_an_sbatch_with_a_portal_token_the_portal_does_not_know_is_reported_and_cancelled(
    settings, testbed, slurm_tenant, catalog
):
    tenant, user, _ = slurm_tenant
    backend = backend_of(testbed)
    request = JobRequest(
        tenant=tenant, scenario=catalog[0], gpu_model=catalog[1], gpus=1, walltime_minutes=5, name="known",
        script="#!/bin/bash\nsleep 300\n", cluster=testbed,
    )  # fmt: skip
    known = submit_admitted(user, request)
    jobs_dispatch(job_id=known.pk, batch=1)
    known.refresh_from_db()
    token = uuid.uuid4().hex
    orphan = backend.submit(spec(token, tenant.slug))  # a real sbatch, --comment=<a portal-looking token>
    assert backend.find(token, account=tenant.slug, user=f"pt-{tenant.slug}") == orphan
    # A second sbatch made by hand with the live job's own token (squeue shows the comment to its
    # user) is an orphan too: the portal's job has another id.
    twin = backend.submit(spec(known.token, tenant.slug))
    try:
        twins = {row["backend_id"] for row in orphans_find(dry_run=True).orphans}
        assert twin in twins and known.backend_id not in twins
    finally:
        backend.cancel(twin, user=f"pt-{tenant.slug}")
    wait_until(
        lambda: twin not in {j.backend_id for j in backend.list_jobs([tenant.slug])},
        timeout_s=60,
        interval_s=POLL_S,
        what="the twin to end",
    )

    settings.ORPHAN_CANCEL = False
    report = orphans_find()
    found = {row["backend_id"]: row for row in report.orphans if row["account"] == tenant.slug}
    assert list(found) == [orphan] and known.backend_id.isdigit()  # the portal's own job is no orphan
    assert (found[orphan]["token"], found[orphan]["cluster"], found[orphan]["known"]) == (
        token,
        "testbed",
        "",
    )
    assert report.cancelled == [] and "testbed" not in report.unreachable
    assert (
        AuditEvent.objects.filter(action="job.orphan", data__backend_id=orphan, data__cancelled=False).count()
        == 1
    )

    settings.ORPHAN_CANCEL = True
    report = orphans_find()
    assert f"testbed:{orphan}" in report.cancelled
    assert f"testbed:{known.backend_id}" not in report.cancelled
    ended = wait_until(
        lambda: (s := backend.poll([orphan]).get(orphan)) and s.state in END_STATES and s,
        timeout_s=60,
        interval_s=POLL_S,
        what="the orphan to end",
    )
    assert ended.state == "CANCELLED"
    assert backend.poll([known.backend_id])[known.backend_id].state in ("PENDING", "RUNNING")
    audit = AuditEvent.objects.get(action="job.orphan", data__backend_id=orphan, data__cancelled=True)
    assert (audit.target_id, audit.tenant_slug) == (str(testbed.pk), tenant.slug)


def grp_tres(testbed: Cluster, account: str) -> str:
    """The account's own association (no user): its GrpTRES as slurmdbd holds it."""
    shown = backend_of(testbed).check(
        ["sacctmgr", "-P", "-n", "show", "assoc", "where", f"account={account}", "format=User,GrpTRES"]
    )
    return next(line.split("|", 1)[1] for line in shown.splitlines() if line.startswith("|"))


def test_an_ended_grant_lowers_the_accounts_slurm_limits_and_cancels_its_jobs(
    celery_worker, settings, testbed, slurm_tenant, catalog
):
    tenant, user, grant = slurm_tenant
    settings.GRANT_END_CANCEL_RUNNING = True
    assert "gres/gpu=4" in grp_tres(testbed, tenant.slug)
    request = JobRequest(
        tenant=tenant, scenario=catalog[0], gpu_model=catalog[1], gpus=2, walltime_minutes=5, name="ending",
        script="#!/bin/bash\nsleep 300\n", cluster=testbed,
    )  # fmt: skip
    job = job_submit(user=user, request=request)[0]  # the worker dispatches it: sbatch over SSH
    wait_until(
        lambda: Job.objects.get(pk=job.pk).backend_id,
        timeout_s=60,
        interval_s=POLL_S,
        what="the job to reach Slurm",
    )
    QuotaGrant.objects.filter(pk=grant.pk).update(
        starts_on=TODAY - timedelta(days=10), ends_on=TODAY - timedelta(days=1)
    )

    report = grants_end()
    assert (report.cancelled, report.grants_ended, report.tenants_applied) == (
        [job.pk],
        [grant.pk],
        [tenant.pk],
    )
    # apply_tenant ran on the worker: no active grant, so no GPU for the account any more
    wait_until(
        lambda: "gres/gpu=0" in grp_tres(testbed, tenant.slug),
        timeout_s=60,
        interval_s=POLL_S,
        what="GrpTRES to drop to 0",
    )

    def ended() -> bool:
        jobs_poll(cluster_id=testbed.pk)
        return Job.objects.get(pk=job.pk).state in END_STATES

    wait_until(ended, timeout_s=60, interval_s=POLL_S, what="the job to end")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.events.filter(to_state=JobState.CANCELLING, reason="grant_ended").exists()
