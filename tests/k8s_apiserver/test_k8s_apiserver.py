"""The fake Kubernetes API server (tests/k8s_apiserver), driven by the official kubernetes client.

These pin down what the Kubernetes backend's tests rely on: real status codes and Status bodies, label/field
selectors, patches and server-side apply, and a job controller + kubelet that really run the container's script.
"""

from __future__ import annotations

import json
import re
import threading
import time
from types import SimpleNamespace

import pytest
from kubernetes import client

from tests.k8s_apiserver import FakeApiServer
from tests.wait_support import wait_until

TOKEN = "t0k"
NODES = [
    {"name": "cpu-1", "labels": {"node-role": "cpu"}},
    {
        "name": "gpu-1",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    },
]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def api():
    with FakeApiServer(token=TOKEN, nodes=NODES) as server:
        yield server
        assert server.cluster.errors == []


@pytest.fixture
def k8s(api):
    config = client.Configuration(
        host=api.url, api_key={"authorization": TOKEN}, api_key_prefix={"authorization": "Bearer"}
    )
    with client.ApiClient(config) as api_client:
        yield SimpleNamespace(
            core=client.CoreV1Api(api_client),
            batch=client.BatchV1Api(api_client),
            custom=client.CustomObjectsApi(api_client),
            scheduling=client.SchedulingV1Api(api_client),
            networking=client.NetworkingV1Api(api_client),
        )


@pytest.fixture
def ns(k8s):
    k8s.core.create_namespace({"metadata": {"name": "team-a"}})
    return "team-a"


def wait_for(probe, timeout_s: float = 10.0, what: str = "condition"):
    """wait_until, every 50 ms: the fake's controller and kubelet are quick."""
    return wait_until(probe, timeout_s=timeout_s, interval_s=0.05, what=what)


def job_body(name: str, script: str, *, env=None, resources=None, annotations=None, **spec) -> dict:
    container = {"name": "main", "image": "ignored:latest", "command": ["/bin/bash", "-c", script]}
    container |= {"env": env} if env else {}
    container |= {"resources": resources} if resources else {}
    template = {
        "metadata": {"annotations": annotations or {}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "portal"}},
        "spec": {"backoffLimit": 0, "template": template} | spec,
    }


def pod_body(name: str, script: str, *, annotations=None, limits=None, **spec) -> dict:
    container = {"name": "c", "image": "x", "command": ["/bin/bash", "-c", script]}
    container |= {"resources": {"limits": limits}} if limits else {}
    metadata = {"name": name, "annotations": annotations or {}}
    return {"metadata": metadata, "spec": {"restartPolicy": "Never", "containers": [container]} | spec}


def job_condition(k8s, ns: str, name: str):
    conditions = k8s.batch.read_namespaced_job(name, ns).status.conditions or []
    return next((c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)


def job_pods(k8s, ns: str, name: str):
    return k8s.core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items


def status_of(exc: client.ApiException) -> dict:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == exc.status
    return body


def alive(pid: int) -> bool:
    """Whether the process runs; an exited one that its (new) parent has not reaped yet counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------------ API surface --
def test_version_readyz_and_bearer_auth(api, k8s):
    assert client.VersionApi(k8s.core.api_client).get_code().git_version == "v1.31.0"
    for config in (
        client.Configuration(host=api.url),
        client.Configuration(host=api.url, api_key={"authorization": "Bearer nope"}),
    ):
        with client.ApiClient(config) as anonymous, pytest.raises(client.ApiException) as caught:
            client.CoreV1Api(anonymous).list_namespaced_pod("default")
        assert caught.value.status == 401
        assert status_of(caught.value) == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }
    raw = k8s.core.api_client.rest_client.pool_manager.request(
        "GET", f"{api.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert (raw.status, raw.data) == (200, b"ok")


def test_create_get_list_by_label_replace_patch_delete(api, k8s, ns):
    for name, labels in [("web", {"app": "a", "tier": "web"}), ("db", {"app": "a"}), ("cache", {"app": "b"})]:
        created = k8s.core.create_namespaced_service(
            ns, {"metadata": {"name": name, "labels": labels}, "spec": {"ports": [{"port": 80}]}}
        )
        assert (
            created.metadata.uid and created.metadata.namespace == ns and created.metadata.creation_timestamp
        )
    web = k8s.core.read_namespaced_service("web", ns)
    assert (web.kind, web.api_version, web.metadata.labels) == ("Service", "v1", {"app": "a", "tier": "web"})

    def names(**selectors):
        listed = k8s.core.list_namespaced_service(ns, **selectors)
        assert listed.kind == "ServiceList" and int(listed.metadata.resource_version) > 0
        return sorted(s.metadata.name for s in listed.items)

    assert names(label_selector="app=a") == ["db", "web"]
    assert names(label_selector="app!=a") == ["cache"]
    assert names(label_selector="tier") == ["web"]
    assert names(label_selector="app=a,!tier") == ["db"]
    assert names(label_selector="app==a,tier=web") == ["web"]
    assert names(field_selector="metadata.name=cache") == ["cache"]
    assert [
        s.metadata.name for s in k8s.core.list_service_for_all_namespaces(label_selector="app=b").items
    ] == ["cache"]

    web.metadata.labels["tier"] = "frontend"
    replaced = k8s.core.replace_namespaced_service("web", ns, web)
    assert replaced.metadata.labels["tier"] == "frontend"
    assert int(replaced.metadata.resource_version) > int(web.metadata.resource_version)
    web.metadata.labels["tier"] = "stale"  # replace with an old resourceVersion: 409 Conflict
    with pytest.raises(client.ApiException) as caught:
        k8s.core.replace_namespaced_service("web", ns, web)
    assert (caught.value.status, status_of(caught.value)["reason"]) == (409, "Conflict")

    patched = k8s.core.patch_namespaced_service(
        "db", ns, {"metadata": {"labels": {"app": None, "owner": "x"}}}
    )
    assert patched.metadata.labels == {"owner": "x"}  # strategic merge by default; null deletes
    merged = k8s.core.patch_namespaced_service(
        "db", ns, {"metadata": {"annotations": {"a": "1"}}}, _content_type="application/merge-patch+json"
    )
    assert merged.metadata.annotations == {"a": "1"} and merged.metadata.labels == {"owner": "x"}

    # DELETE of a service answers with the service (of a job, network policy...: a Status)
    assert k8s.core.delete_namespaced_service("cache", ns).metadata.name == "cache"
    with pytest.raises(client.ApiException) as caught:
        k8s.core.read_namespaced_service("cache", ns)
    assert caught.value.status == 404
    assert [o["metadata"]["name"] for o in api.objects("Service")] == ["db", "web"]


def test_server_side_apply_creates_merges_and_reports_conflicts(api, k8s, ns):
    apply = {"_content_type": "application/apply-patch+yaml"}
    body = job_body("sa", "true", suspend=True)
    created = k8s.batch.patch_namespaced_job("sa", ns, body, field_manager="gpu-portal", **apply)
    assert created.metadata.labels == {"app": "portal"} and created.spec.suspend is True
    assert api.requests[-1] == (
        "PATCH",
        f"/apis/batch/v1/namespaces/{ns}/jobs/sa",
        {"fieldManager": "gpu-portal"},
    )
    again = k8s.batch.patch_namespaced_job(
        "sa", ns, {"metadata": {"labels": {"team": "a"}}}, field_manager="gpu-portal", **apply
    )
    assert again.metadata.labels == {"app": "portal", "team": "a"}
    with pytest.raises(client.ApiException) as caught:  # another manager changing an owned field
        k8s.batch.patch_namespaced_job(
            "sa", ns, {"metadata": {"labels": {"team": "b"}}}, field_manager="other", **apply
        )
    conflict = status_of(caught.value)
    assert (caught.value.status, conflict["reason"]) == (409, "Conflict")
    assert (
        conflict["message"]
        == 'Apply failed with 1 conflict: conflict with "gpu-portal" using batch/v1: .metadata.labels.team'
    )
    forced = k8s.batch.patch_namespaced_job(
        "sa", ns, {"metadata": {"labels": {"team": "b"}}}, field_manager="other", force=True, **apply
    )
    assert forced.metadata.labels["team"] == "b"
    assert api.requests[-1][2] == {"fieldManager": "other", "force": "true"}
    with pytest.raises(client.ApiException) as caught:
        k8s.batch.patch_namespaced_job("sa", ns, {"metadata": {"labels": {"x": "y"}}}, **apply)
    assert (caught.value.status, status_of(caught.value)["reason"]) == (422, "Invalid")
    assert k8s.batch.list_namespaced_job(ns).items[0].status.active is None  # suspended: no pods
    assert job_pods(k8s, ns, "sa") == []


def test_errors_are_kubernetes_status_objects(k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("dup", "true"))
    cases = [
        (
            lambda: k8s.batch.create_namespaced_job(ns, job_body("dup", "true")),
            409,
            "AlreadyExists",
            'jobs.batch "dup" already exists',
            {"name": "dup", "group": "batch", "kind": "jobs"},
        ),
        (
            lambda: k8s.batch.read_namespaced_job("nope", ns),
            404,
            "NotFound",
            'jobs.batch "nope" not found',
            {"name": "nope", "group": "batch", "kind": "jobs"},
        ),
        (
            lambda: k8s.core.read_namespaced_pod("nope", ns),
            404,
            "NotFound",
            'pods "nope" not found',
            {"name": "nope", "kind": "pods"},
        ),
        (
            lambda: k8s.batch.create_namespaced_job("missing-ns", job_body("j", "true")),
            404,
            "NotFound",
            'namespaces "missing-ns" not found',
            {"name": "missing-ns", "kind": "namespaces"},
        ),
    ]
    for call, code, reason, message, details in cases:
        with pytest.raises(client.ApiException) as caught:
            call()
        body = status_of(caught.value)
        assert (caught.value.status, body["reason"], body["message"], body["details"]) == (
            code,
            reason,
            message,
            details,
        )
    with pytest.raises(client.ApiException) as caught:
        k8s.batch.create_namespaced_job(ns, job_body("Bad_Name", "true"))
    body = status_of(caught.value)
    assert (caught.value.status, body["reason"], body["details"]["kind"]) == (422, "Invalid", "Job")
    assert body["message"].startswith(
        'Job.batch "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
        "a lowercase RFC 1123 subdomain must consist of"
    )
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespace({"metadata": {"name": "a.b"}})  # namespaces are DNS-1123 labels
    assert "a lowercase RFC 1123 label must consist of" in status_of(caught.value)["message"]


def test_all_namespace_lists_and_a_poll_is_one_list_call(api, k8s, ns):
    k8s.core.create_namespace({"metadata": {"name": "team-b"}})
    for namespace in (ns, "team-b"):
        k8s.batch.create_namespaced_job(namespace, job_body("j", "echo hi"))
    wait_for(lambda: all(job_condition(k8s, n, "j") for n in (ns, "team-b")), what="both jobs finished")
    before = len(api.requests)
    jobs = k8s.batch.list_job_for_all_namespaces(label_selector="app=portal").items
    assert sorted(j.metadata.namespace for j in jobs) == [ns, "team-b"]
    assert api.requests[before:] == [("GET", "/apis/batch/v1/jobs", {"labelSelector": "app=portal"})]
    pods = k8s.core.list_pod_for_all_namespaces(
        label_selector="job-name=j", field_selector="status.phase=Succeeded"
    )
    assert len(pods.items) == 2 and api.requests[-1][1] == "/api/v1/pods"
    page = k8s.core.list_pod_for_all_namespaces(limit=1)
    assert len(page.items) == 1 and page.metadata._continue
    assert len(k8s.core.list_pod_for_all_namespaces(limit=1, _continue=page.metadata._continue).items) == 1


def test_other_resources_the_backend_manages(k8s, ns):
    k8s.core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "q"}, "spec": {"hard": {"requests.cpu": "4"}}}
    )
    k8s.core.create_namespaced_limit_range(
        ns, {"metadata": {"name": "lr"}, "spec": {"limits": [{"type": "Container"}]}}
    )
    k8s.scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    k8s.networking.create_namespaced_network_policy(
        ns, {"metadata": {"name": "deny"}, "spec": {"podSelector": {}}}
    )
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "lq", "labels": {"t": "a"}},
        "spec": {"clusterQueue": "cq"},
    }
    kueue = ("kueue.x-k8s.io", "v1beta1", ns, "localqueues")
    assert k8s.custom.create_namespaced_custom_object(*kueue, queue)["metadata"]["uid"]
    listed = k8s.custom.list_namespaced_custom_object(*kueue, label_selector="t=a")
    assert listed["kind"] == "LocalQueueList" and [q["spec"]["clusterQueue"] for q in listed["items"]] == [
        "cq"
    ]
    assert k8s.custom.get_namespaced_custom_object(*kueue, "lq")["kind"] == "LocalQueue"
    k8s.custom.patch_namespaced_custom_object(*kueue, "lq", {"spec": {"clusterQueue": "cq2"}})
    assert k8s.custom.get_namespaced_custom_object(*kueue, "lq")["spec"]["clusterQueue"] == "cq2"
    assert k8s.scheduling.read_priority_class("high").value == 1000
    assert wait_for(lambda: k8s.core.read_namespaced_resource_quota("q", ns).status).used == {
        "requests.cpu": "0"
    }
    nodes = {n.metadata.name: n for n in k8s.core.list_node().items}
    assert nodes["gpu-1"].status.allocatable["nvidia.com/gpu"] == "8"
    assert nodes["gpu-1"].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert k8s.networking.delete_namespaced_network_policy("deny", ns)["status"] == "Success"
    k8s.custom.delete_namespaced_custom_object(*kueue, "lq")
    assert k8s.custom.list_namespaced_custom_object(*kueue)["items"] == []


# ---------------------------------------------------------------------------- job controller/kubelet --
def test_failing_script_fails_the_job_with_its_exit_code_and_log(api, k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("fail", "echo hi; echo oops >&2; exit 3"))
    condition = wait_for(lambda: job_condition(k8s, ns, "fail"), what="job finished")
    assert (condition.type, condition.reason) == ("Failed", "BackoffLimitExceeded")
    job = k8s.batch.read_namespaced_job("fail", ns)
    assert (job.status.failed, job.status.succeeded, job.status.active) == (1, None, None)
    [pod] = job_pods(k8s, ns, "fail")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 3, "Error")
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns) == "hi\noops\n"
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, container="main", tail_lines=1) == "oops\n"
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, limit_bytes=2) == "hi"
    with pytest.raises(client.ApiException) as caught:
        k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, container="nope")
    assert caught.value.status == 400
    assert pod.metadata.owner_references[0].kind == "Job" and pod.spec.node_name == "cpu-1"


def test_job_completes_and_records_events(k8s, ns):
    env = [{"name": "GREETING", "value": "hello"}, {"name": "TWICE", "value": "$(GREETING) $(GREETING)"}]
    k8s.batch.create_namespaced_job(ns, job_body("ok", 'echo "$TWICE"', env=env))
    condition = wait_for(lambda: job_condition(k8s, ns, "ok"), what="job finished")
    assert (condition.type, condition.reason) == ("Complete", "CompletionsReached")
    job = k8s.batch.read_namespaced_job("ok", ns)
    assert job.status.succeeded == 1 and job.status.completion_time and job.status.start_time
    [pod] = job_pods(k8s, ns, "ok")
    assert pod.status.container_statuses[0].state.terminated.reason == "Completed"
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns) == "hello hello\n"
    events = k8s.core.list_namespaced_event(ns, field_selector="involvedObject.name=ok").items
    assert {(e.reason, e.type) for e in events} == {("SuccessfulCreate", "Normal"), ("Completed", "Normal")}


def test_active_deadline_exceeded_kills_the_process(k8s, ns):
    k8s.batch.create_namespaced_job(
        ns, job_body("slow", "sleep 60 & echo $!; wait", active_deadline_seconds=1)
    )
    pod = wait_for(
        lambda: [p for p in job_pods(k8s, ns, "slow") if p.status.phase == "Running"], what="pod running"
    )[0]
    pid = int(
        wait_for(lambda: k8s.core.read_namespaced_pod_log(pod.metadata.name, ns).strip(), what="pid in log")
    )
    assert alive(pid)
    condition = wait_for(lambda: job_condition(k8s, ns, "slow"), what="job failed")
    assert (condition.type, condition.reason) == ("Failed", "DeadlineExceeded")
    assert condition.message == "Job was active longer than specified deadline"
    wait_for(lambda: not alive(pid), what="sleep killed")
    wait_for(lambda: job_pods(k8s, ns, "slow") == [], what="pods deleted")


def test_quota_refuses_the_third_gpu_pod_until_one_finishes(api, k8s, ns, tmp_path):
    k8s.core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}
    )
    script = f'until [ -e "{tmp_path}/$HOSTNAME.go" ]; do sleep 0.05; done'
    body = job_body("q", script, parallelism=3, completions=3, resources={"limits": {"nvidia.com/gpu": "1"}})
    body["spec"]["template"]["spec"]["tolerations"] = [GPU_TOLERATION]
    k8s.batch.create_namespaced_job(ns, body)

    def running():
        return sorted(p.metadata.name for p in job_pods(k8s, ns, "q") if p.status.phase == "Running")

    first_two = wait_for(lambda: len(running()) == 2 and running(), what="two pods running")
    refused = wait_for(
        lambda: [e for e in k8s.core.list_namespaced_event(ns).items if e.reason == "FailedCreate"]
    )
    assert refused[0].type == "Warning" and refused[0].involved_object.name == "q"
    assert re.fullmatch(
        r'Error creating: pods "q-[a-z0-9]{5}" is forbidden: exceeded quota: gpu-quota, requested: '
        r"requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2",
        refused[0].message,
    )
    time.sleep(0.3)  # the controller keeps retrying, and keeps being refused
    assert [p.spec.node_name for p in job_pods(k8s, ns, "q")] == ["gpu-1", "gpu-1"]
    quota = k8s.core.read_namespaced_resource_quota("gpu-quota", ns)
    assert quota.status.used == {"requests.nvidia.com/gpu": "2"}
    # the admission check answers a direct create the same way
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespaced_pod(ns, pod_body("direct", "true", limits={"nvidia.com/gpu": "2"}))
    body = status_of(caught.value)
    assert (caught.value.status, body["reason"], body["details"]) == (
        403,
        "Forbidden",
        {"name": "direct", "kind": "pods"},
    )
    assert body["message"] == (
        'pods "direct" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, '
        "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
    )
    (tmp_path / f"{first_two[0]}.go").touch()
    third = wait_for(lambda: set(running()) - set(first_two), what="third pod running")
    for name in [first_two[1], *third]:
        (tmp_path / f"{name}.go").touch()
    assert wait_for(lambda: job_condition(k8s, ns, "q")).type == "Complete"
    assert k8s.batch.read_namespaced_job("q", ns).status.succeeded == 3


def test_quota_counts_extended_resources_by_their_requests_only(k8s, ns):
    """A MIG instance (the device plugin's mixed strategy) or a HAMi slice's memory counts against
    requests.<name> alone, as the quota evaluator counts every extended resource: limits.<name> and the
    bare name bound nothing. Pods that wait for a node count too."""
    mig = "nvidia.com/mig-3g.71gb"
    hard = {f"requests.{mig}": "1", f"limits.{mig}": "0", mig: "0", "requests.nvidia.com/gpumem": "30000"}
    k8s.core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "gpu-portal"}, "spec": {"hard": hard}}
    )
    k8s.core.create_namespaced_pod(ns, pod_body("first", "true", limits={mig: "1"}))  # no MIG node: it waits
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespaced_pod(ns, pod_body("second", "true", limits={mig: "1"}))
    body = status_of(caught.value)
    assert (caught.value.status, body["reason"], body["details"]) == (
        403,
        "Forbidden",
        {"name": "second", "kind": "pods"},
    )
    assert body["message"] == (
        'pods "second" is forbidden: exceeded quota: gpu-portal, requested: requests.nvidia.com/mig-3g.71gb=1, '
        "used: requests.nvidia.com/mig-3g.71gb=1, limited: requests.nvidia.com/mig-3g.71gb=1"
    )
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"}
    k8s.core.create_namespaced_pod(ns, pod_body("slice", "true", limits=hami))
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespaced_pod(ns, pod_body("slice-2", "true", limits=hami))
    assert caught.value.status == 403 and status_of(caught.value)["message"].endswith(
        "requested: requests.nvidia.com/gpumem=20000, used: requests.nvidia.com/gpumem=20000, "
        "limited: requests.nvidia.com/gpumem=30000"
    )
    used = {f"requests.{mig}": "1", f"limits.{mig}": "0", mig: "0", "requests.nvidia.com/gpumem": "20000"}
    wait_for(lambda: k8s.core.read_namespaced_resource_quota("gpu-portal", ns).status.used == used)


def test_extended_resources_are_whole_with_requests_equal_to_limits(api, k8s, ns):
    """The API server's validation of extended resources, before any quota: integers, a limit always, a
    request equal to it (a limit alone is copied to the request). Nothing invalid is stored."""

    def pod(name: str, **resources) -> dict:
        body = pod_body(name, "true")
        body["spec"]["containers"][0]["resources"] = resources
        return body

    refused = [
        (
            pod("fraction", limits={"nvidia.com/gpu": "500m"}),
            'Pod "fraction" is invalid: [spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: '
            '"500m": must be an integer, spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: '
            '"500m": must be an integer]',
        ),
        (
            pod("unequal", requests={"nvidia.com/mig-1g.18gb": "2"}, limits={"nvidia.com/mig-1g.18gb": "1"}),
            'Pod "unequal" is invalid: spec.containers[0].resources.requests[nvidia.com/mig-1g.18gb]: '
            'Invalid value: "2": must be equal to nvidia.com/mig-1g.18gb limit of 1',
        ),
        (
            pod("no-limit", requests={"hygon.com/dcumem": "2000", "cpu": "1"}, limits={"cpu": "2"}),
            'Pod "no-limit" is invalid: spec.containers[0].resources.limits[hygon.com/dcumem]: Required value: '
            "Limit must be set for non overcommitable resources",
        ),
    ]
    for body, message in refused:
        with pytest.raises(client.ApiException) as caught:
            k8s.core.create_namespaced_pod(ns, body)
        status = status_of(caught.value)
        assert (caught.value.status, status["reason"], status["message"]) == (422, "Invalid", message)
    job = job_body("j", "true", resources={"requests": {"cambricon.com/vmlu": "1"}})
    with pytest.raises(client.ApiException) as caught:
        k8s.batch.create_namespaced_job(ns, job)
    assert status_of(caught.value)["message"] == (
        'Job.batch "j" is invalid: spec.template.spec.containers[0].resources.limits[cambricon.com/vmlu]: '
        "Required value: Limit must be set for non overcommitable resources"
    )
    assert status_of(caught.value)["details"]["causes"] == [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: Limit must be set for non overcommitable resources",
            "field": "spec.template.spec.containers[0].resources.limits[cambricon.com/vmlu]",
        }
    ]
    assert api.objects("Pod") == [] and api.objects("Job") == []
    same = {"nvidia.com/mig-1g.18gb": "1", "cpu": "500m"}  # native resources may be fractions
    k8s.core.create_namespaced_pod(ns, pod("fine", requests=same, limits=same | {"cpu": "1"}))


def test_indexed_job_gets_completion_indexes_and_hostnames(k8s, ns):
    body = job_body(
        "idx",
        'echo "index=$JOB_COMPLETION_INDEX host=$HOSTNAME"',
        completions=2,
        parallelism=2,
        completion_mode="Indexed",
    )
    body["spec"]["template"]["spec"]["subdomain"] = "workers"
    k8s.batch.create_namespaced_job(ns, body)
    assert wait_for(lambda: job_condition(k8s, ns, "idx")).type == "Complete"
    pods = sorted(
        job_pods(k8s, ns, "idx"),
        key=lambda p: p.metadata.annotations["batch.kubernetes.io/job-completion-index"],
    )
    logs = [k8s.core.read_namespaced_pod_log(p.metadata.name, ns) for p in pods]
    assert logs == ["index=0 host=idx-0\n", "index=1 host=idx-1\n"]
    assert [(p.spec.hostname, p.spec.subdomain) for p in pods] == [("idx-0", "workers"), ("idx-1", "workers")]
    assert [p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0", "1"]
    assert re.fullmatch(r"idx-0-[a-z0-9]{5}", pods[0].metadata.name)
    assert k8s.batch.read_namespaced_job("idx", ns).status.completed_indexes == "0,1"


def test_delete_propagation_foreground_background_and_the_orphan_default(api, k8s, ns):
    for name in ("fg", "bg", "orphan"):
        k8s.batch.create_namespaced_job(ns, job_body(name, "sleep 60 & echo $!; wait"))
    pids = {}
    for name in ("fg", "bg", "orphan"):
        pod = wait_for(lambda n=name: [p for p in job_pods(k8s, ns, n) if p.status.phase == "Running"])[0]
        pids[name] = int(
            wait_for(lambda p=pod: k8s.core.read_namespaced_pod_log(p.metadata.name, ns).strip())
        )

    options = client.V1DeleteOptions(propagation_policy="Foreground")  # in the body
    deleting = k8s.batch.delete_namespaced_job("fg", ns, body=options)
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["finalizers"] == [
        "foregroundDeletion"
    ]  # the Job stays until its pods are gone
    wait_for(lambda: not alive(pids["fg"]), what="fg pod's process killed")
    wait_for(lambda: not [j for j in api.objects("Job") if j["metadata"]["name"] == "fg"], what="fg job gone")
    assert job_pods(k8s, ns, "fg") == []

    gone = k8s.batch.delete_namespaced_job("bg", ns, propagation_policy="Background")  # as a query parameter
    assert gone["status"] == "Success" and gone["details"]["name"] == "bg"
    wait_for(lambda: not alive(pids["bg"]) and job_pods(k8s, ns, "bg") == [], what="bg pod deleted")

    _, _, headers = k8s.batch.delete_namespaced_job_with_http_info("orphan", ns)  # batch/v1 default: Orphan
    assert "child pods are preserved by default" in headers["Warning"]
    time.sleep(0.2)
    [kept] = job_pods(k8s, ns, "orphan")
    assert kept.status.phase == "Running" and not kept.metadata.owner_references and alive(pids["orphan"])
    deleted = k8s.core.delete_namespaced_pod(kept.metadata.name, ns, grace_period_seconds=0)
    assert deleted.metadata.deletion_timestamp
    wait_for(lambda: job_pods(k8s, ns, "orphan") == [] and not alive(pids["orphan"]), what="orphan deleted")


def test_ttl_after_finished_deletes_the_job_and_its_pods(k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("ttl", "true", ttl_seconds_after_finished=1))
    assert wait_for(lambda: job_condition(k8s, ns, "ttl")).type == "Complete"
    assert len(job_pods(k8s, ns, "ttl")) == 1
    wait_for(
        lambda: not k8s.batch.list_namespaced_job(ns, field_selector="metadata.name=ttl").items, what="ttl"
    )
    wait_for(lambda: job_pods(k8s, ns, "ttl") == [], what="pods gone")


def test_delete_precondition_uid_and_backdate(api, k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("done", "true", ttl_seconds_after_finished=3600))
    assert wait_for(lambda: job_condition(k8s, ns, "done")).type == "Complete"
    job = k8s.batch.read_namespaced_job("done", ns)
    wrong = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="0000"))
    with pytest.raises(client.ApiException) as refused:
        k8s.batch.delete_namespaced_job("done", ns, body=wrong)
    assert refused.value.status == 409 and "Precondition failed" in status_of(refused.value)["message"]

    api.backdate("Job", ns, "done", 7200)  # ended two hours ago: past its TTL of one hour
    moved = k8s.batch.read_namespaced_job("done", ns).status
    assert (job.status.completion_time - moved.completion_time).total_seconds() == 7200
    assert (job.status.start_time - moved.start_time).total_seconds() == 7200
    wait_for(lambda: not api.objects("Job") and job_pods(k8s, ns, "done") == [], what="the TTL to fire")


def test_scheduling_by_selector_taints_and_room_and_oom_mapping(k8s, ns):
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    unschedulable = {
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.": pod_body(
            "nowhere", "true", nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"}
        ),
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}.": pod_body(
            "untolerated", "true", nodeSelector=h100
        ),
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.": pod_body(
            "huge", "true", limits={"nvidia.com/gpu": "16"}, tolerations=[GPU_TOLERATION]
        ),
    }
    for body in unschedulable.values():
        k8s.core.create_namespaced_pod(ns, body)
    oom = {"test.gpu-portal/oom": "true"}
    k8s.core.create_namespaced_pod(
        ns,
        pod_body(
            "oom", "kill -KILL $BASHPID", annotations=oom, nodeSelector=h100, tolerations=[GPU_TOLERATION]
        ),
    )
    k8s.core.create_namespaced_pod(ns, pod_body("killed", "kill -KILL $BASHPID"))
    for message, body in unschedulable.items():
        name = body["metadata"]["name"]
        [scheduled] = wait_for(lambda n=name: k8s.core.read_namespaced_pod(n, ns).status.conditions)
        assert (scheduled.type, scheduled.status, scheduled.reason) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert scheduled.message == message
        assert k8s.core.read_namespaced_pod(name, ns).status.phase == "Pending"
        events = k8s.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        assert [(e.reason, e.message) for e in events] == [("FailedScheduling", message)]
    for name, reason, node in (("oom", "OOMKilled", "gpu-1"), ("killed", "Error", "cpu-1")):
        done = wait_for(
            lambda n=name: [p for p in [k8s.core.read_namespaced_pod(n, ns)] if p.status.phase == "Failed"]
        )
        terminated = done[0].status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason, done[0].spec.node_name) == (137, reason, node)


def test_stop_ends_every_thread_and_process():
    baseline = threading.active_count()
    with FakeApiServer(token=TOKEN) as api:
        config = client.Configuration(host=api.url, api_key={"authorization": f"Bearer {TOKEN}"})
        with client.ApiClient(config) as api_client:
            k8s = SimpleNamespace(core=client.CoreV1Api(api_client), batch=client.BatchV1Api(api_client))
            k8s.batch.create_namespaced_job("default", job_body("long", "sleep 60 & echo $!; wait"))
            pod = wait_for(
                lambda: [p for p in job_pods(k8s, "default", "long") if p.status.phase == "Running"]
            )[0]
            pid = int(
                wait_for(lambda: k8s.core.read_namespaced_pod_log(pod.metadata.name, "default").strip())
            )
    wait_for(lambda: not alive(pid), timeout_s=2, what="process killed on stop")
    assert threading.active_count() == baseline
