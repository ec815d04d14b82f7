"""Where no sandbox can be made, the local cluster serves one tenant only, and says so.

"No sandbox" is a real condition here, not a mock: the cluster is pointed at a bwrap that does
not exist (LOCAL_SANDBOX_BWRAP), exactly as on a machine without bubblewrap.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from django.test import Client, override_settings

from clusters.backends.base import END_STATES, BackendError, ClusterConfig, JobRef, JobSpec, JobState
from clusters.backends.local import LocalBackend
from clusters.models import Cluster


def spec(token: str, account: str, script: str = "echo ran-as-$(id -u)\n") -> JobSpec:
    return JobSpec(
        token=token, name=token, account=account, qos="portal-normal", priority="normal", partition="local",
        gpu_type="local", k8s_resource="", k8s_product="", gpus_per_node=1, nodes=1, walltime_minutes=5,
        script=script, env={},
    )  # fmt: skip


def make_backend(tmp_path, **fields) -> LocalBackend:
    config = ClusterConfig(slug="local", kind="local", local_gpus=2, state_dir=str(tmp_path / "state"))
    return LocalBackend(dataclasses.replace(config, **fields), grace_s=1)


def run_to_end(backend: LocalBackend, token: str, account: str) -> str:
    backend_id = backend.submit(spec(token, account))
    deadline = time.monotonic() + 30
    while (status := backend.poll([backend_id]).get(backend_id)) is None or status.state not in END_STATES:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert status.state == JobState.COMPLETED
    return backend_id


def test_without_bwrap_the_first_tenant_runs_and_a_second_is_refused(tmp_path):
    backend = make_backend(tmp_path, local_sandbox_bwrap=str(tmp_path / "no-bwrap"))

    assert not backend.sandbox.ok
    assert "bwrap is not an executable" in backend.sandbox.detail
    first = run_to_end(backend, "a-1", "tenant-a")
    tail = backend.log_tail(JobRef(first, "a-1", "tenant-a"), lines=5, max_bytes=1000).lines
    assert tail == [f"ran-as-{os.geteuid()}"]  # unsandboxed: as the portal's user
    run_to_end(backend, "a-2", "tenant-a")  # the one tenant goes on running
    with pytest.raises(BackendError, match=r"no job sandbox, so it serves one tenant only") as refused:
        backend.submit(spec("b-1", "tenant-b"))
    assert "tenant-a" not in str(refused.value) and "/" not in str(refused.value)  # no tenant, no path
    assert backend.find("b-1") is None
    health = backend.health()
    assert health.healthy and "NO SANDBOX, serves one tenant only" in health.detail

    # Once the first tenant's job files are gone (log retention), another tenant may take over.
    assert sorted(backend.delete_finished(["tenant-a"], older_than_s=0, dry_run=False)) == [
        "local-1",
        "local-2",
    ]
    run_to_end(backend, "b-2", "tenant-b")
    with pytest.raises(BackendError, match="serves one tenant only"):
        backend.submit(spec("a-3", "tenant-a"))


def test_local_cluster_tenant_names_the_one_tenant_with_or_without_a_sandbox(tmp_path):
    for bwrap in (str(tmp_path / "no-bwrap"), "/usr/bin/bwrap"):
        backend = make_backend(
            tmp_path / bwrap.replace("/", "_"), local_sandbox_bwrap=bwrap, local_tenant="tenant-b"
        )

        with pytest.raises(BackendError, match="serves one tenant only, and not this one"):
            backend.submit(spec("a-1", "tenant-a"))
        run_to_end(backend, "b-1", "tenant-b")
        expected = "serves tenant tenant-b only" if bwrap == "/usr/bin/bwrap" else "NO SANDBOX"
        assert expected in backend.sandbox_summary()


def test_with_a_sandbox_every_tenant_runs(tmp_path):
    backend = make_backend(tmp_path)

    assert backend.sandbox.ok, backend.sandbox.detail
    run_to_end(backend, "a-1", "tenant-a")
    run_to_end(backend, "b-1", "tenant-b")
    assert "jobs run in a bubblewrap sandbox" in backend.health().detail


@pytest.mark.django_db
def test_readyz_warns_of_a_local_cluster_without_a_sandbox_and_stays_ready(client, redis_server, tmp_path):
    Cluster.objects.create(slug="box", name="Box", kind="local", local_gpus=1)
    Cluster.objects.create(slug="off", name="Off", kind="local", enabled=False)
    with override_settings(CELERY_BROKER_URL=redis_server["url"]):
        assert client.get("/readyz").json()["warnings"] == []
        with override_settings(LOCAL_SANDBOX_BWRAP=str(tmp_path / "no-bwrap")):
            response = client.get("/readyz")

    assert response.status_code == 200
    assert response.json()["warnings"] == [
        "local cluster box: no job sandbox, so it serves one tenant only (its page in the admin console says why)"
    ]
    assert str(tmp_path) not in response.content.decode()  # /readyz answers anyone: no path


@pytest.mark.django_db
def test_the_admin_page_of_a_local_cluster_says_how_jobs_are_isolated(admin_user, tmp_path):
    cluster = Cluster.objects.create(slug="box", name="Box", kind="local", local_gpus=1)
    staff = Client()
    staff.force_login(admin_user)

    page = staff.get(f"/admin/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert "jobs run in a bubblewrap sandbox" in page
    with override_settings(LOCAL_SANDBOX_BWRAP=str(tmp_path / "no-bwrap")):
        page = staff.get(f"/admin/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert "NO SANDBOX, serves one tenant only: bwrap is not an executable at" in page
