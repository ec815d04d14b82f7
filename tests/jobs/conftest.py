"""Fixtures of the jobs tests: the cleanup tests' own local cluster, and one that cannot be reached
(tests/jobs/test_cleanup_services.py, tests/jobs/test_cleanup_records.py); the lending services'
tests' local partition, lender, pool, restart backoff, jobs lent out, restarted job and broker
queue (tests/jobs/test_lending_*.py)."""

from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from clusters.backends.base import JobState
from clusters.services import backend_of
from jobs.models import Job, JobAttempt
from tenants.models import Role
from tests.conftest import join
from tests.factories import ClusterFactory, PartitionFactory, TenantFactory
from tests.jobs_support import submit_admitted
from tests.lending_support import (
    H,
    empty_broker_queue,
    end,
    job_request,
    ledger_errors,
    make_pool,
    refreshed,
    run,
    whole_seconds_ago,
)


@pytest.fixture
def cleanup_cluster(catalog):
    """A local cluster "cleanup-local" of 4 real GPUs whose partition declares 8, so that the portal
    admits two 4-GPU jobs and the second waits in the local scheduler's own queue (PENDING)."""
    cluster = ClusterFactory(slug="cleanup-local", name="Cleanup", local_gpus=4)
    PartitionFactory(
        cluster=cluster,
        gpu_model=catalog[1],
        max_walltime_minutes=60,
        max_cpus_per_gpu=1,
        max_mem_per_gpu_mb=1000,
    )
    yield cluster
    backend = backend_of(cluster)
    for backend_id in (
        Job.objects.filter(cluster=cluster).exclude(backend_id="").values_list("backend_id", flat=True)
    ):
        backend.cancel(backend_id)  # no process of ours outlives the test


@pytest.fixture
def broken_cluster(db, tmp_path):
    """An enabled local cluster whose state directory is a file: every call raises BackendUnavailable."""
    path = Path(django_settings.VAR_DIR) / "local-cluster" / "cleanup-broken"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory")
    yield ClusterFactory(slug="cleanup-broken", name="Broken", local_gpus=1)
    path.unlink()


# --- The lending services' tests (tests/jobs/test_lending_*.py)


@pytest.fixture
def partition(catalog, settings, tmp_path):
    """The local cluster "local" (its state under the test's VAR_DIR), 2 nodes of 8 H100."""
    settings.VAR_DIR = tmp_path
    return PartitionFactory(
        cluster=ClusterFactory(slug="local"), gpu_model=catalog[1], nodes=2, max_walltime_minutes=600
    )


@pytest.fixture
def climate(db):
    return TenantFactory(slug="climate")


@pytest.fixture
def climber(climate):
    """A member of climate, the lender."""
    return join(climate, "climber", Role.MEMBER)


@pytest.fixture
def pool(tenant, climate, catalog):
    """pool(**limits): protein-lab borrows from climate (lending_support.make_pool)."""
    return lambda **fields: make_pool(tenant, climate, catalog, **fields)


@pytest.fixture
def lending_backoff(settings):
    """The restart backoff the lending tests count on (they use it: pytest.mark.usefixtures)."""
    settings.JOB_RESTART_BACKOFF_S = 30
    settings.JOB_RESTART_BACKOFF_MAX_S = 1800


@pytest.fixture
def lent_out(member, climber, tenant, climate, catalog, partition, pool):
    """climate's grant of 5 GPUs lends 4 to protein-lab's preemptible jobs b1 (2 GPUs), b2 and b3
    (1 each), admitted in that order, all running; then climate's own job l0 (1 GPU) runs on the
    fifth, the youngest of all. protein-lab's own job runs on its grant's one GPU."""
    p = pool(lender_gpus=5, lending_limit=4, borrowing_limit=4, grace_s=120)
    jobs = {"own": submit_admitted(member, job_request(tenant, partition, catalog, name="own"))}
    for name, gpus in (("b1", 2), ("b2", 1), ("b3", 1)):
        request = job_request(
            tenant, partition, catalog, gpus=gpus, preemptible=True, max_restarts=3, name=name
        )
        jobs[name] = submit_admitted(member, request)
        assert (jobs[name].holds_gpus, jobs[name].gpus_borrowed) == (True, gpus)
    jobs["l0"] = submit_admitted(climber, job_request(climate, partition, catalog, name="l0"))
    started = whole_seconds_ago(2 * H)
    for n, job in enumerate(jobs.values()):
        run(job, started_at=started, backend_id=f"local-{n + 1}")
    (lender_grant,) = refreshed(p.lender_grant)
    assert lender_grant.gpus_in_use == 5
    assert ledger_errors() == []
    return p, jobs


@pytest.fixture
def restarted(member, tenant, catalog, partition, pool):
    """A 2-GPU job (one borrowed) whose first attempt ran 3613 s from 3 hours ago on local-7 and
    ended NODE_FAIL: 2.0072 GPU-hours charged, 1.9928 kept reserved. (job, its first attempt)."""
    pool()
    request = job_request(tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=2)
    job = run(submit_admitted(member, request), started_at=whole_seconds_ago(3 * H))
    job = end(job, JobState.NODE_FAIL, ran_s=3613)
    assert (job.attempt, job.reserved_gpu_hours) == (2, Decimal("1.9928"))
    return job, JobAttempt.objects.get(job=job, number=1)


@pytest.fixture
def broker_queue():
    empty_broker_queue()
    yield
    empty_broker_queue()
