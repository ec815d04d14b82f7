"""KubernetesBackend end to end against the fake API server of tests/k8s_apiserver: a real HTTP
API server with a job controller and a test kubelet that runs each container's command as a
local process. No mocks: every call goes through the official client, over HTTP, with the token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from clusters.backends import backend_for, base
from clusters.backends.base import (
    BackendError,
    BackendUnavailable,
    ClusterConfig,
    JobRef,
    JobSpec,
    TenantLimits,
)
from clusters.backends.kubernetes import KubernetesBackend, rbac
from tests.k8s_apiserver import FakeApiServer

API_TOKEN = "fake-api-token-0123456789"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
DEADLINE_S = 30


def gpu_node(name: str, product: str, gpus: int = 8) -> dict:
    return {
        "name": name,
        "labels": {"nvidia.com/gpu.product": product},
        "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "128", "memory": "1024Gi", "pods": "110"},
        "taints": [GPU_TAINT],
    }


NODES = [gpu_node("gpu-1", H100), gpu_node("gpu-2", H100), gpu_node("gpu-3", A100), {"name": "cpu-1"}]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=API_TOKEN, nodes=NODES) as server:
        yield server


def make_config(api: FakeApiServer, **overrides) -> ClusterConfig:
    values = {
        "slug": f"fake-{uuid.uuid4().hex[:8]}",
        "kind": "kubernetes",
        "k8s_api_url": api.url,
        "k8s_token": API_TOKEN,
    }
    return ClusterConfig(**(values | overrides))


@pytest.fixture
def backend(api) -> KubernetesBackend:
    backend = backend_for(make_config(api))
    assert isinstance(backend, KubernetesBackend)
    return backend


def limits(account: str = "protein-lab", gpus: int = 8, **overrides) -> TenantLimits:
    values = {
        "account": account,
        "qos": "portal-normal",
        "users": [],
        "gpus_by_type": {"h100": gpus},
        "gpu_minutes": gpus * 600,
        "k8s_resources": {"nvidia.com/gpu": gpus},
    }
    return TenantLimits(**(values | overrides))


def make_spec(script: str, **overrides) -> JobSpec:
    values = {
        "token": uuid.uuid4().hex,
        "name": "test job",
        "account": "protein-lab",
        "qos": "portal-normal",
        "priority": "normal",
        "partition": H100,
        "gpu_type": "h100",
        "k8s_resource": "nvidia.com/gpu",
        "k8s_product": H100,
        "gpus_per_node": 1,
        "nodes": 1,
        "walltime_minutes": 10,
        "script": script,
        "env": {},
        "cpus_per_gpu": 1,
        "mem_per_gpu_mb": 1000,
        "labels": {"tenant": "protein-lab", "job": "1", "scenario": "ai-training"},
    }
    return JobSpec(**(values | overrides))


def wait_for(
    backend: KubernetesBackend, backend_id: str, done: Callable[[base.JobStatus], bool]
) -> base.JobStatus:
    deadline = time.monotonic() + DEADLINE_S
    status = None
    while time.monotonic() < deadline:
        status = backend.poll([backend_id]).get(backend_id)
        if status is not None and done(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"{backend_id}: still {status} after {DEADLINE_S}s")


def ended(status: base.JobStatus) -> bool:
    return status.state in base.END_STATES


def writes(requests) -> list:
    return [r for r in requests if r[0] != "GET"]


# ------------------------------------------------------------------ tenant --
def test_apply_tenant_creates_and_is_idempotent(api, backend):
    backend.apply_tenant(limits())
    namespaces = {n["metadata"]["name"]: n for n in api.objects("Namespace")}
    labels = namespaces["protein-lab"]["metadata"]["labels"]
    assert (
        labels["gpu-portal/tenant"] == "protein-lab"
        and labels["app.kubernetes.io/managed-by"] == "gpu-portal"
    )
    (quota,) = api.objects("ResourceQuota")
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "8"
    assert quota["spec"]["hard"]["count/jobs.batch"] == "500"
    (limit_range,) = api.objects("LimitRange")
    assert limit_range["spec"]["limits"][0]["max"]["nvidia.com/gpu"] == "8"
    assert sorted(pc["metadata"]["name"] for pc in api.objects("PriorityClass")) == [
        "portal-borrow",
        "portal-critical",
        "portal-high",
        "portal-low",
        "portal-normal",
    ]
    (policy,) = api.objects("NetworkPolicy")
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {}}]}]
    (claim,) = api.objects("PersistentVolumeClaim")
    assert (claim["metadata"]["name"], claim["spec"]["accessModes"]) == ("portal-scratch", ["ReadWriteMany"])
    assert api.objects("LocalQueue") == []

    before = len(api.requests)
    backend.apply_tenant(limits())
    second = api.requests[before:]
    assert writes(second) == []  # reads only
    assert len(second) == 10  # 5 PriorityClasses, namespace, quota, limit range, network policy, claim

    before = len(api.requests)
    backend.apply_tenant(limits(gpus=4))  # a smaller grant: the quota and limit range follow
    assert sorted(path.rsplit("/", 2)[1] for method, path, _q in writes(api.requests[before:])) == [
        "limitranges",
        "resourcequotas",
    ]
    (quota,) = api.objects("ResourceQuota")
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "4"


def test_apply_tenant_with_kueue(api):
    backend = backend_for(make_config(api, uses_kueue=True, k8s_kueue_cluster_queue="gpu-pool"))
    backend.apply_tenant(limits())
    (queue,) = api.objects("LocalQueue")
    assert queue["metadata"]["namespace"] == "protein-lab" and queue["spec"] == {"clusterQueue": "gpu-pool"}

    spec = make_spec("echo never")
    backend_id = backend.submit(spec)
    (job,) = api.objects("Job")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "portal"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "portal-normal"
    status = backend.poll([backend_id])[backend_id]  # no Kueue here to admit it
    assert (status.state, status.raw_state) == (base.JobState.PENDING, "Suspended")


def test_a_namespace_the_portal_does_not_own_is_left_alone(api, backend):
    backend.api.request("create", "POST", "/api/v1/namespaces", body={"metadata": {"name": "monitoring"}})
    with pytest.raises(BackendError, match="not the portal's"):
        backend.apply_tenant(limits(account="monitoring"))
    assert api.objects("ResourceQuota") == []


# -------------------------------------------------------------------- jobs --
def test_submit_poll_completed_with_log(api, backend):
    backend.apply_tenant(limits())
    spec = make_spec('for i in $(seq 1 5); do echo "line $i"; done\necho "gpus=$GPUS"', env={"GPUS": "1"})
    backend_id = backend.submit(spec)
    assert backend_id == f"protein-lab/pj-{spec.token}"
    status = wait_for(backend, backend_id, ended)
    assert (status.state, status.raw_state, status.exit_code) == (base.JobState.COMPLETED, "Complete", 0)
    assert status.started_at is not None and status.finished_at is not None
    ref = JobRef(backend_id=backend_id, token=spec.token, account="protein-lab")
    tail = backend.log_tail(ref, lines=3, max_bytes=10_000)
    assert tail.lines == ["line 4", "line 5", "gpus=1"] and tail.truncated
    assert backend.log_tail(ref, lines=50, max_bytes=10_000) == base.LogTail(
        lines=[f"line {i}" for i in range(1, 6)] + ["gpus=1"], truncated=False
    )
    (job,) = api.objects("Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": H100}
    assert job["spec"]["ttlSecondsAfterFinished"] == 86_400


def test_the_script_and_env_reach_the_shell_as_written(api, backend):
    backend.apply_tenant(limits())
    env = {"SEMI": "a; echo injected", "SUBST": "$(echo injected)", "TICKS": "`echo injected`", "NL": "x\ny"}
    script = (
        'printf "[%s]\\n" "$SEMI" "$SUBST" "$TICKS" "$NL"\necho "$$" | grep -qE "^[0-9]+$" && echo pid-ok'
    )
    spec = make_spec(script, env=env)
    backend_id = backend.submit(spec)
    assert wait_for(backend, backend_id, ended).state == base.JobState.COMPLETED
    ref = JobRef(backend_id=backend_id, token=spec.token, account="protein-lab")
    lines = backend.log_tail(ref, lines=20, max_bytes=10_000).lines
    assert lines == ["[a; echo injected]", "[$(echo injected)]", "[`echo injected`]", "[x", "y]", "pid-ok"]


def test_failing_script_is_failed_with_its_exit_code(api, backend):
    backend.apply_tenant(limits())
    backend_id = backend.submit(make_spec("echo about to fail\nexit 3"))
    status = wait_for(backend, backend_id, ended)
    assert (status.state, status.raw_state, status.exit_code) == (
        base.JobState.FAILED,
        "BackoffLimitExceeded",
        3,
    )


def test_cancel_deletes_foreground_and_reports_cancelled(api, backend):
    backend.apply_tenant(limits())
    spec = make_spec("trap 'sleep 1; exit 143' TERM\nsleep 300 &\nwait")
    backend_id = backend.submit(spec)
    assert wait_for(backend, backend_id, lambda s: s.state == base.JobState.RUNNING).node_list in (
        "gpu-1",
        "gpu-2",
    )
    before = len(api.requests)
    backend.cancel(backend_id)
    (delete,) = writes(api.requests[before:])
    assert delete[0] == "DELETE" and delete[1].endswith(f"/namespaces/protein-lab/jobs/pj-{spec.token}")
    assert delete[2]["propagationPolicy"] == "Foreground"
    status = backend.poll([backend_id])[backend_id]  # its pod is still stopping
    assert (status.state, status.raw_state) == (base.JobState.CANCELLED, "Deleting")
    deadline = time.monotonic() + DEADLINE_S
    while backend.poll([backend_id]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.poll([backend_id]) == {}  # gone: left out, as the interface says
    assert api.objects("Job") == [] and api.objects("Pod") == []
    backend.cancel(backend_id)  # again: nothing to delete, no error


def test_walltime_is_timeout(api, backend):
    backend.apply_tenant(limits())
    backend_id = backend.submit(make_spec("sleep 300", walltime_minutes=1))
    (job,) = api.objects("Job")
    assert job["spec"]["activeDeadlineSeconds"] == 60
    # a minute is long for a test: shorten the deadline as an admin could (the field is mutable)
    job_path = f"/apis/batch/v1/namespaces/protein-lab/jobs/{job['metadata']['name']}"
    # Read, change, write as kubectl edit does: the controller may update the Job between the
    # read and the write (its status), which the server refuses with 409; then read again.
    for _ in range(10):
        _status, current = backend.api.request("read", "GET", job_path)
        current["spec"]["activeDeadlineSeconds"] = 1
        written, _ = backend.api.request("update", "PUT", job_path, body=current, allow=(409,))
        if written == 200:
            break
    assert written == 200
    status = wait_for(backend, backend_id, ended)
    assert (status.state, status.raw_state) == (base.JobState.TIMEOUT, "DeadlineExceeded")


def test_a_retried_submit_adopts_the_job(api, backend):
    backend.apply_tenant(limits())
    spec = make_spec("sleep 1")
    first = backend.submit(spec)
    before = len(api.requests)
    assert backend.submit(spec) == first
    assert [r[0] for r in api.requests[before:]] == ["POST", "GET"]  # 409, then read it
    assert len(api.objects("Job")) == 1
    assert backend.find(spec.token) == first
    assert backend.find(uuid.uuid4().hex) is None


def test_multinode_job_is_indexed_with_a_rendezvous_service(api, backend):
    backend.apply_tenant(limits(gpus=16))
    spec = make_spec('echo "rank=$JOB_COMPLETION_INDEX host=$PORTAL_RDZV_HOST"', nodes=2, gpus_per_node=8)
    backend_id = backend.submit(spec)
    (service,) = api.objects("Service")
    (job,) = api.objects("Job")
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    status = wait_for(backend, backend_id, ended)
    assert status.state == base.JobState.COMPLETED
    tail = backend.log_tail(JobRef(backend_id, spec.token, "protein-lab"), lines=5, max_bytes=1000)
    name = f"pj-{spec.token}"
    assert tail.lines == [f"rank=0 host={name}-0.{name}.protein-lab.svc"]
    # a retry after the Service was lost: find() puts it back
    backend.api.request("delete", "DELETE", f"/api/v1/namespaces/protein-lab/services/{name}")
    assert backend.find(spec.token) == backend_id
    assert len(api.objects("Service")) == 1


def test_quota_exceeded_is_pending_with_the_reason(api, backend):
    backend.apply_tenant(limits(gpus=4))
    backend_id = backend.submit(make_spec("echo hi", gpus_per_node=8))
    status = wait_for(backend, backend_id, lambda s: s.reason == "ExceededQuota")
    assert (status.state, status.raw_state) == (base.JobState.PENDING, "FailedCreate")


def test_poll_is_a_constant_number_of_calls(api, backend):
    backend.apply_tenant(limits(gpus=64))
    backend.apply_tenant(limits(account="other-team", gpus=64))
    ids = [
        backend.submit(make_spec("sleep 20", account="protein-lab" if i % 2 else "other-team"))
        for i in range(50)
    ]
    wait_for(backend, ids[0], lambda s: s.state == base.JobState.RUNNING)

    def calls(backend_ids: list[str]) -> list:
        before = len(api.requests)
        statuses = backend.poll(backend_ids)
        assert set(statuses) == set(backend_ids)
        return api.requests[before:]

    many, one = calls(ids), calls(ids[:1])
    assert len(many) <= 3 and len(one) <= 3
    assert [r[1] for r in many].count("/apis/batch/v1/jobs") == 1  # one Jobs list, all namespaces
    assert {(method, path) for method, path, _query in many} <= {
        ("GET", "/apis/batch/v1/jobs"),
        ("GET", "/api/v1/pods"),
        ("GET", "/api/v1/events"),
    }
    assert all(query.get("labelSelector") or query.get("fieldSelector") for _m, _p, query in many)
    for backend_id in ids:
        backend.cancel(backend_id)


def test_log_tail_is_bounded_in_bytes(api, backend):
    backend.apply_tenant(limits())
    spec = make_spec(
        'for i in $(seq 100 199); do printf "%s %s\\n" "$i" "$(printf "x%.0s" $(seq 1 46))"; done'
    )
    backend_id = backend.submit(spec)
    assert wait_for(backend, backend_id, ended).state == base.JobState.COMPLETED
    ref = JobRef(backend_id, spec.token, "protein-lab")
    tail = backend.log_tail(ref, lines=10, max_bytes=10_000)
    assert [line[:3] for line in tail.lines] == [str(i) for i in range(190, 200)] and tail.truncated
    small = backend.log_tail(ref, lines=10, max_bytes=120)  # 51-byte lines: two fit
    assert small.truncated and sum(len(line) + 1 for line in small.lines) <= 120
    assert [line[:3] for line in small.lines] == ["198", "199"]
    assert backend.log_tail(ref, lines=0, max_bytes=1000) == base.LogTail(lines=[], truncated=False)
    gone = JobRef(f"protein-lab/pj-{uuid.uuid4().hex}", "x", "protein-lab")
    assert backend.log_tail(gone, lines=5, max_bytes=100).lines == []


# ----------------------------------------------------------------- cluster --
def test_inventory_by_gpu_product(api, backend):
    backend.apply_tenant(limits())
    backend_id = backend.submit(make_spec("sleep 20", gpus_per_node=4))
    wait_for(backend, backend_id, lambda s: s.state == base.JobState.RUNNING)
    partitions = {p.name: p for p in backend.inventory()}
    assert set(partitions) == {H100, A100}
    assert (partitions[H100].nodes, partitions[H100].gpus_per_node, partitions[H100].gpus_free) == (2, 8, 12)
    assert (partitions[A100].nodes, partitions[A100].gpus_free) == (1, 8)
    backend.cancel(backend_id)


def test_health_and_credentials(api, backend):
    health = backend.health()
    assert health.healthy and health.detail.startswith("Kubernetes v")
    wrong = backend_for(make_config(api, k8s_token="not-the-token"))
    health = wrong.health()
    assert not health.healthy and "401" in health.detail and "not-the-token" not in health.detail
    with pytest.raises(BackendUnavailable):
        wrong.poll([f"protein-lab/pj-{uuid.uuid4().hex}"])
    with pytest.raises(BackendError):
        backend.submit(make_spec("echo no namespace", account="nowhere"))


def test_bad_input_never_reaches_the_api(api, backend):
    before = len(api.requests)
    with pytest.raises(BackendError):
        backend.submit(make_spec("echo", env={"BAD NAME": "1"}))
    with pytest.raises(BackendError):
        backend.poll(["kube-system/pj-0123"])
    with pytest.raises(BackendError):
        backend.cancel("protein-lab/../../x")
    with pytest.raises(BackendError):
        backend.apply_tenant(replace(limits(), account="kube-system"))
    assert api.requests[before:] == []


def rbac_request(method: str, path: str) -> tuple[str, str, str]:
    """(API group, resource, verb) of a REST request, as RBAC sees it."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verb = {"POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}.get(method)
    return group, resource, verb or ("get" if len(rest) > 1 else "list")


def test_the_cluster_role_covers_every_call(api):
    """Every request the backend makes, in every operation, is allowed by the ClusterRole of the README."""
    backend = backend_for(make_config(api, uses_kueue=True))
    lending = {"cohort": "h100-pool", "k8s_lending": {"nvidia.com/gpu": 4}}
    backend.apply_tenant(limits(gpus=16, **lending))  # its own ClusterQueue, in the cohort
    backend.apply_tenant(limits(gpus=8, **lending))  # updates too
    spec = make_spec("sleep 20", nodes=2, gpus_per_node=2)
    backend_id = backend.submit(spec)
    backend.submit(spec)
    backend.find(spec.token)
    over_quota = backend.submit(make_spec("echo", gpus_per_node=8))
    warned = backend.submit(make_spec("sleep 20", preemptible=True, grace_s=1, checkpoint_key="run-1"))
    test_made = len(api.requests)
    for name in (f"pj-{spec.token}", over_quota.split("/")[1], warned.split("/")[1]):  # admit, as Kueue would
        job_path = f"/apis/batch/v1/namespaces/protein-lab/jobs/{name}"
        job = backend.api.request("read", "GET", job_path)[1]
        backend.api.request("admit", "PUT", job_path, body=job | {"spec": job["spec"] | {"suspend": False}})
    del api.requests[test_made:]
    wait_for(backend, backend_id, lambda s: s.state == base.JobState.RUNNING)
    assert wait_for(backend, over_quota, lambda s: s.reason == "ExceededQuota").state == base.JobState.PENDING
    backend.poll([backend_id, over_quota, f"other-team/pj-{uuid.uuid4().hex}"])
    assert backend.log_tail(JobRef(backend_id, spec.token, "protein-lab"), lines=5, max_bytes=100).lines == []
    backend.inventory()
    assert backend.health().healthy
    wait_for(backend, warned, lambda s: s.state == base.JobState.RUNNING)
    backend.warn(warned, grace_s=1)
    backend.cancel(backend_id)
    backend.apply_tenant(limits(gpus=8))  # out of the cohort: LocalQueue made again, ClusterQueue deleted
    assert (
        api.objects("ClusterQueue") == [] and api.objects("LocalQueue")[0]["spec"]["clusterQueue"] == "portal"
    )
    rules = rbac.cluster_role_manifest()["rules"]
    allowed = {
        (group, resource, verb)
        for rule in rules
        if "apiGroups" in rule
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    urls = {url for rule in rules for url in rule.get("nonResourceURLs", [])}
    used = set()
    for method, path, _query in api.requests:
        if path in ("/version", "/readyz"):
            assert path in urls
            continue
        used.add(rbac_request(method, path))
    assert used <= allowed, used - allowed
    assert {verb for _g, _r, verb in used} <= {"get", "list", "create", "update", "delete"}
    # nothing granted that no call needs (the Kueue WorkloadPriorityClass calls aside: the fake serves none)
    assert allowed - used <= {
        ("kueue.x-k8s.io", "workloadpriorityclasses", verb) for verb in ("get", "create", "update")
    } | {
        ("", "namespaces", "update"),
        ("scheduling.k8s.io", "priorityclasses", "update"),
        ("networking.k8s.io", "networkpolicies", "update"),
        ("kueue.x-k8s.io", "localqueues", "update"),
        ("kueue.x-k8s.io", "resourceflavors", "update"),
    }
