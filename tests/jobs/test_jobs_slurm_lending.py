"""Lending, reclaim and restarts on the real Slurm testbed (issue [Lend]): a borrower's
preemptible job runs on a lender's idle H200; the lender submits; the borrower's job gets USR1,
writes its checkpoint, is stopped, and its next attempt resumes from the checkpoint once the GPUs
are free. A node set down mid-job brings the job back on the other node from its checkpoint.
Jobs go through the API, a real Celery worker (its backoff shortened) and sbatch over SSH; what
happened is judged from outside: Slurm's accounting, the job's own log, the ledger."""

import subprocess
import uuid
from decimal import Decimal

import pytest

from clusters.backends.base import JobRef
from clusters.backends.slurm import SlurmBackend
from clusters.models import GpuModel, Partition, Scenario
from clusters.services import cluster_config
from jobs.models import Job, JobAttempt, Loan
from portal.core.models import AuditEvent
from tenants.limits import tenant_apply
from tenants.models import Cohort, CohortMember, QuotaGrant, Role, Tenant
from tests.conftest import join, start_celery_worker, stop
from tests.factories import QuotaGrantFactory
from tests.jobs_support import api_submit, follow
from tests.testbed.env import testbed_env
from tests.wait_support import wait_until

# Counts to STEPS, a second a step; a checkpoint every 3 steps, and at once on the warning
# signal, each saved and then announced by the contract's marker line.
STEPPER = """#!/bin/bash
steps={steps}
step=0
if [ -f "$PORTAL_CHECKPOINT_DIR/step" ]; then
    step=$(cat "$PORTAL_CHECKPOINT_DIR/step")
    echo "PORTAL_RESUMED $(date +%s) step $step attempt $PORTAL_ATTEMPT node $SLURMD_NODENAME"
fi
save() {{ echo "$step" > "$PORTAL_CHECKPOINT_DIR/step.new" && mv "$PORTAL_CHECKPOINT_DIR/step.new" \\
    "$PORTAL_CHECKPOINT_DIR/step" && echo "PORTAL_CHECKPOINT $(date +%s) step $step"; }}
trap 'save; echo warned; exit 143' "$PORTAL_PREEMPT_SIGNAL"
echo "attempt $PORTAL_ATTEMPT on $SLURMD_NODENAME from step $step"
while [ "$step" -lt "$steps" ]; do
    sleep 1
    step=$((step + 1))
    if [ $((step % 3)) -eq 0 ]; then save; fi
done
echo "done at step $step"
"""
ENDS = {"COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "NODE_FAIL", "REJECTED", "LOST", "TIMEOUT"}


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A real Celery worker whose restart backoff is 2 s, not 30."""
    from portal.celery import app

    app.control.purge()
    proc = start_celery_worker(tmp_path / "worker.log", {"JOB_RESTART_BACKOFF_S": "2"})
    yield proc
    stop(proc)


def _tenant(prefix: str, pair, gpus: int, *, model_share: str = "whole") -> tuple[Tenant, object]:
    tenant = Tenant.objects.create(slug=f"{prefix}-{uuid.uuid4().hex[:8]}", name=prefix)
    user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
    QuotaGrantFactory(tenant=tenant, pair=pair, gpus=gpus, gpu_hours=10)
    return tenant, user


def _forget(testbed, tenants) -> None:
    backend = SlurmBackend(cluster_config(testbed))
    for tenant in tenants:
        backend.check(["scancel", "--account", tenant.slug])
        backend.check(["sacctmgr", "-i", "delete", "account", tenant.slug])


@pytest.fixture
def cohort(testbed):
    """A lender granted both H200s of the testbed's share node, a borrower granted one, in a
    cohort on that partition: the lender lends one, the borrower borrows one, 15 s of grace."""
    pair = (Scenario.objects.get(slug="ai-training"), GpuModel.objects.get(slug="h200"))
    partition = Partition.objects.get(cluster=testbed, name=testbed_env()["SLURM_TESTBED_SHARE_PARTITION"])
    lender, lender_user = _tenant("lender", pair, 2)
    borrower, borrower_user = _tenant("borrower", pair, 1)
    cohort = Cohort.objects.create(
        slug=f"h200-{uuid.uuid4().hex[:6]}", gpu_model=pair[1], partition=partition, reclaim_grace_s=15
    )
    CohortMember.objects.create(cohort=cohort, tenant=lender, lending_limit=1)
    CohortMember.objects.create(cohort=cohort, tenant=borrower, borrowing_limit=1)
    for tenant in (lender, borrower):
        tenant_apply(tenant_id=tenant.pk, cluster_id=testbed.pk)
    yield partition, (lender, lender_user), (borrower, borrower_user)
    _forget(testbed, [lender, borrower])


def _submit(client, tenant, partition, **fields) -> dict:
    on_testbed = {
        "tenant": tenant.slug, "cluster": "testbed", "partition": partition.name, "gpu_model": "h200",
        "name": "lend", "walltime_minutes": 10,
    }  # fmt: skip
    return api_submit(client, **on_testbed | fields)


def _timeline(job_id: int) -> list[str]:
    return [
        f"{event.at:%H:%M:%S} attempt {event.attempt}: {event.from_state or '-'} -> {event.to_state}"
        f" ({event.reason}{', ' + event.raw_state if event.raw_state else ''})"
        for event in Job.objects.get(pk=job_id).events.order_by("id")
    ]


def test_a_lender_reclaims_and_the_borrowers_job_resumes_from_its_checkpoint(
    worker, client_for, testbed, cohort
):
    partition, (lender, lender_user), (borrower, borrower_user) = cohort
    lender_client, borrower_client = client_for(lender_user), client_for(borrower_user)

    # The borrower asks for 2 GPUs on a 1-GPU grant: it runs on one of its own and one lent.
    borrowed = _submit(
        borrower_client, borrower, partition, gpus=2, preemptible=True, script=STEPPER.format(steps=40)
    )
    assert (borrowed["preemptible"], borrowed["max_restarts"]) == (True, 3)
    running = follow(borrower_client, borrowed["id"], testbed.pk, {"RUNNING"} | ENDS, timeout_s=90)
    assert (running["state"], running["gpus_borrowed"]) == ("RUNNING", 1), running
    loan = Loan.objects.get(job_id=borrowed["id"])
    assert (loan.lender_id, loan.gpus, loan.ended_at) == (lender.pk, 1, None)
    lender_grant = QuotaGrant.objects.get(tenant=lender)
    assert lender_grant.gpus_in_use == 1  # its lent GPU counts against it
    wait_until(
        lambda: "PORTAL_CHECKPOINT" in "\n".join(_log(borrower_client, borrowed["id"])),
        timeout_s=30, interval_s=0.5, what="the borrower's first periodic checkpoint",
    )  # fmt: skip

    # The lender wants both its GPUs: the loan is reclaimed, the borrower's job warned.
    own = _submit(lender_client, lender, partition, gpus=2, script="#!/bin/bash\necho lender; sleep 6\n")
    wait_until(
        lambda: Job.objects.get(pk=borrowed["id"]).stop_at is not None,
        timeout_s=30, interval_s=0.3, what="the reclaim",
    )  # fmt: skip
    assert Loan.objects.get(pk=loan.pk).reclaimed
    assert AuditEvent.objects.filter(action="loan.reclaim", tenant_id=lender.pk).exists()
    assert AuditEvent.objects.filter(action="loan.reclaim", tenant_id=borrower.pk).exists()
    # its quota is back; the GPUs are not yet
    assert Job.objects.get(pk=own["id"]).reason in {"capacity_wait", ""}

    # USR1 reaches the batch shell, which saves its step; after the grace the job is stopped and
    # queued again as attempt 2.
    requeued = follow(borrower_client, borrowed["id"], testbed.pk, {"QUEUED"} | ENDS, timeout_s=90)
    assert (requeued["state"], requeued["attempt"]) == ("QUEUED", 2), requeued
    first = JobAttempt.objects.get(job_id=borrowed["id"], number=1)
    assert first.end_state == "PREEMPTED"
    backend = SlurmBackend(cluster_config(testbed))
    accounted = backend.check(["sacct", "-n", "-X", "-P", "-j", first.backend_id, "--format=State,ExitCode"])
    # it saved its step on USR1 and exited; Slurm did not requeue it: the portal restarts it
    assert accounted.strip().startswith("FAILED|"), accounted
    ref = JobRef(
        backend_id=first.backend_id, token=first.token, account=borrower.slug, user=f"pt-{borrower.slug}"
    )
    first_log = backend.log_tail(ref, lines=200, max_bytes=100_000).lines
    assert first_log[-1] == "warned" and first_log[-2].startswith("PORTAL_CHECKPOINT"), first_log

    # The lender's job runs on both GPUs and ends; then the borrower borrows again and resumes.
    lender_done = follow(lender_client, own["id"], testbed.pk, ENDS, timeout_s=120)
    assert lender_done["state"] == "COMPLETED", lender_done
    done = follow(borrower_client, borrowed["id"], testbed.pk, ENDS, timeout_s=180)
    assert (done["state"], done["attempt"]) == ("COMPLETED", 2), done
    log = _log(borrower_client, borrowed["id"])
    resumed = next(line for line in log if line.startswith("PORTAL_RESUMED"))
    kept_step = int(resumed.split()[3])
    assert kept_step >= 3, log  # the work of attempt 1 up to its checkpoint was kept
    assert log[-1] == "done at step 40", log

    first.refresh_from_db()
    wait_until(
        lambda: JobAttempt.objects.get(pk=first.pk).reviewed, timeout_s=30, interval_s=0.3, what="review"
    )
    first.refresh_from_db()
    assert first.checkpoint_at is not None and first.gpu_hours_lost is not None
    assert first.gpu_hours_lost < first.gpu_hours  # it kept what its checkpoint saved
    starts = {
        job: Job.objects.get(pk=job).events.filter(to_state="RUNNING").first().at for job in (own["id"],)
    }
    assert starts[own["id"]] >= first.ended_at  # the lender ran once the borrower had stopped
    loans = Loan.objects.filter(job_id=borrowed["id"]).order_by("id")
    assert [(loan.attempt, loan.reclaimed, loan.ended_at is not None) for loan in loans] == [
        (1, True, True),
        (2, False, True),
    ]

    # The ledger: nothing held, nothing reserved; charged what ran, less what was lost.
    job = Job.objects.get(pk=borrowed["id"])
    for grant in QuotaGrant.objects.filter(tenant__in=[lender, borrower]):
        assert (grant.gpus_in_use, grant.gpu_hours_reserved) == (0, 0), grant
    borrower_grant = QuotaGrant.objects.get(tenant=borrower)
    assert borrower_grant.gpu_hours_used == job.gpu_hours
    assert job.gpu_hours_lost == first.gpu_hours_lost
    print("\n".join(["", f"borrower job {job.pk}:", *_timeline(job.pk), f"lender job {own['id']}:",
                     *_timeline(int(own["id"])), f"attempt 1 checkpoint at {first.checkpoint_at:%H:%M:%S}, "
                     f"kept {first.minutes_kept} min, lost {first.gpu_hours_lost} GPU-h; resumed from step {kept_step}"]))  # fmt: skip


def _log(client, job_id) -> list[str]:
    return client.get(f"/api/v1/jobs/{job_id}/log/?tail=200").json()["lines"]


@pytest.fixture
def h100_tenant(testbed, catalog):
    scenario, model = catalog
    tenant, user = _tenant("restart", (scenario, model), 1)
    tenant_apply(tenant_id=tenant.pk, cluster_id=testbed.pk)
    yield tenant, user
    _forget(testbed, [tenant])


def _scontrol_node(node: str, state: str) -> None:
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", f"state={state}", "reason=portal-test"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def _node_back(node: str) -> None:
    """The node up again, unless slurmd's registration brought it back already."""
    shown = subprocess.run(
        ["scontrol", "-o", "show", "node", node], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    if "State=DOWN" in shown or "DRAIN" in shown:
        _scontrol_node(node, "resume")


def test_a_node_set_down_brings_the_job_back_on_the_other_node_from_its_checkpoint(
    worker, client_for, testbed, h100_tenant
):
    tenant, user = h100_tenant
    client = client_for(user)
    job = api_submit(
        client, tenant=tenant.slug, cluster="testbed", partition="h100", name="restart", gpus=1,
        walltime_minutes=10, max_restarts=2, script=STEPPER.format(steps=15),
    )  # fmt: skip
    running = follow(client, job["id"], testbed.pk, {"RUNNING"} | ENDS, timeout_s=90)
    assert running["state"] == "RUNNING", running
    node = Job.objects.get(pk=job["id"]).node_list
    wait_until(
        lambda: "PORTAL_CHECKPOINT" in "\n".join(_log(client, job["id"])),
        timeout_s=30, interval_s=0.5, what="a checkpoint",
    )  # fmt: skip
    try:
        # drained first, so that slurmd's next registration does not return it to service
        # (ReturnToService=2) before the job's next attempt is placed
        _scontrol_node(node, "drain")
        _scontrol_node(node, "down")
        back = follow(client, job["id"], testbed.pk, {"QUEUED"} | ENDS, timeout_s=90)
        assert (back["state"], back["attempt"]) == ("QUEUED", 2), back
        assert JobAttempt.objects.get(job_id=job["id"], number=1).end_state == "NODE_FAIL"
        again = follow(client, job["id"], testbed.pk, {"RUNNING"} | ENDS, timeout_s=90)
        assert again["state"] == "RUNNING", again
        assert Job.objects.get(pk=job["id"]).node_list != node  # the other node
    finally:
        _node_back(node)
    done = follow(client, job["id"], testbed.pk, ENDS, timeout_s=120)
    assert (done["state"], done["attempt"]) == ("COMPLETED", 2), done
    log = _log(client, job["id"])
    resumed = next(line for line in log if line.startswith("PORTAL_RESUMED"))
    assert int(resumed.split()[3]) >= 3, log
    grant = QuotaGrant.objects.get(tenant=tenant)
    assert (grant.gpus_in_use, grant.gpu_hours_reserved) == (0, 0)
    assert Decimal(str(done["gpu_hours"])) == grant.gpu_hours_used
    print("\n".join(["", f"job {job['id']}:", *_timeline(int(job["id"]))]))
