"""The dispatch, poll, end and error counts per cluster, from real contact with the Slurm testbed
and with a cluster that does not answer."""

import pytest

from clusters.services import cluster_sync
from jobs.models import Job, JobState
from jobs.services import jobs_poll
from jobs.services.dispatch import jobs_dispatch
from tests.factories import ClusterFactory
from tests.monitoring_support import TOKEN, scrape, value
from tests.slurm_support import slurm_tenant
from tests.testbed.env import registered_testbed
from tests.wait_support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _counted(text: str, name: str, **labels) -> float:
    return value(text, name, **labels) or 0.0


def test_dispatch_poll_and_ends_are_counted_per_cluster(client, settings, catalog):
    settings.METRICS_TOKEN = TOKEN
    cluster = registered_testbed()
    bed = slurm_tenant(cluster)
    try:
        # Slurm keeps the tenant's jobs PENDING: its account may hold no GPU.
        where = ["where", f"name={bed.tenant.slug}", "set", "GrpTRES=gres/gpu=0"]
        bed.backend.check(["sacctmgr", "-i", "modify", "account", *where])
        before = scrape(client)
        job_ids = bed.submit(2)
        assert jobs_dispatch(job_id=job_ids[0]) == 2
        jobs_poll(cluster_id=cluster.pk)
        between = scrape(client)
        key = {"cluster": cluster.slug}
        for name in (
            "portal_dispatch_cycle_duration_seconds_count",
            "portal_poll_cycle_duration_seconds_count",
        ):
            assert _counted(between, name, **key) - _counted(before, name, **key) == 1, name
        submitted = {"cluster": cluster.slug, "outcome": "submitted"}
        assert (
            _counted(between, "portal_dispatch_jobs_total", **submitted)
            - _counted(before, "portal_dispatch_jobs_total", **submitted)
            == 2
        )
        assert value(between, "portal_jobs", cluster=cluster.slug, state="PENDING") >= 2

        bed.backend.check(["scancel", Job.objects.get(pk=job_ids[0]).backend_id])
        wait_until(
            lambda: jobs_poll(cluster_id=cluster.pk) and Job.objects.get(pk=job_ids[0]).state == JobState.CANCELLED,
            timeout_s=30, what="the cancelled job's end",
        )  # fmt: skip
        ended = {"cluster": cluster.slug, "state": "CANCELLED"}
        after = scrape(client)
        assert (
            _counted(after, "portal_jobs_ended_total", **ended)
            - _counted(before, "portal_jobs_ended_total", **ended)
            == 1
        )
    finally:
        bed.cleanup()


def test_a_cluster_that_does_not_answer_counts_an_error_and_shows_down(client, settings, testbed):
    settings.METRICS_TOKEN = TOKEN
    known_hosts = testbed.ssh_known_hosts
    gone = ClusterFactory(
        slug="gone", kind="slurm", ssh_host="127.0.0.1", ssh_port=1, ssh_user="portal",
        ssh_known_hosts=known_hosts, ssh_private_key=testbed.ssh_private_key, slurm_cluster_name="gone",
    )  # fmt: skip
    key = {"cluster": "gone", "transport": "ssh"}
    assert cluster_sync(cluster=gone) is False  # a real connect to a closed port
    text = scrape(client)
    assert value(text, "portal_cluster_errors_total", **key) >= 1
    assert value(text, "portal_cluster_up", cluster="gone", kind="slurm") == 0
