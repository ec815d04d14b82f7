"""The Slurm end-to-end scenarios, on Kubernetes: the API, a real Celery worker on Redis, and the
Kubernetes backend over HTTP to the API server of tests/k8s_apiserver (whose kubelet runs each
container's command as a local process)."""

import time
from collections.abc import Iterator

import pytest

from clusters.models import Cluster
from tenants.limits import tenant_apply
from tenants.models import QuotaGrant
from tests.factories import ClusterFactory, PartitionFactory
from tests.jobs_support import api_submit, follow
from tests.k8s_apiserver import FakeApiServer

TOKEN = "e2e-token-0123456789abcdef"
H100 = "NVIDIA-H100-80GB-HBM3"
NODES = [
    {
        "name": f"gpu-{n}",
        "labels": {"nvidia.com/gpu.product": H100},
        "capacity": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1024Gi", "pods": "110"},
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    }
    for n in (1, 2)
]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=TOKEN, nodes=NODES) as server:
        yield server


@pytest.fixture
def k8s(transactional_db, api, catalog, tenant, grant) -> Cluster:
    """A Kubernetes cluster with an H100 node pool, and the tenant's namespace applied."""
    cluster = ClusterFactory(
        slug="k8s", name="Kubernetes", kind="kubernetes", k8s_api_url=api.url, k8s_token=TOKEN, healthy=True
    )
    PartitionFactory(
        cluster=cluster, name=H100, gpu_model=catalog[1], nodes=2, max_cpus_per_gpu=1, max_mem_per_gpu_mb=1000
    )
    tenant_apply(tenant_id=tenant.pk, cluster_id=cluster.pk)
    return cluster


def submit(client, **fields) -> dict:
    pod = {
        "cluster": "k8s",
        "name": "e2e",
        "script": "#!/bin/bash\necho hello from pod $JOB_COMPLETION_INDEX\n",
    }
    return api_submit(client, **pod | fields)


def test_a_job_completes_with_its_log_and_gpu_hours(celery_worker, client_for, member, k8s, api):
    client = client_for(member)
    job = submit(client)
    done = follow(client, job["id"], k8s.pk, {"COMPLETED", "FAILED", "REJECTED"})
    assert (done["state"], done["exit_code"]) == ("COMPLETED", 0), done
    assert done["backend_id"] == f"protein-lab/pj-{done['backend_id'].split('/pj-')[1]}"
    assert done["gpu_hours"] is not None
    assert "hello from pod" in client.get(f"/api/v1/jobs/{job['id']}/log/").json()["lines"][0]
    states = [e["to_state"] for e in client.get(f"/api/v1/jobs/{job['id']}/events/").json()]
    assert states[:3] == ["QUEUED", "SUBMITTING", "PENDING"] and states[-1] == "COMPLETED"
    grant = QuotaGrant.objects.get()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)


def test_a_failing_script_ends_failed_with_its_exit_code(celery_worker, client_for, member, k8s):
    client = client_for(member)
    job = submit(client, script="#!/bin/bash\nexit 3\n")
    done = follow(client, job["id"], k8s.pk, {"COMPLETED", "FAILED", "REJECTED"})
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)


def test_cancel_deletes_the_job(celery_worker, client_for, member, k8s, api):
    client = client_for(member)
    job = submit(client, script="#!/bin/bash\nsleep 120\n")
    running = follow(client, job["id"], k8s.pk, {"RUNNING"})  # the submit answer may predate dispatch
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel/").status_code == 202
    follow(client, job["id"], k8s.pk, {"CANCELLED"}, timeout_s=30)
    # CANCELLED as soon as a poll sees the deletion begin; the Job goes once its pods have ended
    name = running["backend_id"].split("/")[1]
    deadline = time.monotonic() + 30
    while [j for j in api.objects("Job") if j["metadata"]["name"] == name] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [j for j in api.objects("Job") if j["metadata"]["name"] == name]


def test_walltime_ends_in_timeout(celery_worker, client_for, member, k8s):
    client = client_for(member)
    job = submit(client, walltime_minutes=1, script="#!/bin/bash\nsleep 600\n")
    done = follow(client, job["id"], k8s.pk, {"TIMEOUT", "FAILED", "COMPLETED"}, timeout_s=120)
    assert done["state"] == "TIMEOUT"
