"""KubernetesBackend's cleanup (list_jobs, delete_finished, purge_scratch) against the fake API
server of tests/k8s_apiserver: real HTTP, the official client, Jobs that really run. A Job's end
is moved into the past with the fake's backdate(), as if it had ended hours ago."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from clusters.backends import backend_for, base
from clusters.backends.base import BackendError, ClusterConfig, JobSpec, PurgeReport, TenantLimits
from clusters.backends.kubernetes import KubernetesBackend
from tests.k8s_apiserver import FakeApiServer

API_TOKEN = "fake-api-token-cleanup"
H100 = "NVIDIA-H100-80GB-HBM3"
NODE = {
    "name": "gpu-1",
    "labels": {"nvidia.com/gpu.product": H100},
    "capacity": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1024Gi", "pods": "110"},
    "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
}
HOUR_S = 3600
DEADLINE_S = 30


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=API_TOKEN, nodes=[NODE]) as server:
        yield server
        assert server.cluster.errors == []


@pytest.fixture
def backend(api) -> KubernetesBackend:
    slug = f"fake-{uuid.uuid4().hex[:8]}"
    config = ClusterConfig(slug=slug, kind="kubernetes", k8s_api_url=api.url, k8s_token=API_TOKEN)
    backend = backend_for(config)
    assert isinstance(backend, KubernetesBackend)
    for account in ("protein-lab", "climate-lab"):
        backend.apply_tenant(
            TenantLimits(account, "portal-normal", [], {"h100": 8}, 4800, {"nvidia.com/gpu": 8})
        )
    return backend


def submit(backend: KubernetesBackend, script: str, account: str = "protein-lab") -> tuple[str, str]:
    """(backend id, token) of a new one-GPU Job running `script`."""
    token = uuid.uuid4().hex
    spec = JobSpec(
        token=token,
        name="cleanup test",
        account=account,
        qos="portal-normal",
        priority="normal",
        partition=H100,
        gpu_type="h100",
        k8s_resource="nvidia.com/gpu",
        k8s_product=H100,
        gpus_per_node=1,
        nodes=1,
        walltime_minutes=10,
        script=f"#!/bin/bash\n{script}\n",
        env={},
        cpus_per_gpu=1,
        mem_per_gpu_mb=1000,
        labels={"tenant": account, "job": "1", "scenario": "ai-training"},
    )
    return backend.submit(spec), token


def wait_for_states(backend: KubernetesBackend, wanted: dict[str, set[str]]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        statuses = backend.poll(list(wanted))
        if all(bid in statuses and statuses[bid].state in states for bid, states in wanted.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"not {wanted} after {DEADLINE_S}s: {backend.poll(list(wanted))}")


def job_ids(api: FakeApiServer) -> set[str]:
    return {f"{job['metadata']['namespace']}/{job['metadata']['name']}" for job in api.objects("Job")}


def backdate(api: FakeApiServer, backend_id: str, seconds: float) -> None:
    namespace, name = backend_id.split("/")
    api.backdate("Job", namespace, name, seconds)


def requests_since(api: FakeApiServer, before: int) -> list[tuple[str, str, dict]]:
    return api.requests[before:]


# ---------------------------------------------------------------- list_jobs --
def test_list_jobs_gives_the_token_and_state_of_jobs_that_have_not_ended(api, backend):
    running, running_token = submit(backend, "sleep 30")
    other, other_token = submit(backend, "sleep 30", account="climate-lab")
    done, _ = submit(backend, "true")
    wait_for_states(
        backend,
        {running: {base.JobState.RUNNING}, other: {base.JobState.RUNNING}, done: {base.JobState.COMPLETED}},
    )

    before = len(api.requests)
    listed = backend.list_jobs(["protein-lab", "climate-lab"])
    assert sorted(listed, key=lambda job: job.account) == [
        base.SchedulerJob(other, other_token, "climate-lab", base.JobState.RUNNING),
        base.SchedulerJob(running, running_token, "protein-lab", base.JobState.RUNNING),
    ]
    (call,) = requests_since(api, before)  # one list across namespaces, by the portal's label
    assert call[:2] == ("GET", "/apis/batch/v1/jobs")
    assert call[2]["labelSelector"] == "app.kubernetes.io/managed-by=gpu-portal"

    assert backend.list_jobs(["protein-lab"]) == [
        base.SchedulerJob(running, running_token, "protein-lab", base.JobState.RUNNING)
    ]
    assert api.requests[-1][1] == "/apis/batch/v1/namespaces/protein-lab/jobs"
    backend.cancel(running)  # a Job being deleted has ended (CANCELLED): not listed
    assert backend.list_jobs(["protein-lab"]) == []


def test_list_jobs_leaves_out_what_the_portal_did_not_create(api, backend):
    foreign = {
        "metadata": {"name": "hand-made", "labels": {"gpu-portal/token": "abc"}},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
        },
    }
    backend.api.request("create", "POST", "/apis/batch/v1/namespaces/protein-lab/jobs", body=foreign)
    assert backend.list_jobs(["protein-lab"]) == []
    assert backend.list_jobs([]) == []


def test_a_name_that_cannot_be_a_namespace_is_left_out_and_spoils_no_other(api, backend):
    job, _ = submit(backend, "sleep 30")
    assert backend.list_jobs(["Bad_Name", "default", "kube-system"]) == []
    listed = backend.list_jobs(["Bad_Name", "default", "protein-lab"])
    assert [found.backend_id for found in listed] == [job]


# ----------------------------------------------------------- delete_finished --
def test_delete_finished_deletes_old_ended_jobs_and_keeps_the_others(api, backend):
    old_done, _ = submit(backend, "true")
    old_failed, _ = submit(backend, "exit 3")
    recent_done, _ = submit(backend, "true")
    running, _ = submit(backend, "sleep 30")
    elsewhere, _ = submit(backend, "true", account="climate-lab")  # not among the accounts asked
    wait_for_states(
        backend,
        {
            old_done: {base.JobState.COMPLETED},
            old_failed: {base.JobState.FAILED},
            recent_done: {base.JobState.COMPLETED},
            running: {base.JobState.RUNNING},
            elsewhere: {base.JobState.COMPLETED},
        },
    )
    for backend_id in (old_done, old_failed, elsewhere):
        backdate(api, backend_id, 3 * HOUR_S)
    all_jobs = {old_done, old_failed, recent_done, running, elsewhere}
    assert job_ids(api) == all_jobs

    before = len(api.requests)
    due = backend.delete_finished(["protein-lab"], older_than_s=2 * HOUR_S, dry_run=True)
    assert sorted(due) == sorted([old_done, old_failed])
    assert job_ids(api) == all_jobs  # a dry run deletes nothing
    assert [method for method, _path, _query in requests_since(api, before)] == ["GET"]

    before = len(api.requests)
    deleted = backend.delete_finished(["protein-lab"], older_than_s=2 * HOUR_S, dry_run=False)
    assert sorted(deleted) == sorted([old_done, old_failed])
    assert job_ids(api) == {recent_done, running, elsewhere}
    deletes = [(path, query) for method, path, query in requests_since(api, before) if method == "DELETE"]
    assert sorted(path for path, _query in deletes) == sorted(
        f"/apis/batch/v1/namespaces/protein-lab/jobs/{bid.split('/')[1]}" for bid in (old_done, old_failed)
    )
    assert all(query["propagationPolicy"] == "Background" for _path, query in deletes)

    def pods_of(backend_id: str) -> list[dict]:
        name = backend_id.split("/")[1]
        return [p for p in api.objects("Pod") if p["metadata"]["labels"].get("job-name") == name]

    deadline = time.monotonic() + DEADLINE_S
    while (pods_of(old_done) or pods_of(old_failed)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pods_of(old_done) == [] and pods_of(old_failed) == []  # Background: the pods went too
    assert pods_of(running) and pods_of(recent_done)

    assert backend.delete_finished(["protein-lab"], older_than_s=2 * HOUR_S, dry_run=False) == []
    assert backend.delete_finished(
        ["protein-lab", "climate-lab"], older_than_s=2 * HOUR_S, dry_run=False
    ) == [elsewhere]


def test_delete_finished_keeps_a_job_replaced_since_it_was_listed(api, backend):
    """The DELETE carries the listed Job's uid: a Job of the same name made since is not touched."""
    backend_id, _ = submit(backend, "true")
    wait_for_states(backend, {backend_id: {base.JobState.COMPLETED}})
    namespace, name = backend_id.split("/")
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-this-one"}}
    status, answer = backend.api.request("delete", "DELETE", path, body=body, allow=(409,))
    assert status == 409 and "Precondition failed" in answer["message"]
    assert job_ids(api) == {backend_id}


def test_delete_finished_with_no_accounts_or_a_bad_age(api, backend):
    before = len(api.requests)
    assert backend.delete_finished([], older_than_s=60, dry_run=False) == []
    assert requests_since(api, before) == []
    with pytest.raises(BackendError, match="invalid age"):
        backend.delete_finished(["protein-lab"], older_than_s=-1, dry_run=False)


# ------------------------------------------------------------ the others --
def test_purge_scratch_has_nothing_to_purge_and_gpu_utilization_is_not_read(api, backend):
    before = len(api.requests)
    report = backend.purge_scratch("protein-lab", older_than_days=30, dry_run=False)
    assert report == PurgeReport(deleted=[], refused={}, bytes_freed=0, dry_run=False)
    assert backend.purge_scratch("protein-lab", older_than_days=30, dry_run=True).dry_run is True
    assert backend.gpu_utilization(["protein-lab/pj-abc"]) == {}
    assert requests_since(api, before) == []
    with pytest.raises(BackendError):
        backend.purge_scratch("../etc", older_than_days=30, dry_run=False)
